// Throwaway micro-bench (tenth session): candidate PEG kernels against the production ones
// (kernels/depthwise_conv.cu, measured in call 1 of docs/perf/NVIDIA_H100_80GB_HBM3_2026-11-27/).
// - "st32" / "st16": forward and dx with the CTA's tile of TT consecutive tokens (block-major: an
//   8 x 8 unit at stage 1) staged in shared memory, as fp32 (each row converted once) or as raw
//   bf16; taps inside the tile read shared memory, taps outside read global memory. Same sums in
//   the same order as production: bits must be equal.
// - "dw4": the dweight partial kernel with 4 channels a thread (8-byte rows, 40 accumulators,
//   2 CTAs per SM), the same cut and the same token rows per block: bits must be equal.
// - "dw4x2": dw4 with twice the pieces (the cut as for C / 2): the sums' order differs, so its
//   partials are compared after the reduce, by the largest relative difference.
// Timing as peg_ab: CUDA graphs of 20 launches, 15 replays, median; each pair timed a, b, b, a.
// Build: nvcc -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -arch=sm_90 -Iinclude -Ikernels/include
//   -Ikernels .devcall/peg_var.cu kernels/common.cu -o /tmp/peg_var
#include "depthwise_conv.cu"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <greenmim/twins_plan.hpp>

