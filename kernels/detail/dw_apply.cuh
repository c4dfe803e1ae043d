//! \file dw_apply.cuh
//! Private: the depthwise submanifold conv's forward and dx kernel (depthwise_conv.cu launches
//! it): y[s] = bias + x[s] (residual) + sum_o w[o] x[nbr[s, o]], and dx the same through the
//! table read at mirrored offsets. Its pieces: rows through row_io.cuh, weights through
//! dw_weights.cuh, the grid from conv_split.hpp (dw_apply_split_for, dw_apply_walks).
#pragma once

#include <cstdint>

#include <greenmim/partition_types.hpp>

#include "conv_split.hpp"
#include "device_common.cuh"
#include "dw_weights.cuh"
#include "ptx.cuh"
#include "row_io.cuh"

namespace greenmim {
namespace detail {
namespace cuda {

struct dw_params {
  const void* in = nullptr;   // forward: x; dx: dy
  const void* res = nullptr;  // residual source (x or dy), null = no residual
  void* out = nullptr;        // y or dx
  std::int64_t in_s0 = 0, in_s1 = 0, out_s0 = 0, out_s1 = 0;  // elements
  const index_t* nbr = nullptr;
  const float* w = nullptr;
  const float* bias = nullptr;
  int batch = 0, tokens = 0, channels = 0;
  int gb = 1;             // channel groups per block (dw_block_groups)
  int tiles_per_cta = 1;  // token tiles per CTA (dw_apply_split)
  int mirrored = 0;       // 1: dx (read the table at mirrored offsets)
  int run = 0;            // tokens a thread walks: k_dw_run (rows kept across them) or 1; 0: the
                          // launcher chooses (dw_apply_walks)
};

//! j's bits at the even positions: the Morton rank of (0, j), of (i, 0) shifted left by one.
__device__ __forceinline__ int morton_spread(int j) { return (j & 1) | ((j & 2) << 1) | ((j & 4) << 2); }

//! Tokens a thread walks (dw_apply): one row of a group of 8 x 8 consecutive tokens taken in
//! Morton order, as Twins' block-major plans order each unit (twins_plan.hpp), so that at stage 1
//! each token after the first is its predecessor's right neighbour and finds 6 of its 9 rows in
//! the registers of the one before.
constexpr int k_dw_run = 8;
static_assert(k_dw_run == 8, "morton_spread spreads 3 bits");
static_assert(k_dw_threads / k_dw_max_groups >= k_dw_run, "a walking block needs a whole group of token rows");

//! Block (x, y, z): channel groups [y * gb, + gb) of the token tiles [x * tpc, + tpc) of samples
//! z, z + gridDim.z, ... (tpc = p.tiles_per_cta, dw_apply_split). Walking (p.run == 8, where
//! dw_apply_walks: enough tiles to fill the GPU), a tile is rows8 / 8 groups of 64 consecutive
//! tokens (rows8: the block's token rows, 256 / gb, down to a multiple of 8), and token row r
//! walks row r % 8 of its group as if the group were an 8 x 8 square in Morton order (the
//! order of a Twins plan's unit: at stage 1 a unit is such a square), tokens group +
//! morton(r % 8, j), j = 0..7, one sample at a time, and keeps the last token's 9 rows in
//! registers: where the next token's tap o is the last one's tap o + 1 (o % 3 != 2), the same cell
//! one column on, the table says so (equal entries) and the row is not loaded again. The 8 rows
//! of a group cover its 64 tokens whatever the geometry, and the test is on the entries, so any
//! table and any token order are served exactly; only the rows loaded change. On Twins-L's
//! tables (25% visible units, tokens block-major) a walking token loads 3.75 / 4.3 rows at stages
//! 1-2 (5.3 / 6.4 at stages 3-4, which do not walk per-sample; host count of this walk), against
//! 10 for the kernel before (9 taps and the residual, which is now tap 4's row where the table has
//! the token there): fewer L1 wavefronts, which ncu measured as the limit. dx walks its rows backwards: through the mirrored table the
//! last token's tap o + 1 is then again the next one's tap o. Not walking (p.run == 1: small
//! stages, where 8 tokens a thread would leave most SMs idle), a tile is `rows` tokens, one a
//! thread, every row loaded.
//! The taps' element offsets within a sample are `Off` (uint32_t where every offset fits,
//! dw_offsets_fit_int32; else int64_t), and each tap's address is one multiply-add onto the
//! sample's base pointer (opaque). A token's loads (those not kept) issue before any row is used,
//! with no branch around them: a missing neighbour reads the token's own row, its product dropped
//! by a predicate.
//! Every output is bias (+ x) + taps 0..8 in order, whatever the run, Off or the split: the bits
//! of the kernel before.
//! History (docs/perf/kernel-journal.md): on an H100 (docs/perf/NVIDIA_H100_80GB_HBM3_2026-11-27/)
//! the kernel before this one (all taps' loads issued together, two samples a thread where B > 1;
//! bench/gpu/ab/peg_run_ab.cu keeps it) ran at 27-37% of a copy's rate, 18.4 us at Twins-L stage 1
//! per-sample, with ncu showing L1 at 78% of its throughput: 10 rows read per output. Staging a
//! tile in shared memory (the same SRAM) was 1.1-1.7x slower; holding the weights in registers
//! (occupancy) and 2 tokens a thread without reuse were slower before that. This version's speed
//! is unmeasured (peg_run_ab.cu will tell).
template <class T, int V, class Off>
__global__ void __launch_bounds__(k_dw_threads, sizeof(T) == 4 && V == 8 ? 2 : 3) dw_apply(const dw_params p) {
  __shared__ __align__(16) dw_weight_smem<k_dw_taps> ws;  // dw_weights.cuh
  const int groups = p.channels / V, gb = p.gb, rows = k_dw_threads / gb;
  const int g_first = static_cast<int>(blockIdx.y) * gb;
  const int gl = static_cast<int>(threadIdx.x) % gb, r = static_cast<int>(threadIdx.x) / gb;
  dw_stage_weights<k_dw_taps, V, k_dw_threads>(ws, p.w, p.bias, g_first * V, gb * V, p.channels);
  __syncthreads();  // the only barrier: inactive threads leave after it
  const int g = g_first + gl;
  if (r >= rows || g >= groups) return;
  const int c0 = g * V;
  const T* in = static_cast<const T*>(p.in);
  const T* res = static_cast<const T*>(p.res);
  T* out = static_cast<T*>(p.out);
  using io = row_io<T, V>;
  const bool own_residual = res == in;  // the residual is the input (always, from the entry points)
  // this thread's tokens in a tile: walking (p.run == 8), row r % 8 of a group of 8 x 8 tokens in
  // Morton order (block-major Twins plans order each unit so), group + morton(r % 8, j), j = 0..7
  // (dx: 7..0); else token r alone
  const bool walks = p.run == k_dw_run;
  const int rows_used = walks ? rows / k_dw_run * k_dw_run : rows;  // dw_walk_rows
  if (r >= rows_used) return;
  const std::int64_t tile_tokens = static_cast<std::int64_t>(rows_used) * p.run;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * p.tiles_per_cta * tile_tokens +
                             (walks ? static_cast<std::int64_t>(r / k_dw_run) * (k_dw_run * k_dw_run) : r);
  const int lane = walks ? 2 * morton_spread(r % k_dw_run) : 0;  // the row's Morton offset
  for (int k = 0; k < p.tiles_per_cta; ++k) {
    const std::int64_t group = first + k * tile_tokens;  // the thread's group of 64 (walking), or token
    if (group >= p.tokens) break;
    for (int b = static_cast<int>(blockIdx.z); b < p.batch; b += static_cast<int>(gridDim.z)) {
      const T* xs = opaque(in + static_cast<std::int64_t>(b) * p.in_s0);
      typename io::raw x[k_dw_taps] = {};  // the last token's rows of taps 0..8
      index_t prev[k_dw_taps];             // the last token's table entries (read mirrored for dx)
      bool have_prev = false;
#pragma unroll 1
      for (int i = 0; i < p.run; ++i) {
        const std::int64_t tt = group + lane + (walks ? morton_spread(p.mirrored ? k_dw_run - 1 - i : i) : 0);
        if (tt >= p.tokens) continue;
        const int t = static_cast<int>(tt);
        // the token's 9 table entries (dx: read mirrored, o <-> 8 - o), then each tap's element
        // offset in a sample; a missing neighbour reads the token's own row instead (a real row,
        // so that every load is unconditional) and its product is dropped by a predicate, which
        // leaves acc bit for bit as skipping the tap does, Inf and NaN included
        index_t s[k_dw_taps];
        const index_t* row = p.nbr + static_cast<std::int64_t>(t) * k_dw_taps;
#pragma unroll
        for (int o = 0; o < k_dw_taps; ++o) s[o] = __ldg(row + (p.mirrored ? k_dw_taps - 1 - o : o));
        const Off own = static_cast<Off>(t) * static_cast<Off>(p.in_s1) + c0;
        unsigned pad = 0;  // bit o: tap o has no neighbour
        // tap o's row: the previous token's tap o + 1 where the table says it is the same cell (no
        // load), else loaded; o ascending reads each kept row before it is replaced
#pragma unroll
        for (int o = 0; o < k_dw_taps; ++o) {
          const bool in_range = static_cast<unsigned>(s[o]) < static_cast<unsigned>(p.tokens);
          pad |= in_range ? 0u : 1u << o;
          const int src = o % 3 != 2 ? o + 1 : o;  // the previous token's tap at the same cell, if any
          const bool kept = src != o && have_prev && s[o] == prev[src];
          x[o] = x[src];
          io::fetch_if(x[o], xs + (in_range ? static_cast<Off>(s[o]) * static_cast<Off>(p.in_s1) + c0 : own), !kept);
        }
#pragma unroll
        for (int o = 0; o < k_dw_taps; ++o) prev[o] = s[o];
        have_prev = true;
        float acc[V];
        dw_tap_weights<k_dw_taps, V>(ws, k_dw_taps, gl, acc);
        if (res) {  // the residual's row: tap 4's where the table has the token there
          float rv[V];
          if (own_residual && s[4] == t) io::widen(x[4], rv);
          else io::load(res + static_cast<std::int64_t>(b) * p.in_s0 + own, rv);
#pragma unroll
          for (int v = 0; v < V; ++v) acc[v] += rv[v];
        }
#pragma unroll
        for (int o = 0; o < k_dw_taps; ++o) {
          const bool skip = (pad >> o) & 1u;
          float w[V], xv[V];
          dw_tap_weights<k_dw_taps, V>(ws, o, gl, w);
          io::widen(x[o], xv);
#pragma unroll
          for (int v = 0; v < V; ++v) acc[v] = skip ? acc[v] : fmaf(w[v], xv[v], acc[v]);
        }
        io::store(out + (static_cast<std::int64_t>(b) * p.out_s0 + static_cast<std::int64_t>(t) * p.out_s1 + c0), acc);
      }
    }
  }
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
