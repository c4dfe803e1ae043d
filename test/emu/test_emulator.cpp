//! \file test_emulator.cpp
//! The emulator's own tests: that it runs kernels with CUDA's semantics (barriers, shuffles,
//! votes, reductions, ldmatrix / mma.sync against a plain matrix product), and that it reports
//! what it promises to catch (divergent barriers and collectives, deadlock, shared-memory limits,
//! launch configuration) instead of hanging or passing silently. Tests here do not use
//! greenmim's kernels; test_kernels_emu.cpp does.
#include <doctest/doctest.h>

#include "cuda_emu.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace {

// ---- tiny kernels ------------------------------------------------------------------------------------
__global__ void k_block_reverse(const int* in, int* out) {
  __shared__ int s[256];
  s[threadIdx.x] = in[blockIdx.x * blockDim.x + threadIdx.x];
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];
}

// Reads a neighbour's shared value WITHOUT a barrier: a data race, whose result depends on the order.
__global__ void k_racy(int* out) {
  __shared__ int s[64];
  s[threadIdx.x] = static_cast<int>(threadIdx.x) + 1;
  out[threadIdx.x] = s[(threadIdx.x + 1) % 64];
}

__global__ void k_warp_ops(const float* in, float* xor_out, int* votes, int* red) {
  const int t = threadIdx.x;
  float v = in[t];
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  xor_out[t] = v;
  votes[3 * t] = __any_sync(0xffffffffu, in[t] > 100.f);
  votes[3 * t + 1] = __all_sync(0xffffffffu, in[t] >= 0.f);
  votes[3 * t + 2] = static_cast<int>(__ballot_sync(0xffffffffu, t % 3 == 0));
  red[2 * t] = __reduce_min_sync(0xffffffffu, 1000 - t);
  red[2 * t + 1] = __reduce_max_sync(0xffffffffu, (t * 7) % 32);
  const int ok = __syncthreads_and(in[t] >= 0.f);
  const int any = __syncthreads_or(t == 37);
  const int cnt = __syncthreads_count(t % 2);
  if (t == 0) red[2 * blockDim.x] = ok * 10000 + any * 1000 + cnt;
}

// cp.async: each thread copies 16 bytes (4 ints) of `in` to shared memory in two groups, and
// records what it sees of its own slots before any wait, after wait_group 1 (the first group
// retired), and after wait_group 0.
__global__ void k_cp_async(const int* in, int* out) {
  alignas(16) __shared__ int s[2][64 * 4];
  const int t = threadIdx.x;
  s[0][4 * t] = -1;
  s[1][4 * t] = -1;
  gm_emu::cp_async16(&s[0][4 * t], in + 4 * t);
  gm_emu::cp_async_commit();
  gm_emu::cp_async16(&s[1][4 * t], in + 256 + 4 * t);
  gm_emu::cp_async_commit();
  out[6 * t] = s[0][4 * t];
  out[6 * t + 1] = s[1][4 * t];
  gm_emu::cp_async_wait(1);
  out[6 * t + 2] = s[0][4 * t];
  out[6 * t + 3] = s[1][4 * t];
  gm_emu::cp_async_wait(0);
  out[6 * t + 4] = s[0][4 * t];
  out[6 * t + 5] = s[1][4 * t + 3];
}

__global__ void k_divergent_syncthreads(int* out) {
  if (threadIdx.x < 32) __syncthreads();
  out[threadIdx.x] = 1;
}
__global__ void k_divergent_shfl(int* out) {
  int v = 1;
  if (threadIdx.x % 2 == 0) v = __shfl_xor_sync(0xffffffffu, v, 1);
  else __syncwarp();
  out[threadIdx.x] = v;
}
__global__ void k_exit_then_sync(int* out) {
  if (threadIdx.x >= 64) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}
__global__ void k_big_smem(int* out) {
  out[0] = gm_emu::dynamic_smem<int>()[0];
}