namespace greenmim { namespace detail { namespace cuda { namespace {

template <class S> struct stage_io;
template <> struct stage_io<float> {  // [row][half][group][4] floats: conflict-free 16-byte reads
  static constexpr int bytes = 4;
  __device__ __forceinline__ static void put(float* tile, int row, int cw, int gl, const float (&x)[8]) {
    float* q = tile + static_cast<std::int64_t>(row) * cw;
    *reinterpret_cast<float4*>(q + gl * 4) = make_float4(x[0], x[1], x[2], x[3]);
    *reinterpret_cast<float4*>(q + cw / 2 + gl * 4) = make_float4(x[4], x[5], x[6], x[7]);
  }
  __device__ __forceinline__ static void get(const float* tile, int row, int cw, int gl, float (&x)[8]) {
    const float* q = tile + static_cast<std::int64_t>(row) * cw;
    const float4 a = *reinterpret_cast<const float4*>(q + gl * 4), b = *reinterpret_cast<const float4*>(q + cw / 2 + gl * 4);
    x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w; x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
  }
};
struct raw16 {};
template <> struct stage_io<raw16> {  // raw bf16 rows, widened at each use
  static constexpr int bytes = 2;
  __device__ __forceinline__ static void put_raw(unsigned char* tile, int row, int cw, int gl, uint4 v) {
    *reinterpret_cast<uint4*>(tile + (static_cast<std::int64_t>(row) * cw + gl * 8) * 2) = v;
  }
  __device__ __forceinline__ static uint4 get_raw(const unsigned char* tile, int row, int cw, int gl) {
    return *reinterpret_cast<const uint4*>(tile + (static_cast<std::int64_t>(row) * cw + gl * 8) * 2);
  }
};

//! Forward / dx with a tile of `tt` tokens x the block's channels staged in shared memory (V = 8, bf16).
template <class S>
__global__ void __launch_bounds__(k_dw_threads) dw_apply_staged(const dw_params p, int tt) {
  using T = __nv_bfloat16;
  using io = row_io<T, 8>;
  extern __shared__ __align__(16) unsigned char dyn[];
  __shared__ __align__(16) float ws[k_taps + 1][k_dw_max_groups * 8];
  const int gb = p.gb, rows = k_dw_threads / gb, cw = gb * 8;
  const int g_first = static_cast<int>(blockIdx.y) * gb, c_first = g_first * 8;
  const int gl = static_cast<int>(threadIdx.x) % gb, r = static_cast<int>(threadIdx.x) / gb;
  for (int i = static_cast<int>(threadIdx.x); i < k_taps * cw; i += k_dw_threads) {
    const int cl = i / k_taps, o = i % k_taps;
    ws[o][ws_slot<8>(cl)] = c_first + cl < p.channels ? __ldg(p.w + static_cast<std::int64_t>(c_first) * k_taps + i) : 0.f;
  }
  for (int cl = static_cast<int>(threadIdx.x); cl < cw; cl += k_dw_threads)
    ws[k_taps][ws_slot<8>(cl)] = p.bias && c_first + cl < p.channels ? __ldg(p.bias + c_first + cl) : 0.f;
  const int groups = p.channels / 8, g = g_first + gl, c0 = g * 8;
  const bool active = r < rows && g < groups;
  const int t0 = static_cast<int>(blockIdx.x) * tt, tn = min(tt, p.tokens - t0);
  const T* in = static_cast<const T*>(p.in);
  const T* res = static_cast<const T*>(p.res);
  T* out = static_cast<T*>(p.out);
  auto weights = [&](int o, float (&w)[8]) {
    const float4 lo = *reinterpret_cast<const float4*>(&ws[o][gl * 4]);
    const float4 hi = *reinterpret_cast<const float4*>(&ws[o][k_dw_max_groups * 4 + gl * 4]);
    w[0] = lo.x; w[1] = lo.y; w[2] = lo.z; w[3] = lo.w; w[4] = hi.x; w[5] = hi.y; w[6] = hi.z; w[7] = hi.w;
  };
  auto tile_row = [&](int row, float (&x)[8]) {
    if constexpr (std::is_same<S, float>::value) stage_io<float>::get(reinterpret_cast<const float*>(dyn), row, cw, gl, x);
    else io::widen(stage_io<raw16>::get_raw(dyn, row, cw, gl), x);
  };
  for (int b = static_cast<int>(blockIdx.z); b < p.batch; b += static_cast<int>(gridDim.z)) {
    const T* xb = in + static_cast<std::int64_t>(b) * p.in_s0;
    __syncthreads();  // the weights (first pass), the previous sample's tile read (later passes)
    if (active)
      for (int k = r; k < tn; k += rows) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(xb + static_cast<std::int64_t>(t0 + k) * p.in_s1 + c0));
        if constexpr (std::is_same<S, float>::value) {
          float x[8];
          io::widen(v, x);
          stage_io<float>::put(reinterpret_cast<float*>(dyn), k, cw, gl, x);
        } else {
          stage_io<raw16>::put_raw(dyn, k, cw, gl, v);
        }
      }
    __syncthreads();
    if (!active) continue;
    for (int k = r; k < tn; k += rows) {
      const int t = t0 + k;
      const index_t* row = p.nbr + static_cast<std::int64_t>(t) * k_taps;
      float acc[8];
      weights(k_taps, acc);
      if (res) {
        float xv[8];
        if (res == in) tile_row(k, xv);
        else io::load(res + static_cast<std::int64_t>(b) * p.in_s0 + static_cast<std::int64_t>(t) * p.in_s1 + c0, xv);
#pragma unroll
        for (int v = 0; v < 8; ++v) acc[v] += xv[v];
      }
#pragma unroll
      for (int o = 0; o < k_taps; ++o) {
        const index_t s = __ldg(row + (p.mirrored ? k_taps - 1 - o : o));
        if (static_cast<unsigned>(s) >= static_cast<unsigned>(p.tokens)) continue;
        float xv[8];
        const int ls = s - t0;
        if (static_cast<unsigned>(ls) < static_cast<unsigned>(tn)) tile_row(ls, xv);
        else io::load(xb + static_cast<std::int64_t>(s) * p.in_s1 + c0, xv);
        float w[8];
        weights(o, w);
#pragma unroll
        for (int v = 0; v < 8; ++v) acc[v] = fmaf(w[v], xv[v], acc[v]);
      }
      io::store(out + static_cast<std::int64_t>(b) * p.out_s0 + static_cast<std::int64_t>(t) * p.out_s1 + c0, acc);
    }
  }
}

template <class S>
void launch_staged(dw_params p, cudaStream_t st) {
  const int groups = p.channels / 8;
  p.gb = dw_block_groups(groups);
  const int cw = p.gb * 8, rows = k_dw_threads / p.gb;
  int tt = 8192 / cw;  // 32 KB of fp32 or 16 KB of bf16
  tt = std::max(rows, tt / rows * rows);
  const std::size_t smem = static_cast<std::size_t>(tt) * cw * stage_io<S>::bytes;
  const dim3 grid(static_cast<unsigned>((p.tokens + tt - 1) / tt), static_cast<unsigned>((groups + p.gb - 1) / p.gb),
                  static_cast<unsigned>(std::min(p.batch, 65535)));
  dw_apply_staged<S><<<grid, k_dw_threads, smem, st>>>(p, tt);
}

// ---- dweight with W channels a thread ----------------------------------------------------------------
struct bf16x4 {
  __device__ __forceinline__ static void load(const __nv_bfloat16* p, float (&x)[4]) {
    const uint2 w = __ldg(reinterpret_cast<const uint2*>(p));
    x[0] = bf16_lo(w.x); x[1] = bf16_hi(w.x); x[2] = bf16_lo(w.y); x[3] = bf16_hi(w.y);
  }
};

__global__ void __launch_bounds__(k_dw_threads, 2) dw_grad_partial4(const dw_grad_params p) {
  using T = __nv_bfloat16;
  using Off = std::uint32_t;
  constexpr int V = 4, K = (k_taps + 1) * V;
  __shared__ float red[K][k_dw_threads];
  const int groups = p.channels / V, gb = p.gb, rows = k_dw_threads / gb;
  const int gl = static_cast<int>(threadIdx.x) % gb, r = static_cast<int>(threadIdx.x) / gb;
  const int g = static_cast<int>(blockIdx.x) * gb + gl, c0 = g * V;
  const int tile = static_cast<int>(blockIdx.y), chunk = static_cast<int>(blockIdx.z);
  const std::int64_t t_end = static_cast<std::int64_t>(tile + 1) * p.split.tile;
  const std::int64_t b_end = static_cast<std::int64_t>(chunk + 1) * p.split.chunk;
  const int t0 = tile * p.split.tile, t1 = t_end < p.tokens ? static_cast<int>(t_end) : p.tokens;
  const int b0 = chunk * p.split.chunk, b1 = b_end < p.batch ? static_cast<int>(b_end) : p.batch;
  const T* x = static_cast<const T*>(p.x);
  const T* dy = static_cast<const T*>(p.dy);
  float acc[K];
#pragma unroll
  for (int k = 0; k < K; ++k) acc[k] = 0.f;
  if (r < rows && g < groups) {
    for (int t = t0 + r; t < t1; t += rows) {
      const index_t* row = p.nbr + static_cast<std::int64_t>(t) * k_taps;
      const Off own = static_cast<Off>(t) * static_cast<Off>(p.x_s1) + c0;
      Off xo[k_taps];
      unsigned pad = 0;
#pragma unroll
      for (int o = 0; o < k_taps; ++o) {
        const index_t s = __ldg(row + o);
        const bool in_range = static_cast<unsigned>(s) < static_cast<unsigned>(p.tokens);
        xo[o] = in_range ? static_cast<Off>(s) * static_cast<Off>(p.x_s1) + c0 : own;
        pad |= in_range ? 0u : 1u << o;
      }
      const Off dyo = static_cast<Off>(t) * static_cast<Off>(p.dy_s1) + c0;
      for (int b = b0; b < b1; ++b) {
        const T* xb = opaque(x + static_cast<std::int64_t>(b) * p.x_s0);
        float d[V];
        bf16x4::load(dy + static_cast<std::int64_t>(b) * p.dy_s0 + dyo, d);
#pragma unroll
        for (int v = 0; v < V; ++v) acc[k_taps * V + v] += d[v];
#pragma unroll
        for (int o = 0; o < k_taps; ++o) {
          const bool skip = (pad >> o) & 1u;
          float xv[V];
          bf16x4::load(xb + xo[o], xv);
#pragma unroll
          for (int v = 0; v < V; ++v) {
            const float f = fmaf(d[v], xv[v], acc[o * V + v]);
            acc[o * V + v] = skip ? acc[o * V + v] : f;
          }
        }
      }
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) red[k][threadIdx.x] = acc[k];
  __syncthreads();
  const std::int64_t part = static_cast<std::int64_t>(chunk) * p.split.tiles + tile;
  for (int j = static_cast<int>(threadIdx.x); j < gb * K; j += k_dw_threads) {
    const int jl = j / K, k = j % K, gg = static_cast<int>(blockIdx.x) * gb + jl;
    if (gg >= groups) continue;
    float s = 0.f;
    for (int rr = 0; rr < rows; ++rr) s += red[k][rr * gb + jl];
    const int o = k / V, v = k % V;
    p.partial[(part * p.channels + gg * V + v) * (k_taps + 1) + o] = s;
  }
}

}}}}  // namespace greenmim::detail::cuda::(anonymous)

