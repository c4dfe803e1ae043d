//! \file bench_util.hpp
//! What the GPU benchmark programs share (bench_gpu.cpp, conv/bench_conv_gpu.cpp, ab/*.cu): the
//! error check, an owning device buffer, uploads, the median-of-launches timer with its lead spin,
//! and the CUDA-graph timer of the A/B benches.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <greenmim/kernels.h>

extern "C" cudaError_t bench_fill_random(void* p, std::size_t n, int dtype, std::uint64_t seed, float scale,
                                         cudaStream_t stream);
extern "C" cudaError_t bench_spin_ns(unsigned long long ns, cudaStream_t stream);

namespace gm_bench {

#define BENCH_CHECK(expr)                                                                          \
  do {                                                                                             \
    const cudaError_t e_ = (expr);                                                                 \
    if (e_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "CUDA error at %s:%d: %s -> %s (%s)\n", __FILE__, __LINE__, #expr,      \
                   cudaGetErrorString(e_), gm_last_refusal());                                     \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

struct dmem {
  void* p = nullptr;
  std::size_t bytes = 0;
  explicit dmem(std::size_t n = 0) : bytes(n) {
    if (n) BENCH_CHECK(cudaMalloc(&p, n));
  }
  dmem(const dmem&) = delete;
  dmem& operator=(const dmem&) = delete;
  dmem(dmem&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr; }
  ~dmem() {
    if (p) cudaFree(p);
  }
  template <class T>
  T* as() const { return static_cast<T*>(p); }
};

//! `n` random normal values of dtype `dt` on the device (bench_fill_random, seeded).
inline dmem random_buffer(std::size_t n, gm_dtype dt, std::uint64_t seed) {
  dmem d(n * gm_dtype_size(dt));
  if (n) BENCH_CHECK(bench_fill_random(d.p, n, static_cast<int>(dt), seed, 1.0f, nullptr));
  return d;
}

//! A dense [b, n, c] view of `p` (element strides).
inline gm_tensor tensor3(void* p, std::int64_t b, std::int64_t n, std::int64_t c) {
  gm_tensor t{};
  t.data = p;
  t.rank = 3;
  t.extent[0] = b; t.extent[1] = n; t.extent[2] = c;
  t.stride[0] = n * c; t.stride[1] = c; t.stride[2] = 1;
  return t;
}

template <class T>
dmem upload(const std::vector<T>& v) {
  dmem d(v.size() * sizeof(T));
  if (!v.empty()) BENCH_CHECK(cudaMemcpy(d.p, v.data(), d.bytes, cudaMemcpyHostToDevice));
  return d;
}

//! Median milliseconds of f(rep) over `reps` launches after `warmup`, one event pair per launch.
//! Each timed launch is queued behind a 50 us spin of one GPU thread (no memory traffic, caches
//! left as they are), so the GPU is busy while the host records the start event and launches:
//! the host's launch latency is not timed, as in a training step whose host runs ahead of the
//! GPU. (Timed from an idle GPU it was: the H100 run of f7bb4ac measured copy_rows at 23.9 us here
//! and 16.4 us under ncu, the MMA forward at 86.2 us and 79.6 us.)
template <class F>
double median_ms(F&& f, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) f(i);
  BENCH_CHECK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  BENCH_CHECK(cudaEventCreate(&a));
  BENCH_CHECK(cudaEventCreate(&b));
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    BENCH_CHECK(bench_spin_ns(50000, nullptr));  // busy GPU while the host enqueues the timed launch
    BENCH_CHECK(cudaEventRecord(a));
    f(warmup + i);
    BENCH_CHECK(cudaEventRecord(b));
    BENCH_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    BENCH_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  BENCH_CHECK(cudaEventDestroy(a));
  BENCH_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

//! Median microseconds per launch of body(stream), captured `launches` times into one CUDA graph
//! and replayed `replays` times after 3 warm-up replays: for kernels of a few microseconds, whose
//! launch gaps a graph removes (the A/B benches of bench/gpu/ab/ and the device runs they compare
//! with time this way).
template <class F>
float graph_median_us(F&& body, int launches = 20, int replays = 15) {
  cudaStream_t s;
  BENCH_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  BENCH_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < launches; ++i) body(s);
  BENCH_CHECK(cudaStreamEndCapture(s, &g));
  BENCH_CHECK(cudaGraphInstantiate(&ge, g, 0));
  for (int i = 0; i < 3; ++i) BENCH_CHECK(cudaGraphLaunch(ge, s));
  cudaEvent_t a, b;
  BENCH_CHECK(cudaEventCreate(&a));
  BENCH_CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < replays; ++r) {
    BENCH_CHECK(cudaEventRecord(a, s));
    BENCH_CHECK(cudaGraphLaunch(ge, s));
    BENCH_CHECK(cudaEventRecord(b, s));
    BENCH_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    BENCH_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.f / static_cast<float>(launches));
  }
  std::sort(t.begin(), t.end());
  BENCH_CHECK(cudaEventDestroy(a));
  BENCH_CHECK(cudaEventDestroy(b));
  BENCH_CHECK(cudaGraphExecDestroy(ge));
  BENCH_CHECK(cudaGraphDestroy(g));
  BENCH_CHECK(cudaStreamDestroy(s));
  return t[t.size() / 2];
}

}  // namespace gm_bench