__global__ void k_read_past(const float* in, float* out, int n) {
  out[threadIdx.x] = in[n + 64 + threadIdx.x];  // 256 bytes past the buffer: beyond any alignment slack
}
__global__ void k_smem_past(float* out) {
  float* s = gm_emu::dynamic_smem<float>();
  out[threadIdx.x] = s[1024 + 16 + threadIdx.x];  // 64 bytes past 4 KB of dynamic shared memory
}

__global__ void k_misaligned(const float* in, float* out) {
  const float4 v = *reinterpret_cast<const float4*>(in + 1);  // 4-byte aligned only: a device fault
  out[threadIdx.x] = v.x;
}

//! Runs `body` in a child process; returns (exit status, what it wrote to stderr).
template <class F>
std::pair<int, std::string> in_child(F body) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 2);
    body();
    _exit(0);
  }
  close(fds[1]);
  std::string err;
  char buf[512];
  ssize_t got;
  while ((got = read(fds[0], buf, sizeof buf)) > 0) err.append(buf, static_cast<std::size_t>(got));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, err};
}

// One warp: C[16x8] = A[16x16] B[16x8] through ldmatrix (A row-major, B given as its transpose
// Bt[8][16] in rows: ldmatrix non-trans; and B as [16][8] rows: ldmatrix .trans).
template <class T>
__global__ void k_mma(const T* a, const T* bt, const T* b, float* c_nt, float* c_t) {
  T* sa = gm_emu::dynamic_smem<T>();    // 16 x 16
  T* sbt = sa + 256;                    // 8 x 16 (two 8x8 matrices side by side)
  T* sb = sbt + 128;                    // 16 x 8
  const int l = threadIdx.x;
  for (int i = l; i < 256; i += 32) sa[i] = a[i];
  for (int i = l; i < 128; i += 32) sbt[i] = bt[i], sb[i] = b[i];
  __syncwarp();
  unsigned fa[4];
  // matrices: (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15)
  gm_emu::ldmatrix_x4(fa, sa + ((l & 7) + ((l >> 3) & 1) * 8) * 16 + (l >> 4) * 8, false);
  unsigned fb[4];
  // b0: Bt rows n=0..7, k 0-7 ; b1: k 8-15 (matrices 2, 3 repeat them)
  gm_emu::ldmatrix_x4(fb, sbt + (l & 7) * 16 + ((l >> 3) & 1) * 8, false);
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  gm_emu::mma_m16n8k16<T>(d, fa, fb[0], fb[1]);
  const int g = l >> 2, t = l & 3;
  for (int e = 0; e < 4; ++e) c_nt[(g + (e >= 2 ? 8 : 0)) * 8 + 2 * t + (e & 1)] = d[e];
  // .trans from B [16][8]: matrix 0 = k 0-7, matrix 1 = k 8-15
  unsigned fbt[4];
  gm_emu::ldmatrix_x4(fbt, sb + (l & 15) * 8, true);
  float d2[4] = {0.f, 0.f, 0.f, 0.f};
  gm_emu::mma_m16n8k16<T>(d2, fa, fbt[0], fbt[1]);
  for (int e = 0; e < 4; ++e) c_t[(g + (e >= 2 ? 8 : 0)) * 8 + 2 * t + (e & 1)] = d2[e];
}

template <class T>
struct dev {
  T* p = nullptr;
  std::size_t n = 0;
  explicit dev(std::size_t count) : n(count) { REQUIRE(cudaMalloc(reinterpret_cast<void**>(&p), count * sizeof(T)) == cudaSuccess); }
  explicit dev(const std::vector<T>& h) : dev(h.size()) { REQUIRE(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess); }
  ~dev() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    REQUIRE(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  }
};

// A fault is sticky, like a device fault: read it, then clear it for the next test.
std::string expect_fault() {
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  const std::string why = gm_emu::last_fault();
  gm_emu::clear_fault();
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  return why;
}

}  // namespace