using namespace greenmim;
using namespace greenmim::detail::cuda;
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("CUDA error %s at line %d\n", cudaGetErrorString(e_), __LINE__); std::exit(1); } } while (0)

template <class F>
float time_graph(F&& body) {
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g; cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < 20; ++i) body(s);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, s));
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < 15; ++r) {
    CK(cudaEventRecord(a, s)); CK(cudaGraphLaunch(ge, s)); CK(cudaEventRecord(b, s)); CK(cudaEventSynchronize(b));
    float ms; CK(cudaEventElapsedTime(&ms, a, b)); t.push_back(ms * 1000.f / 20.f);
  }
  std::sort(t.begin(), t.end());
  CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g)); CK(cudaStreamDestroy(s));
  return t[t.size() / 2];
}

void launch_grad(dw_grad_params g, int V, bool more, cudaStream_t st) {
  const int C = g.channels;
  g.split = dw_grad_split_for(g.tokens, g.batch, more ? C / 2 : C);
  g.gb = dw_block_groups((C + 1) / 2);
  const dim3 grid(static_cast<unsigned>((C / V + g.gb - 1) / g.gb), static_cast<unsigned>(g.split.tiles),
                  static_cast<unsigned>(g.split.chunks));
  if (V == 2) dw_grad_partial<__nv_bfloat16, 2, std::uint32_t><<<grid, k_dw_threads, 0, st>>>(g);
  else dw_grad_partial4<<<grid, k_dw_threads, 0, st>>>(g);
  const std::int64_t outs = static_cast<std::int64_t>(C) * (k_taps + 1);
  float* red = g.partial + g.split.parts() * outs;  // dweight [C, 9], then dbias [C]
  dw_grad_reduce<<<static_cast<unsigned>((outs + 31) / 32), k_red_threads, 0, st>>>(g.partial, g.split.parts(), C, red,
                                                                                   red + static_cast<std::int64_t>(C) * k_taps);
}

