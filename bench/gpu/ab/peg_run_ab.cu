// Same-binary A/B of the PEG forward / dx kernel: the one measured on an H100 on 2026-11-27
// ("prev", copied verbatim but for its name (and, since issue 40, k_taps spelled k_dw_taps) from
// f8e7fa1: kernels/depthwise_conv.cu; 18.4 us at
// Twins-L stage 1 per-sample, 27% of a copy's rate, L1-bound in ncu) against the production kernel
// ("new", kernels/depthwise_conv.cu, included below: a thread walks one row of a Morton-ordered
// group of 64 tokens and keeps the last token's rows where the table says they are the same
// cells; 3.75-6.4 rows loaded per output at stages 1-4 instead of 10; unmeasured when written).
// "new" is timed both ways, walking (p.run = 8) and one token a thread (p.run = 1); "pick" is
// what the launcher chooses (dw_apply_walks: walks where enough tiles remain), to be set by these
// figures.
// bench/gpu/ab/README.md says how these files live and die. Twins-L bf16 stages 1-4, 25% visible
// 32-px units, tokens block-major (as greenmim.plan_twins orders them): a shared mask at batch 64,
// and the packed per-sample layout (B = 1, all 64 samples' tokens on one axis: the training
// path). Each timing is a CUDA graph of 20 launches replayed 15 times, median per launch, each
// side timed twice (prev, new, new, prev) and its lower median kept. The peer is
// cudaMemcpyAsync D2D of the same bytes (read x once, write y once). y and dx (the mirrored
// table) of the two versions are compared bit for bit.
// Build (bench/gpu/run.sh does): nvcc -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr
//   -arch=sm_XX -Iinclude -Ikernels/include -Ikernels bench/gpu/ab/peg_run_ab.cu kernels/common.cu
#include "depthwise_conv.cu"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <greenmim/twins_plan.hpp>

#include "../bench_util.hpp"