TEST_CASE("emulator: __syncthreads orders shared memory; every schedule gives the same result") {
  std::vector<int> in(3 * 256);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int>(i * 7 + 3);
  dev<int> din(in), dout(in.size());
  for (auto s : {gm_emu::schedule::forward, gm_emu::schedule::reverse, gm_emu::schedule::random,
                 gm_emu::schedule::greedy}) {
    gm_emu::set_schedule(s, 5);
    REQUIRE(gm_emu::launch(k_block_reverse, dim3(3), dim3(256), 0, nullptr, static_cast<const int*>(din.p), dout.p) == cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    const std::vector<int> out = dout.get();
    for (int b = 0; b < 3; ++b)
      for (int t = 0; t < 256; ++t) CHECK(out[static_cast<std::size_t>(b * 256 + t)] == in[static_cast<std::size_t>(b * 256 + 255 - t)]);
  }
  gm_emu::set_schedule(gm_emu::schedule::forward);
}

TEST_CASE("emulator: a race between barriers shows up as schedule dependence") {
  dev<int> d(64);
  std::vector<std::vector<int>> outs;
  for (auto s : {gm_emu::schedule::forward, gm_emu::schedule::reverse}) {
    gm_emu::set_schedule(s);
    REQUIRE(gm_emu::launch(k_racy, dim3(1), dim3(64), 0, nullptr, d.p) == cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    outs.push_back(d.get());
  }
  gm_emu::set_schedule(gm_emu::schedule::forward);
  CHECK(outs[0] != outs[1]);
}

TEST_CASE("emulator: cp.async writes shared memory only when wait_group retires its group") {
  std::vector<int> in(512);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int>(i) + 1000;
  dev<int> din(in), dout(6 * 64);
  REQUIRE(gm_emu::launch(k_cp_async, dim3(1), dim3(64), 0, nullptr, static_cast<const int*>(din.p), dout.p) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const std::vector<int> out = dout.get();
  for (int t = 0; t < 64; ++t) {
    INFO("thread " << t);
    const int* o = &out[static_cast<std::size_t>(6 * t)];
    CHECK(o[0] == -1);  // not yet written
    CHECK(o[1] == -1);
    CHECK(o[2] == in[static_cast<std::size_t>(4 * t)]);  // wait_group 1: the older group only
    CHECK(o[3] == -1);
    CHECK(o[4] == in[static_cast<std::size_t>(4 * t)]);
    CHECK(o[5] == in[static_cast<std::size_t>(256 + 4 * t + 3)]);
  }
}

TEST_CASE("emulator: shuffles, votes, warp reductions and barrier reductions") {
  std::mt19937 rng(3);
  std::vector<float> in(128);
  for (auto& x : in) x = static_cast<float>(rng() % 50);
  in[77] = 150.f;  // warp 2 votes "any > 100"
  dev<float> din(in), dx(128);
  dev<int> dv(3 * 128), dr(2 * 128 + 1);
  REQUIRE(gm_emu::launch(k_warp_ops, dim3(1), dim3(128), 0, nullptr, static_cast<const float*>(din.p), dx.p, dv.p, dr.p) ==
          cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const auto x = dx.get();
  const auto v = dv.get();
  const auto r = dr.get();
  for (int t = 0; t < 128; ++t) {
    float sum = 0.f;
    for (int i = 0; i < 32; ++i) sum += in[static_cast<std::size_t>((t / 32) * 32 + i)];
    CHECK(x[static_cast<std::size_t>(t)] == sum);  // integers: exact in any order
    CHECK(v[static_cast<std::size_t>(3 * t)] == (t / 32 == 2));
    CHECK(v[static_cast<std::size_t>(3 * t + 1)] == 1);
    unsigned ballot = 0;
    for (int i = 0; i < 32; ++i)
      if (((t / 32) * 32 + i) % 3 == 0) ballot |= 1u << i;
    CHECK(static_cast<unsigned>(v[static_cast<std::size_t>(3 * t + 2)]) == ballot);
    CHECK(r[static_cast<std::size_t>(2 * t)] == 1000 - ((t / 32) * 32 + 31));
    CHECK(r[static_cast<std::size_t>(2 * t + 1)] == 31);
  }
  CHECK(r[256] == 1 * 10000 + 1 * 1000 + 64);
}

TEST_CASE("emulator: divergent barriers and collectives are reported, not hung") {
  dev<int> d(256);
  REQUIRE(gm_emu::launch(k_divergent_syncthreads, dim3(1), dim3(64), 0, nullptr, d.p) == cudaSuccess);
  CHECK(expect_fault().find("__syncthreads") != std::string::npos);
  REQUIRE(gm_emu::launch(k_divergent_shfl, dim3(1), dim3(32), 0, nullptr, d.p) == cudaSuccess);
  CHECK(expect_fault().find("different collectives") != std::string::npos);
  REQUIRE(gm_emu::launch(k_exit_then_sync, dim3(1), dim3(128), 0, nullptr, d.p) == cudaSuccess);
  CHECK(expect_fault().find("exited") != std::string::npos);
  // after a fault, later launches fail until it is cleared (sticky, like the device)
  REQUIRE(gm_emu::launch(k_divergent_syncthreads, dim3(1), dim3(64), 0, nullptr, d.p) == cudaSuccess);
  CHECK(gm_emu::launch(k_block_reverse, dim3(1), dim3(256), 0, nullptr, static_cast<const int*>(d.p), d.p) ==
        cudaErrorLaunchFailure);
  CHECK(!expect_fault().empty());
}

TEST_CASE("emulator: launch configuration and shared-memory limits of sm_90") {
  dev<int> d(4);
  CHECK(gm_emu::launch(k_big_smem, dim3(1), dim3(2048), 0, nullptr, d.p) == cudaErrorInvalidConfiguration);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  CHECK(cudaGetLastError() == cudaSuccess);  // not sticky
  CHECK(gm_emu::launch(k_big_smem, dim3(1, 70000), dim3(32), 0, nullptr, d.p) == cudaErrorInvalidConfiguration);
  CHECK(gm_emu::launch(k_big_smem, dim3(1), dim3(32), 64 * 1024, nullptr, d.p) == cudaErrorInvalidValue);
  (void)cudaGetLastError();
  REQUIRE(cudaFuncSetAttribute(k_big_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024) == cudaSuccess);
  CHECK(gm_emu::launch(k_big_smem, dim3(1), dim3(32), 64 * 1024, nullptr, d.p) == cudaSuccess);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(d.get()[0] == -1);  // shared memory starts as 0xFF bytes: never-written reads are visible
  CHECK(cudaFuncSetAttribute(k_big_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, 300 * 1024) == cudaErrorInvalidValue);
  (void)cudaGetLastError();
}

// Two input sets: small integers (every product and sum exact in fp32), and random bit patterns
// over every finite value (subnormals, both zeros, the largest), where the sum of the exact
// products is rounded once, as the emulator documents (cuda_emu_mma.cpp), in k order in double.
TEST_CASE_TEMPLATE("emulator: ldmatrix (plain and .trans) + mma.sync m16n8k16 equal a matrix product", T, __half,
                   __nv_bfloat16) {
  constexpr bool is_half = std::is_same<T, __half>::value;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> small(-8, 8);
  std::uniform_int_distribution<unsigned> bits(0, 0xffffu);
  auto to_t = [](float f) {
    if constexpr (is_half) return __float2half_rn(f);
    else return __float2bfloat16_rn(f);
  };
  auto to_f = [](T x) {
    if constexpr (is_half) return __half2float(x);
    else return __bfloat162float(x);
  };
  auto random_finite = [&] {
    for (;;) {
      const auto u = static_cast<std::uint16_t>(bits(rng));
      T x;
      std::memcpy(static_cast<void*>(&x), &u, 2);
      if (std::isfinite(to_f(x))) return x;
    }
  };
  for (const bool random_bits : {false, true}) {
    CAPTURE(random_bits);
    std::vector<T> a(256), b(128), bt(128);
    for (auto& x : a) x = random_bits ? random_finite() : to_t(static_cast<float>(small(rng)));
    for (int k = 0; k < 16; ++k)
      for (int n = 0; n < 8; ++n) {
        const T x = random_bits ? random_finite() : to_t(static_cast<float>(small(rng)));
        b[static_cast<std::size_t>(k * 8 + n)] = x;
        bt[static_cast<std::size_t>(n * 16 + k)] = x;
      }
    dev<T> da(a), dbt(bt), db(b);
    dev<float> c1(128), c2(128);
    REQUIRE(gm_emu::launch(k_mma<T>, dim3(1), dim3(32), 512 * sizeof(T), nullptr, static_cast<const T*>(da.p),
                           static_cast<const T*>(dbt.p), static_cast<const T*>(db.p), c1.p, c2.p) == cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    const auto r1 = c1.get(), r2 = c2.get();
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 8; ++n) {
        double s = 0.0;
        for (int k = 0; k < 16; ++k)
          s += static_cast<double>(to_f(a[static_cast<std::size_t>(m * 16 + k)])) *
               static_cast<double>(to_f(b[static_cast<std::size_t>(k * 8 + n)]));
        const float want = static_cast<float>(s);
        CAPTURE(m);
        CAPTURE(n);
        CHECK(std::memcmp(&r1[static_cast<std::size_t>(m * 8 + n)], &want, 4) == 0);
        CHECK(std::memcmp(&r2[static_cast<std::size_t>(m * 8 + n)], &want, 4) == 0);
      }
  }
}

TEST_CASE("emulator: out-of-bounds global and shared accesses stop the program with a message") {
  const auto global = in_child([] {
    float *in = nullptr, *out = nullptr;
    if (cudaMalloc(reinterpret_cast<void**>(&in), 1000 * sizeof(float)) != cudaSuccess) _exit(1);
    if (cudaMalloc(reinterpret_cast<void**>(&out), 32 * sizeof(float)) != cudaSuccess) _exit(1);
    (void)gm_emu::launch(k_read_past, dim3(1), dim3(32), 0, nullptr, static_cast<const float*>(in), out, 1000);
  });
  CHECK(global.first == 86);
  CHECK(global.second.find("past the end of a cudaMalloc buffer of 4000 bytes") != std::string::npos);
  const auto shared = in_child([] {
    float* out = nullptr;
    if (cudaMalloc(reinterpret_cast<void**>(&out), 32 * sizeof(float)) != cudaSuccess) _exit(1);
    (void)gm_emu::launch(k_smem_past, dim3(1), dim3(32), 4096, nullptr, out);
  });
  CHECK(shared.first == 86);
  CHECK(shared.second.find("dynamic shared memory") != std::string::npos);
  // in range: no fault
  const auto fine = in_child([] {
    float *in = nullptr, *out = nullptr;
    if (cudaMalloc(reinterpret_cast<void**>(&in), 2048 * sizeof(float)) != cudaSuccess) _exit(1);
    if (cudaMalloc(reinterpret_cast<void**>(&out), 32 * sizeof(float)) != cudaSuccess) _exit(1);
    (void)gm_emu::launch(k_read_past, dim3(1), dim3(32), 0, nullptr, static_cast<const float*>(in), out, 0);
    if (cudaDeviceSynchronize() != cudaSuccess) _exit(2);
  });
  CHECK(fine.first == 0);
}

#if defined(GREENMIM_EMU_UBSAN)
TEST_CASE("emulator: a misaligned vector access stops the program (UBSan), as it faults on a device") {
  const auto r = in_child([] {
    float *in = nullptr, *out = nullptr;
    if (cudaMalloc(reinterpret_cast<void**>(&in), 64 * sizeof(float)) != cudaSuccess) _exit(1);
    if (cudaMalloc(reinterpret_cast<void**>(&out), 32 * sizeof(float)) != cudaSuccess) _exit(1);
    (void)gm_emu::launch(k_misaligned, dim3(1), dim3(32), 0, nullptr, static_cast<const float*>(in), out);
  });
  CHECK(r.first != 0);
  CHECK(r.second.find("misaligned") != std::string::npos);
}
#endif