//! The production forward with dw_apply_split_for's logic at another minimum of CTAs.
template <class T>
void launch_split(dw_params p, std::int64_t min_ctas, std::int64_t max_per, cudaStream_t st) {
  const int groups = p.channels / 8;
  p.gb = dw_block_groups(groups);
  const int rows = k_dw_threads / p.gb;
  const std::int64_t tiles = (p.tokens + rows - 1) / rows, cblocks = (groups + p.gb - 1) / p.gb, batch = p.batch;
  const std::int64_t cap = max_per * min_ctas;
  const std::int64_t tc = tiles * cblocks < cap ? tiles * cblocks : cap, bc = batch < cap ? batch : cap;
  std::int64_t per = tc * bc / min_ctas;
  per = per < 1 ? 1 : per > max_per ? max_per : per;
  const std::int64_t pb = per < batch ? per : batch, pt = per / pb;
  p.tiles_per_cta = static_cast<int>(pt);
  const std::int64_t z = (batch + pb - 1) / pb;
  const int gz = static_cast<int>(z < 65535 ? z : 65535);
  const dim3 grid(static_cast<unsigned>((tiles + pt - 1) / pt), static_cast<unsigned>(cblocks), static_cast<unsigned>(gz));
  if (p.batch > gz) dw_apply<T, 8, 2, std::uint32_t><<<grid, k_dw_threads, 0, st>>>(p);
  else dw_apply<T, 8, 1, std::uint32_t><<<grid, k_dw_threads, 0, st>>>(p);
}

