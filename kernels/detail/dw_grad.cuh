//! \file dw_grad.cuh
//! Private: the depthwise submanifold conv's dweight and dbias, deterministic (depthwise_conv.cu
//! launches them): dw_grad_partial sums each piece of (tokens x samples) (conv_split.hpp's
//! dw_grad_split_for: the cut depends on the shapes only) into one partial per piece, in a fixed
//! order, and dw_grad_reduce sums the pieces' partials in ascending order. No float atomics.
//! Included by one translation unit (dw_grad_reduce is not a template).
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

struct dw_grad_params {
  const void* x = nullptr;
  const void* dy = nullptr;
  std::int64_t x_s0 = 0, x_s1 = 0, dy_s0 = 0, dy_s1 = 0;
  const index_t* nbr = nullptr;
  float* partial = nullptr;  // [parts, C, 10]
  int batch = 0, tokens = 0, channels = 0;
  int gb = 1;                // channel groups per block (dw_block_groups)
  dw_grad_split split;
};

//! One piece's partials of dweight (taps 0..8) and dbias (slot 9): block (x, y, z) = channel
//! groups [x * gb, + gb) x tokens of tile y x samples of chunk z; partial index z * tiles + y.
//! 3 CTAs per SM (at most 80 registers; no spills on sm_80 or sm_90). Before the 32-bit offsets,
//! `__launch_bounds__(256, 1)` made ptxas schedule the branch-free taps better (80 registers
//! instead of 75) and the PEG backward at Twins-L stage 1 took 56 us instead of 68 (H100); the
//! 32-bit path now takes 69-71 registers whatever the minimum, and the minimum of 3 keeps the
//! others (V = 1, or 64-bit offsets: 88-93 registers with a minimum of 1) at 3 CTAs per SM.
//! H100, 2026-11-27: 27.0 us at Twins-L stage 1 per-sample (38.8 before the 32-bit offsets);
//! latency-bound (ncu: L1 34%, occupancy 35%). 4 channels a thread (92 registers, 2 CTAs per SM)
//! was 1.07-1.33x slower.
template <class T, int V, class Off>
__global__ void __launch_bounds__(k_dw_threads, 3) dw_grad_partial(const dw_grad_params p) {
  constexpr int K = (k_dw_taps + 1) * V;  // a thread's sums: [tap or bias][v]
  __shared__ float red[K][k_dw_threads];
  const int groups = p.channels / V, gb = p.gb, rows = k_dw_threads / gb;
  const int gl = static_cast<int>(threadIdx.x) % gb, r = static_cast<int>(threadIdx.x) / gb;
  const int g = static_cast<int>(blockIdx.x) * gb + gl, c0 = g * V;
  const int tile = static_cast<int>(blockIdx.y), chunk = static_cast<int>(blockIdx.z);
  const std::int64_t t_end = static_cast<std::int64_t>(tile + 1) * p.split.tile;   // int64: no wrap near 2^31
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
      // each tap's x row offset in a sample, computed once per token (an offset
      // per tap and sample was a 64-bit multiply-add: most of this loop's instructions); a missing
      // neighbour reads x's own row instead (a real row) and its product is dropped by a
      // predicate, which leaves acc bit for bit as skipping the tap does, even where that row
      // holds Inf or NaN, and keeps the taps free of branches so that the loads of (t, b) issue
      // together (the PEG backward at Twins-L stage 1 took 56 us instead of 92 on an H100)
      const index_t* row = p.nbr + static_cast<std::int64_t>(t) * k_dw_taps;
      const Off own = static_cast<Off>(t) * static_cast<Off>(p.x_s1) + c0;
      Off xo[k_dw_taps];
      unsigned pad = 0;  // bit o: tap o has no neighbour
#pragma unroll
      for (int o = 0; o < k_dw_taps; ++o) {
        const index_t s = __ldg(row + o);
        const bool in_range = static_cast<unsigned>(s) < static_cast<unsigned>(p.tokens);
        xo[o] = in_range ? static_cast<Off>(s) * static_cast<Off>(p.x_s1) + c0 : own;
        pad |= in_range ? 0u : 1u << o;
      }
      const Off dyo = static_cast<Off>(t) * static_cast<Off>(p.dy_s1) + c0;
      for (int b = b0; b < b1; ++b) {
        const T* xb = opaque(x + static_cast<std::int64_t>(b) * p.x_s0);
        float d[V];
        row_io<T, V>::load(dy + static_cast<std::int64_t>(b) * p.dy_s0 + dyo, d);
#pragma unroll
        for (int v = 0; v < V; ++v) acc[k_dw_taps * V + v] += d[v];
#pragma unroll
        for (int o = 0; o < k_dw_taps; ++o) {
          const bool skip = (pad >> o) & 1u;
          float xv[V];
          row_io<T, V>::load(xb + xo[o], xv);
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
  // the block's gb x K sums over its token rows, rows ascending
  const std::int64_t part = static_cast<std::int64_t>(chunk) * p.split.tiles + tile;
  for (int j = static_cast<int>(threadIdx.x); j < gb * K; j += k_dw_threads) {
    const int jl = j / K, k = j % K, gg = static_cast<int>(blockIdx.x) * gb + jl;
    if (gg >= groups) continue;
    float s = 0.f;
    for (int rr = 0; rr < rows; ++rr) s += red[k][rr * gb + jl];
    const int o = k / V, v = k % V;
    p.partial[(part * p.channels + gg * V + v) * (k_dw_taps + 1) + o] = s;
  }
}

//! dweight[c, o] / dbias[c] = the pieces' partials summed in a fixed order (below).
__global__ void __launch_bounds__(k_dw_red_threads) dw_grad_reduce(const float* partial, std::int64_t parts, int channels,
                                                               float* dweight, float* dbias) {
  // 32 outputs per CTA (one per lane, coalesced); warp w sums the parts w, w + 8, ... in order, then
  // lane 0's warp adds the 8 warps' sums in warp order: a fixed order, from the shapes alone
  constexpr int warps = k_dw_red_threads / 32;
  __shared__ float sums[warps][32];
  const int lane = static_cast<int>(threadIdx.x) % 32, w = static_cast<int>(threadIdx.x) / 32;
  const std::int64_t outs = static_cast<std::int64_t>(channels) * (k_dw_taps + 1);
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * 32 + lane;
  float s = 0.f;
  if (i < outs) {
#pragma unroll 4
    for (std::int64_t part = w; part < parts; part += warps) s += partial[part * outs + i];
  }
  sums[w][lane] = s;
  __syncthreads();
  if (w != 0 || i >= outs) return;
  float t = sums[0][lane];
#pragma unroll
  for (int k = 1; k < warps; ++k) t += sums[k][lane];
  const int c = static_cast<int>(i / (k_dw_taps + 1)), o = static_cast<int>(i % (k_dw_taps + 1));
  if (o < k_dw_taps) {
    if (dweight) dweight[static_cast<std::int64_t>(c) * k_dw_taps + o] = t;
  } else if (dbias) {
    dbias[c] = t;
  }
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