namespace greenmim { namespace detail { namespace cuda { namespace {

// ---- the previous kernel, verbatim but for its name ----------------------------------------------
template <class T, int V, int U, class Off>
__global__ void __launch_bounds__(k_dw_threads, U == 1 ? 4 : 3) dw_apply_prev(const dw_params p) {
  // [tap][ws_slot<V>(channel in block)], and the bias as a 10th row
  __shared__ __align__(16) float ws[k_dw_taps + 1][k_dw_max_groups * 8];
  const int groups = p.channels / V, gb = p.gb, rows = k_dw_threads / gb;
  const int g_first = static_cast<int>(blockIdx.y) * gb;
  const int gl = static_cast<int>(threadIdx.x) % gb, r = static_cast<int>(threadIdx.x) / gb;
  {  // the block's weights, read contiguously ([C, 9] rows of its channels), stored tap-major
    const int c_first = g_first * V, cw = gb * V;
    for (int i = static_cast<int>(threadIdx.x); i < k_dw_taps * cw; i += k_dw_threads) {
      const int cl = i / k_dw_taps, o = i % k_dw_taps;
      ws[o][ws_slot<V>(cl)] = c_first + cl < p.channels ? __ldg(p.w + static_cast<std::int64_t>(c_first) * k_dw_taps + i) : 0.f;
    }
    for (int cl = static_cast<int>(threadIdx.x); cl < cw; cl += k_dw_threads)
      ws[k_dw_taps][ws_slot<V>(cl)] = p.bias && c_first + cl < p.channels ? __ldg(p.bias + c_first + cl) : 0.f;
  }
  __syncthreads();  // the only barrier: inactive threads leave after it
  const int g = g_first + gl;
  if (r >= rows || g >= groups) return;
  const int c0 = g * V;
  const T* in = static_cast<const T*>(p.in);
  const T* res = static_cast<const T*>(p.res);
  T* out = static_cast<T*>(p.out);
  // tap o's (o = 9: the bias) V weights of this thread's channels
  auto weights = [&](int o, float (&w)[V]) {
    if constexpr (V == 8) {  // the group's halves, ws_slot<8>
      const float4 lo = *reinterpret_cast<const float4*>(&ws[o][gl * 4]);
      const float4 hi = *reinterpret_cast<const float4*>(&ws[o][k_dw_max_groups * 4 + gl * 4]);
      w[0] = lo.x; w[1] = lo.y; w[2] = lo.z; w[3] = lo.w; w[4] = hi.x; w[5] = hi.y; w[6] = hi.z; w[7] = hi.w;
    } else {
#pragma unroll
      for (int v = 0; v < V; ++v) w[v] = ws[o][ws_slot<V>(gl * V + v)];
    }
  };
  const int gz = static_cast<int>(gridDim.z);
  using io = row_io<T, V>;
  // this thread's tokens t_first, + rows, ... below t_stop (int: tokens < 2^31)
  const std::int64_t t_first = static_cast<std::int64_t>(blockIdx.x) * p.tiles_per_cta * rows + r;
  const std::int64_t t_end = t_first + static_cast<std::int64_t>(p.tiles_per_cta) * rows;
  if (t_first >= p.tokens) return;
  const int t_stop = static_cast<int>(t_end < p.tokens ? t_end : p.tokens);
  for (int t = static_cast<int>(t_first); t < t_stop; t += rows) {
    // the token's 9 table entries (dx: read mirrored, o <-> 8 - o), then each tap's element offset
    // in a sample; a missing neighbour reads the token's own row instead (a real row, so that every
    // load is unconditional and all taps' loads issue together) and its product is dropped by a
    // predicate, which leaves acc bit for bit as skipping the tap does, Inf and NaN included
    index_t s[k_dw_taps];
    const index_t* row = p.nbr + static_cast<std::int64_t>(t) * k_dw_taps;
#pragma unroll
    for (int o = 0; o < k_dw_taps; ++o) s[o] = __ldg(row + o);
    const Off own = static_cast<Off>(t) * static_cast<Off>(p.in_s1) + c0;
    Off off[k_dw_taps];
    unsigned pad = 0;  // bit o: tap o has no neighbour
#pragma unroll
    for (int o = 0; o < k_dw_taps; ++o) {
      const index_t so = p.mirrored ? s[k_dw_taps - 1 - o] : s[o];
      const bool in_range = static_cast<unsigned>(so) < static_cast<unsigned>(p.tokens);
      off[o] = in_range ? static_cast<Off>(so) * static_cast<Off>(p.in_s1) + c0 : own;
      pad |= in_range ? 0u : 1u << o;
    }
    for (int b = static_cast<int>(blockIdx.z); b < p.batch; b += U * gz) {
      const T* xs[U];
      bool live[U];
      float acc[U][V];
      {
        float bias[V];
        weights(k_dw_taps, bias);
#pragma unroll
        for (int u = 0; u < U; ++u) {
          live[u] = u == 0 || b + u * gz < p.batch;
          const std::int64_t bu = live[u] ? b + u * gz : b;
          xs[u] = opaque(in + bu * p.in_s0);
#pragma unroll
          for (int v = 0; v < V; ++v) acc[u][v] = bias[v];
          // the residual's row loads whether or not there is one (from x where there is not, a
          // real row), so that it issues with the taps' loads instead of behind a branch
          float rv[V];
          io::load((res ? res : in) + bu * p.in_s0 + own, rv);
          if (res) {
#pragma unroll
            for (int v = 0; v < V; ++v) acc[u][v] += rv[v];
          }
        }
      }
      // every tap's rows loaded before any is used (ptxas keeps as many in flight as its registers
      // allow: up to 4 16-byte rows a thread where the kernel before waited on each load in turn)
      typename io::raw x[k_dw_taps][U];
#pragma unroll
      for (int o = 0; o < k_dw_taps; ++o)
#pragma unroll
        for (int u = 0; u < U; ++u) x[o][u] = io::fetch(xs[u] + off[o]);
#pragma unroll
      for (int o = 0; o < k_dw_taps; ++o) {
        const bool skip = (pad >> o) & 1u;
        float w[V];
        weights(o, w);
#pragma unroll
        for (int u = 0; u < U; ++u) {
          float xv[V];
          io::widen(x[o][u], xv);
#pragma unroll
          for (int v = 0; v < V; ++v) acc[u][v] = skip ? acc[u][v] : fmaf(w[v], xv[v], acc[u][v]);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (live[u])
          io::store(out + (static_cast<std::int64_t>(b + u * gz) * p.out_s0 + static_cast<std::int64_t>(t) * p.out_s1 + c0), acc[u]);
    }
  }
}

}}}}  // namespace greenmim::detail::cuda::(anonymous)

using namespace greenmim;
using namespace greenmim::detail::cuda;
using gm_bench::graph_median_us;

//! The previous launcher of dw_apply (f8e7fa1): tiles of `rows` tokens, two samples a thread where
//! a CTA has several.
template <class T>
void launch_prev_apply(dw_params p, cudaStream_t st) {
  const int groups = p.channels / 8;
  p.gb = dw_block_groups(groups);
  const int rows = k_dw_threads / p.gb;
  const std::int64_t tiles = (p.tokens + rows - 1) / rows, cblocks = (groups + p.gb - 1) / p.gb;
  const dw_apply_split sp = dw_apply_split_for(tiles, cblocks, p.batch);
  p.tiles_per_cta = sp.tiles_per_cta;
  const dim3 grid(static_cast<unsigned>(sp.grid_x), static_cast<unsigned>(cblocks), static_cast<unsigned>(sp.grid_z));
  if (p.batch > sp.grid_z) dw_apply_prev<T, 8, 2, std::uint32_t><<<grid, k_dw_threads, 0, st>>>(p);
  else dw_apply_prev<T, 8, 1, std::uint32_t><<<grid, k_dw_threads, 0, st>>>(p);
}

template <class E>
std::vector<E> fetch(const void* d, std::size_t n) {
  std::vector<E> h(n);
  BENCH_CHECK(cudaMemcpy(h.data(), d, n * sizeof(E), cudaMemcpyDeviceToHost));
  return h;
}

int main() {
  using T = __nv_bfloat16;
  cudaDeviceProp pr; BENCH_CHECK(cudaGetDeviceProperties(&pr, 0));
  std::printf("peg_run_ab on %s: bf16, Twins-L, 25%% visible 32-px units; us per launch (median of 15 graph replays of 20); "
              "%% = the copy's time over the kernel's\n", pr.name);
  std::printf("%-10s %5s %3s %7s %5s | %6s | %6s %6s %6s %5s %5s | %6s %6s %6s | %4s | %s\n", "layout", "stage", "B", "N", "C",
              "copy", "fwd", "fwd", "fwd", "fwd%", "fwd%", "dx", "dx", "dx", "pick", "bits equal (y, dx; walk, one)");
  std::printf("%-10s %5s %3s %7s %5s | %6s | %6s %6s %6s %5s %5s | %6s %6s %6s | %4s |\n", "", "", "", "", "", "", "prev", "walk",
              "one", "prev", "best", "prev", "walk", "one", "");
  std::mt19937_64 rng(7);
  const int B_all = 64, units = 7, keep = 12;  // 12 of 49 units visible (24.5%)
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
      T *x, *dy, *y0, *y1, *y2, *d0, *d1, *d2, *cp;
      index_t* nbr;
      float *w, *bias;
      BENCH_CHECK(cudaMalloc(&x, n * 2)); BENCH_CHECK(cudaMalloc(&dy, n * 2)); BENCH_CHECK(cudaMalloc(&cp, n * 2));
      BENCH_CHECK(cudaMalloc(&y0, n * 2)); BENCH_CHECK(cudaMalloc(&y1, n * 2)); BENCH_CHECK(cudaMalloc(&y2, n * 2));
      BENCH_CHECK(cudaMalloc(&d0, n * 2)); BENCH_CHECK(cudaMalloc(&d1, n * 2)); BENCH_CHECK(cudaMalloc(&d2, n * 2));
      // different patterns: a token no kernel writes cannot compare equal
      BENCH_CHECK(cudaMemset(y0, 0xFF, n * 2)); BENCH_CHECK(cudaMemset(y1, 0xFE, n * 2)); BENCH_CHECK(cudaMemset(y2, 0xFD, n * 2));
      BENCH_CHECK(cudaMemset(d0, 0xFF, n * 2)); BENCH_CHECK(cudaMemset(d1, 0xFE, n * 2)); BENCH_CHECK(cudaMemset(d2, 0xFD, n * 2));
      BENCH_CHECK(cudaMalloc(&nbr, nt.nbr.size() * 4)); BENCH_CHECK(cudaMalloc(&w, C * 9 * 4)); BENCH_CHECK(cudaMalloc(&bias, C * 4));
      BENCH_CHECK(cudaMemcpy(nbr, nt.nbr.data(), nt.nbr.size() * 4, cudaMemcpyHostToDevice));
      {
        std::normal_distribution<float> nd;
        std::vector<T> h(n);
        for (auto& e : h) e = __float2bfloat16(nd(rng));
        BENCH_CHECK(cudaMemcpy(x, h.data(), n * 2, cudaMemcpyHostToDevice));
        for (auto& e : h) e = __float2bfloat16(nd(rng));
        BENCH_CHECK(cudaMemcpy(dy, h.data(), n * 2, cudaMemcpyHostToDevice));
        std::vector<float> hw(C * 9), hb(C);
        for (auto& e : hw) e = nd(rng);
        for (auto& e : hb) e = nd(rng);
        BENCH_CHECK(cudaMemcpy(w, hw.data(), C * 36, cudaMemcpyHostToDevice));
        BENCH_CHECK(cudaMemcpy(bias, hb.data(), C * 4, cudaMemcpyHostToDevice));
      }
      dw_params p;
      p.in = x; p.res = x; p.nbr = nbr; p.w = w; p.bias = bias;
      p.in_s0 = N * C; p.in_s1 = C; p.out_s0 = N * C; p.out_s1 = C;
      p.batch = B; p.tokens = static_cast<int>(N); p.channels = static_cast<int>(C);
      dw_params m = p;  // dx: dy through the mirrored table, with the residual, no bias
      m.in = dy; m.res = dy; m.bias = nullptr; m.mirrored = 1;
      auto to = [](dw_params q, T* o, int run = 1) { q.out = o; q.run = run; return q; };
      const float tc = graph_median_us([&](cudaStream_t st) { BENCH_CHECK(cudaMemcpyAsync(cp, x, n * 2, cudaMemcpyDeviceToDevice, st)); });
      auto ab = [&](auto&& prev, auto&& next, float& tp, float& tn) {
        const float p1 = graph_median_us(prev), n1 = graph_median_us(next), n2 = graph_median_us(next), p2 = graph_median_us(prev);
        tp = std::min(p1, p2);
        tn = std::min(n1, n2);
      };
      float f0, f1, f0b, f2, x0, x1, x0b, x2;
      ab([&](cudaStream_t st) { launch_prev_apply<T>(to(p, y0), st); },
         [&](cudaStream_t st) { BENCH_CHECK((launch_dw_apply<T, 8>(to(p, y1, k_dw_run), st))); }, f0, f1);
      ab([&](cudaStream_t st) { launch_prev_apply<T>(to(p, y0), st); },
         [&](cudaStream_t st) { BENCH_CHECK((launch_dw_apply<T, 8>(to(p, y2, 1), st))); }, f0b, f2);
      ab([&](cudaStream_t st) { launch_prev_apply<T>(to(m, d0), st); },
         [&](cudaStream_t st) { BENCH_CHECK((launch_dw_apply<T, 8>(to(m, d1, k_dw_run), st))); }, x0, x1);
      ab([&](cudaStream_t st) { launch_prev_apply<T>(to(m, d0), st); },
         [&](cudaStream_t st) { BENCH_CHECK((launch_dw_apply<T, 8>(to(m, d2, 1), st))); }, x0b, x2);
      BENCH_CHECK(cudaDeviceSynchronize());
      const auto Y0 = fetch<unsigned short>(y0, n), D0 = fetch<unsigned short>(d0, n);
      const bool ey1 = Y0 == fetch<unsigned short>(y1, n), ey2 = Y0 == fetch<unsigned short>(y2, n);
      const bool ed1 = D0 == fetch<unsigned short>(d1, n), ed2 = D0 == fetch<unsigned short>(d2, n);
      all_equal = all_equal && ey1 && ey2 && ed1 && ed2;
      const int gb = dw_block_groups(static_cast<int>(C / 8));
      const bool pick = dw_apply_walks(N, k_dw_threads / gb, (C / 8 + gb - 1) / gb, B);
      const float fp = std::min(f0, f0b), xp = std::min(x0, x0b);
      std::printf("%-10s %5d %3d %7lld %5lld | %6.2f | %6.2f %6.2f %6.2f %4.0f%% %4.0f%% | %6.2f %6.2f %6.2f | %4s | %s %s, %s %s\n",
                  layout == 0 ? "shared" : "per-sample", s + 1, B, static_cast<long long>(N), static_cast<long long>(C), tc, fp, f1,
                  f2, 100 * tc / fp, 100 * tc / std::min(f1, f2), xp, x1, x2, pick ? "walk" : "one", ey1 ? "yes" : "NO",
                  ed1 ? "yes" : "NO", ey2 ? "yes" : "NO", ed2 ? "yes" : "NO");
      for (void* q : {static_cast<void*>(x), static_cast<void*>(dy), static_cast<void*>(cp), static_cast<void*>(y0),
                      static_cast<void*>(y1), static_cast<void*>(y2), static_cast<void*>(d0), static_cast<void*>(d1),
                      static_cast<void*>(d2), static_cast<void*>(nbr), static_cast<void*>(w), static_cast<void*>(bias)})
        BENCH_CHECK(cudaFree(q));
    }
  }
  std::printf("%s\n", all_equal ? "peg_run_ab: prev and new agree bit for bit" : "peg_run_ab: BITS DIFFER between prev and new");
  return all_equal ? 0 : 1;
}