template <class E>
std::vector<E> fetch(const void* d, std::size_t n) {
  std::vector<E> h(n);
  CK(cudaMemcpy(h.data(), d, n * sizeof(E), cudaMemcpyDeviceToHost));
  return h;
}

int main(int argc, char** argv) {
  const bool sweep = argc > 1 && std::string(argv[1]) == "split";
  using T = __nv_bfloat16;
  cudaDeviceProp pr; CK(cudaGetDeviceProperties(&pr, 0));
  CK(cudaFuncSetAttribute(dw_apply_staged<float>, cudaFuncAttributeMaxDynamicSharedMemorySize, 48 * 1024));
  std::printf("peg_var on %s: bf16, Twins-L, 25%% visible 32-px units; us per launch (median of 15 graph replays of 20)\n", pr.name);
  std::printf("%-10s %2s %3s %6s %5s | %5s | %6s %6s %6s %4s | %6s %6s %6s | %6s %6s %6s | %s\n", "layout", "st", "B", "N", "C", "copy",
              "fwd", "st32", "st16", "best%", "dx", "st32", "st16", "dw+red", "dw4", "dw4x2", "bits y st32/st16, dx st32/st16, dw4; dw4x2 max rel diff");
  std::mt19937_64 rng(7);
  const int B_all = 64, units = 7, keep = 12;
  std::vector<std::vector<std::uint8_t>> vis(B_all, std::vector<std::uint8_t>(units * units, 0));
  for (auto& v : vis) {
    std::vector<int> idx(units * units);
    for (int i = 0; i < units * units; ++i) idx[i] = i;
    std::shuffle(idx.begin(), idx.end(), rng);
    for (int i = 0; i < keep; ++i) v[idx[i]] = 1;
  }
  bool all_equal = true;
  for (int layout = 1; layout >= 0; --layout) {
    for (int s = 0; s < 4; ++s) {
      const index_t grid = 56 >> s, f = index_t{8} >> s, C = 128 << s;
      std::vector<index_t> cells;
      block_major_cells(grid, f, cells);
      std::vector<index_t> coords, cu{0};
      const int samples = layout == 0 ? 1 : B_all;
      for (int b = 0; b < samples; ++b) {
        for (index_t c : cells)
          if (vis[b][(coord_h(c) / f) * units + coord_w(c) / f]) coords.push_back(c);
        cu.push_back(static_cast<index_t>(coords.size()));
      }
      neighbor_table nt;
      if (build_neighbor_table_per_sample(grid, grid, 3, span<const index_t>(cu), span<const index_t>(coords), nt) != status::success) {
        std::printf("table failed\n");
        return 1;
      }
      const int B = layout == 0 ? B_all : 1;
      const std::int64_t N = nt.num_tokens, n = B * N * C;
      T *x, *dy, *cp, *y[3], *d[3];
      index_t* nbr;
      float *w, *bias, *part[3];
      const std::int64_t outs = C * 10;
      const std::int64_t parts1 = dw_grad_split_for(N, B, C).parts(), parts2 = dw_grad_split_for(N, B, C / 2).parts();
      const std::int64_t pf[3] = {(parts1 + 1) * outs, (parts1 + 1) * outs, (parts2 + 1) * outs};
      CK(cudaMalloc(&x, n * 2)); CK(cudaMalloc(&dy, n * 2)); CK(cudaMalloc(&cp, n * 2));
      for (int i = 0; i < 3; ++i) { CK(cudaMalloc(&y[i], n * 2)); CK(cudaMalloc(&d[i], n * 2)); CK(cudaMalloc(&part[i], pf[i] * 4)); }
      CK(cudaMalloc(&nbr, nt.nbr.size() * 4)); CK(cudaMalloc(&w, C * 9 * 4)); CK(cudaMalloc(&bias, C * 4));
      CK(cudaMemcpy(nbr, nt.nbr.data(), nt.nbr.size() * 4, cudaMemcpyHostToDevice));
      {
        std::normal_distribution<float> nd;
        std::vector<T> h(n);
        for (auto& e : h) e = __float2bfloat16(nd(rng));
        CK(cudaMemcpy(x, h.data(), n * 2, cudaMemcpyHostToDevice));
        for (auto& e : h) e = __float2bfloat16(nd(rng));
        CK(cudaMemcpy(dy, h.data(), n * 2, cudaMemcpyHostToDevice));
        std::vector<float> hw(C * 9), hb(C);
        for (auto& e : hw) e = nd(rng);
        for (auto& e : hb) e = nd(rng);
        CK(cudaMemcpy(w, hw.data(), C * 36, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(bias, hb.data(), C * 4, cudaMemcpyHostToDevice));
      }
      dw_params p;
      p.in = x; p.res = x; p.nbr = nbr; p.w = w; p.bias = bias;
      p.in_s0 = N * C; p.in_s1 = C; p.out_s0 = N * C; p.out_s1 = C;
      p.batch = B; p.tokens = static_cast<int>(N); p.channels = static_cast<int>(C);
      dw_params m = p;
      m.in = dy; m.res = dy; m.bias = nullptr; m.mirrored = 1;
      auto to = [](dw_params q, T* o) { q.out = o; return q; };
      dw_grad_params g;
      g.x = x; g.dy = dy; g.x_s0 = N * C; g.x_s1 = C; g.dy_s0 = N * C; g.dy_s1 = C; g.nbr = nbr;
      g.batch = B; g.tokens = static_cast<int>(N); g.channels = static_cast<int>(C);
      auto into = [](dw_grad_params q, float* o) { q.partial = o; return q; };
      const float tc = time_graph([&](cudaStream_t st) { CK(cudaMemcpyAsync(cp, x, n * 2, cudaMemcpyDeviceToDevice, st)); });
      auto ab = [&](auto&& a, auto&& b, float& ta, float& tb) {
        const float a1 = time_graph(a), b1 = time_graph(b), b2 = time_graph(b), a2 = time_graph(a);
        ta = std::min(a1, a2); tb = std::min(b1, b2);
      };
      if (sweep) {  // the forward at minimum CTA counts 256 (production), 528, 1056, 2112, 4224: us, bits
        const std::int64_t mins[5] = {256, 128, 64, 32, 128}, caps[5] = {8, 16, 32, 64, 8};
        std::printf("%-10s %d C=%lld copy %.2f |", layout == 0 ? "shared" : "per-sample", s + 1, static_cast<long long>(C), tc);
        CK((launch_dw_apply<T, 8>(to(p, y[0]), 0)));
        CK(cudaDeviceSynchronize());
        const auto ref = fetch<unsigned short>(y[0], n);
        for (int k = 0; k < 5; ++k) {
          const std::int64_t mc = mins[k];
          float ta, tb;
          ab([&](cudaStream_t st) { CK((launch_dw_apply<T, 8>(to(p, y[0]), st))); },
             [&](cudaStream_t st) { launch_split<T>(to(p, y[1]), mc, caps[k], st); }, ta, tb);
          CK(cudaDeviceSynchronize());
          const bool eq = ref == fetch<unsigned short>(y[1], n);
          all_equal = all_equal && eq;
          std::printf(" min %lld max %lld: %.2f (prod %.2f)%s", static_cast<long long>(mc), static_cast<long long>(caps[k]), tb, ta, eq ? "" : " BITS DIFFER");
        }
        std::printf("\n");
        for (void* q : {static_cast<void*>(x), static_cast<void*>(dy), static_cast<void*>(cp), static_cast<void*>(nbr),
                        static_cast<void*>(w), static_cast<void*>(bias)})
          CK(cudaFree(q));
        for (int i = 0; i < 3; ++i) { CK(cudaFree(y[i])); CK(cudaFree(d[i])); CK(cudaFree(part[i])); }
        continue;
      }
      float f0, f1, f0b, f2, x0, x1, x0b, x2, g0, g1, g0b, g2;
      auto prod_f = [&](cudaStream_t st) { CK((launch_dw_apply<T, 8>(to(p, y[0]), st))); };
      auto prod_x = [&](cudaStream_t st) { CK((launch_dw_apply<T, 8>(to(m, d[0]), st))); };
      ab(prod_f, [&](cudaStream_t st) { launch_staged<float>(to(p, y[1]), st); }, f0, f1);
      ab(prod_f, [&](cudaStream_t st) { launch_staged<raw16>(to(p, y[2]), st); }, f0b, f2);
      ab(prod_x, [&](cudaStream_t st) { launch_staged<float>(to(m, d[1]), st); }, x0, x1);
      ab(prod_x, [&](cudaStream_t st) { launch_staged<raw16>(to(m, d[2]), st); }, x0b, x2);
      auto prod_g = [&](cudaStream_t st) { launch_grad(into(g, part[0]), 2, false, st); };
      ab(prod_g, [&](cudaStream_t st) { launch_grad(into(g, part[1]), 4, false, st); }, g0, g1);
      ab(prod_g, [&](cudaStream_t st) { launch_grad(into(g, part[2]), 4, true, st); }, g0b, g2);
      CK(cudaDeviceSynchronize());
      const auto Y0 = fetch<unsigned short>(y[0], n), D0 = fetch<unsigned short>(d[0], n);
      const bool ey1 = Y0 == fetch<unsigned short>(y[1], n), ey2 = Y0 == fetch<unsigned short>(y[2], n);
      const bool ed1 = D0 == fetch<unsigned short>(d[1], n), ed2 = D0 == fetch<unsigned short>(d[2], n);
      const auto P0 = fetch<float>(part[0], pf[0]), P1 = fetch<float>(part[1], pf[1]), P2 = fetch<float>(part[2], pf[2]);
      const bool ep = P0 == P1;
      double rel = 0, scale = 0;  // the reduced dweight/dbias (after the partials), over their largest
      for (std::int64_t i = 0; i < outs; ++i) scale = std::max(scale, std::fabs(double(P0[parts1 * outs + i])));
      for (std::int64_t i = 0; i < outs; ++i) rel = std::max(rel, std::fabs(double(P0[parts1 * outs + i]) - P2[parts2 * outs + i]));
      rel /= scale > 0 ? scale : 1;
      all_equal = all_equal && ey1 && ey2 && ed1 && ed2 && ep && rel < 1e-5;
      const float fb = std::min({f0, f0b}), xb = std::min({x0, x0b}), best = std::min({fb, f1, f2});
      std::printf("%-10s %2d %3d %6lld %5lld | %5.2f | %6.2f %6.2f %6.2f %4.0f%% | %6.2f %6.2f %6.2f | %6.2f %6.2f %6.2f | %s %s, %s %s, %s; %.1e\n",
                  layout == 0 ? "shared" : "per-sample", s + 1, B, static_cast<long long>(N), static_cast<long long>(C), tc, fb, f1, f2,
                  100 * tc / best, xb, x1, x2, std::min(g0, g0b), g1, g2, ey1 ? "yes" : "NO", ey2 ? "yes" : "NO", ed1 ? "yes" : "NO",
                  ed2 ? "yes" : "NO", ep ? "yes" : "NO", rel);
      for (void* q : {static_cast<void*>(x), static_cast<void*>(dy), static_cast<void*>(cp), static_cast<void*>(nbr),
                      static_cast<void*>(w), static_cast<void*>(bias)})
        CK(cudaFree(q));
      for (int i = 0; i < 3; ++i) { CK(cudaFree(y[i])); CK(cudaFree(d[i])); CK(cudaFree(part[i])); }
    }
  }
  std::printf("%s\n", all_equal ? "peg_var: every variant agrees with production" : "peg_var: SOME VARIANT DIFFERS");
  return all_equal ? 0 : 1;
}
