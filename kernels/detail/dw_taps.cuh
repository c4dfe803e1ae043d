//! \file dw_taps.cuh
//! Private: the depthwise submanifold conv for any odd k up to k_dwk_max_kernel (ConvNeXt's 7 x 7,
//! 5 x 5, 1 x 1), forward, dx, dweight and dbias (depthwise_conv.cu launches them; PEG's 3 x 3
//! keeps its own kernels, dw_apply.cuh and dw_grad.cuh, whose bits and registers are unchanged).
//! k is a runtime value: one instantiation per (T, V, Off) serves every k, the register arrays
//! sized by the widest stencil row (k_dwk_max_kernel).
//!
//! - dw_apply_taps: y[s] = bias + x[s] (residual) + sum_o w[o] x[nbr[s, o]] (dx: the table read at
//!   mirrored offsets, no atomics). One token a thread; a thread takes the stencil a row at a
//!   time: it issues the row's k loads (a missing neighbour loads nothing; its product is
//!   dropped by a predicate, so a NaN in a row nobody references never leaks), then its k
//!   multiply-adds. Every output is bias (+ x) + taps 0..k*k-1 in order (the 3 x 3 kernel's
//!   order). The block's weights sit in shared memory tap-major (dw_weights.cuh) for G = 16
//!   channel groups: 50 x 128 floats = 25.6 KiB. Unlike the 3 x 3 kernel it does not walk 8
//!   tokens keeping rows in registers: 49 kept rows are 196-392 registers.
//! - dw_grad_taps_partial / dw_grad_taps_reduce: dweight and dbias, deterministic as the 3 x 3
//!   ones (dw_grad.cuh): the same cut of (tokens x samples) into pieces (dw_grad_split_taps: the
//!   shapes only), one partial per piece summed in a fixed order, then the pieces summed in
//!   ascending order. A CTA takes one stencil row's k taps (blockIdx.x = channel block * k + tap
//!   row), so a thread holds (k_dwk_max_kernel + 1) x V sums whatever k; the bias is summed by
//!   the tap row 0 CTAs.
//! Table entries outside [0, N) read as zero (never an out-of-bounds access).
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

constexpr int k_dwk_max_kernel = 7;                                  //!< the largest k the kernels take
constexpr int k_dwk_max_taps = k_dwk_max_kernel * k_dwk_max_kernel;  //!< 49
constexpr int k_dwk_groups = 16;  //!< channel groups per block of dw_apply_taps (weights: 25.6 KiB)

//! Channel groups per block of dw_apply_taps for `groups` groups.
inline int dw_taps_block_groups(int groups) { return groups < k_dwk_groups ? groups : k_dwk_groups; }

//! The cut of the k x k dweight reduction: dw_grad_split_for with k channel-rows per channel (a
//! CTA per tap row), so the pieces x C x (k*k + 1) partial floats stay below
//! 2^20 x (k*k + 1) / k (30 MiB at k = 7). Shapes only.
inline dw_grad_split dw_grad_split_taps(std::int64_t tokens, std::int64_t batch, std::int64_t channels, int k) {
  return dw_grad_split_for(tokens, batch, channels * k);
}

struct dw_taps_params {
  const void* in = nullptr;   // forward: x; dx: dy
  const void* res = nullptr;  // residual source (x or dy), null = no residual
  void* out = nullptr;        // y or dx
  std::int64_t in_s0 = 0, in_s1 = 0, out_s0 = 0, out_s1 = 0;  // elements
  const index_t* nbr = nullptr;
  const float* w = nullptr;
  const float* bias = nullptr;
  int batch = 0, tokens = 0, channels = 0;
  int kernel = 7;         // k (odd, <= k_dwk_max_kernel)
  int gb = 1;             // channel groups per block (dw_taps_block_groups)
  int tiles_per_cta = 1;  // token tiles per CTA (dw_apply_split)
  int mirrored = 0;       // 1: dx (read the table at mirrored offsets)
};

//! The block's weights ([C, taps] rows of channels [c_first, + cw)) tap-major in ws, the bias as
//! row k_dwk_max_taps; channels past `channels` (and the bias where null) as zero. Every thread
//! calls it; the caller syncs.
template <int V>
__device__ __forceinline__ void dw_taps_stage_weights(dw_weight_smem<k_dwk_max_taps, k_dwk_groups>& ws, const float* w,
                                                      const float* bias, int taps, int c_first, int cw, int channels) {
  for (int i = static_cast<int>(threadIdx.x); i < taps * cw; i += k_dw_threads) {
    const int cl = i / taps, o = i % taps;
    ws[o][ws_slot<V, k_dwk_groups>(cl)] =
        c_first + cl < channels ? __ldg(w + static_cast<std::int64_t>(c_first) * taps + i) : 0.f;
  }
  for (int cl = static_cast<int>(threadIdx.x); cl < cw; cl += k_dw_threads)
    ws[k_dwk_max_taps][ws_slot<V, k_dwk_groups>(cl)] = bias && c_first + cl < channels ? __ldg(bias + c_first + cl) : 0.f;
}

//! Block (x, y, z): channel groups [y * gb, + gb) of the token tiles [x * tpc, + tpc) (a tile:
//! the block's 256 / gb token rows, one token a thread) of samples z, z + gridDim.z, ...
template <class T, int V, class Off>
__global__ void __launch_bounds__(k_dw_threads, 2) dw_apply_taps(const dw_taps_params p) {
  constexpr int KM = k_dwk_max_kernel;
  __shared__ __align__(16) dw_weight_smem<k_dwk_max_taps, k_dwk_groups> ws;
  const int k = p.kernel, taps = k * k;
  const int groups = p.channels / V, gb = p.gb, rows = k_dw_threads / gb;
  const int g_first = static_cast<int>(blockIdx.y) * gb;
  const int gl = static_cast<int>(threadIdx.x) % gb, r = static_cast<int>(threadIdx.x) / gb;
  dw_taps_stage_weights<V>(ws, p.w, p.bias, taps, g_first * V, gb * V, p.channels);
  __syncthreads();  // the only barrier: inactive threads leave after it
  const int g = g_first + gl;
  if (r >= rows || g >= groups) return;
  const int c0 = g * V;
  const T* in = static_cast<const T*>(p.in);
  const T* res = static_cast<const T*>(p.res);
  T* out = static_cast<T*>(p.out);
  using io = row_io<T, V>;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * p.tiles_per_cta * rows + r;
  for (int kt = 0; kt < p.tiles_per_cta; ++kt) {
    const std::int64_t tt = first + static_cast<std::int64_t>(kt) * rows;
    if (tt >= p.tokens) break;
    const int t = static_cast<int>(tt);
    const index_t* row = p.nbr + static_cast<std::int64_t>(t) * taps;
    const Off own = static_cast<Off>(t) * static_cast<Off>(p.in_s1) + c0;
    for (int b = static_cast<int>(blockIdx.z); b < p.batch; b += static_cast<int>(gridDim.z)) {
      const T* xs = opaque(in + static_cast<std::int64_t>(b) * p.in_s0);
      float acc[V];
      dw_tap_weights<k_dwk_max_taps, V, k_dwk_groups>(ws, k_dwk_max_taps, gl, acc);
      if (res) {
        float rv[V];
        io::load(res + static_cast<std::int64_t>(b) * p.in_s0 + own, rv);
#pragma unroll
        for (int v = 0; v < V; ++v) acc[v] += rv[v];
      }
#pragma unroll 1
      for (int i = 0; i < k; ++i) {  // stencil row i: its k loads, then its k products
        typename io::raw x[KM] = {};
        unsigned pad = 0;  // bit j: tap (i, j) has no neighbour (or j >= k)
#pragma unroll
        for (int j = 0; j < KM; ++j) {
          const int o = i * k + j;
          const index_t s = j < k ? __ldg(row + (p.mirrored ? taps - 1 - o : o)) : pad_index;
          const bool in_range = static_cast<unsigned>(s) < static_cast<unsigned>(p.tokens);
          pad |= in_range ? 0u : 1u << j;
          io::fetch_if(x[j], xs + (in_range ? static_cast<Off>(s) * static_cast<Off>(p.in_s1) + c0 : own), in_range);
        }
#pragma unroll
        for (int j = 0; j < KM; ++j) {
          if (j >= k) break;
          const bool skip = (pad >> j) & 1u;
          float w[V], xv[V];
          dw_tap_weights<k_dwk_max_taps, V, k_dwk_groups>(ws, i * k + j, gl, w);
          io::widen(x[j], xv);
#pragma unroll
          for (int v = 0; v < V; ++v) acc[v] = skip ? acc[v] : fmaf(w[v], xv[v], acc[v]);
        }
      }
      io::store(out + (static_cast<std::int64_t>(b) * p.out_s0 + static_cast<std::int64_t>(t) * p.out_s1 + c0), acc);
    }
  }
}

struct dw_grad_taps_params {
  const void* x = nullptr;
  const void* dy = nullptr;
  std::int64_t x_s0 = 0, x_s1 = 0, dy_s0 = 0, dy_s1 = 0;
  const index_t* nbr = nullptr;
  float* partial = nullptr;  // [parts, C, k*k + 1]
  int batch = 0, tokens = 0, channels = 0;
  int kernel = 7;
  int gb = 1;                // channel groups per block (dw_block_groups of the channel pairs)
  dw_grad_split split;
};

//! One piece's partials of dweight's tap row i (taps i*k .. i*k + k-1) and, for i = 0, dbias:
//! block (x, y, z) = (channel block x / k, tap row x % k) x tokens of tile y x samples of chunk z;
//! partial index z * tiles + y. Sums in a fixed order: a thread's tokens and samples ascending,
//! then the block's token rows ascending.
template <class T, int V, class Off>
__global__ void __launch_bounds__(k_dw_threads, 3) dw_grad_taps_partial(const dw_grad_taps_params p) {
  constexpr int KM = k_dwk_max_kernel;
  constexpr int K = (KM + 1) * V;  // a thread's sums: [tap of the row or bias][v]
  __shared__ float red[K][k_dw_threads];
  const int k = p.kernel, taps = k * k;
  const int tap_row = static_cast<int>(blockIdx.x) % k, cblock = static_cast<int>(blockIdx.x) / k;
  const int groups = p.channels / V, gb = p.gb, rows = k_dw_threads / gb;
  const int gl = static_cast<int>(threadIdx.x) % gb, r = static_cast<int>(threadIdx.x) / gb;
  const int g = cblock * gb + gl, c0 = g * V;
  const int tile = static_cast<int>(blockIdx.y), chunk = static_cast<int>(blockIdx.z);
  const std::int64_t t_end = static_cast<std::int64_t>(tile + 1) * p.split.tile;
  const std::int64_t b_end = static_cast<std::int64_t>(chunk + 1) * p.split.chunk;
  const int t0 = tile * p.split.tile, t1 = t_end < p.tokens ? static_cast<int>(t_end) : p.tokens;
  const int b0 = chunk * p.split.chunk, b1 = b_end < p.batch ? static_cast<int>(b_end) : p.batch;
  const T* x = static_cast<const T*>(p.x);
  const T* dy = static_cast<const T*>(p.dy);
  float acc[K];
#pragma unroll
  for (int i = 0; i < K; ++i) acc[i] = 0.f;
  if (r < rows && g < groups) {
    for (int t = t0 + r; t < t1; t += rows) {
      const index_t* row = p.nbr + static_cast<std::int64_t>(t) * taps + tap_row * k;
      Off xo[KM];
      unsigned pad = 0;  // bit j: tap j of the row has no neighbour (or j >= k)
#pragma unroll
      for (int j = 0; j < KM; ++j) {
        const index_t s = j < k ? __ldg(row + j) : pad_index;
        const bool in_range = static_cast<unsigned>(s) < static_cast<unsigned>(p.tokens);
        xo[j] = in_range ? static_cast<Off>(s) * static_cast<Off>(p.x_s1) + c0 : Off(0);
        pad |= in_range ? 0u : 1u << j;
      }
      const Off dyo = static_cast<Off>(t) * static_cast<Off>(p.dy_s1) + c0;
      for (int b = b0; b < b1; ++b) {
        const T* xb = opaque(x + static_cast<std::int64_t>(b) * p.x_s0);
        float d[V];
        row_io<T, V>::load(dy + static_cast<std::int64_t>(b) * p.dy_s0 + dyo, d);
#pragma unroll
        for (int v = 0; v < V; ++v) acc[KM * V + v] += d[v];
#pragma unroll
        for (int j = 0; j < KM; ++j) {
          if ((pad >> j) & 1u) continue;  // a missing neighbour: no load, no product
          float xv[V];
          row_io<T, V>::load(xb + xo[j], xv);
#pragma unroll
          for (int v = 0; v < V; ++v) acc[j * V + v] = fmaf(d[v], xv[v], acc[j * V + v]);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < K; ++i) red[i][threadIdx.x] = acc[i];
  __syncthreads();
  const std::int64_t part = static_cast<std::int64_t>(chunk) * p.split.tiles + tile;
  for (int j = static_cast<int>(threadIdx.x); j < gb * K; j += k_dw_threads) {
    const int jl = j / K, kk = j % K, gg = cblock * gb + jl;
    const int slot = kk / V, v = kk % V;  // slot < KM: tap (tap_row, slot); slot == KM: the bias
    if (gg >= groups || (slot < KM && slot >= k) || (slot == KM && tap_row != 0)) continue;
    float s = 0.f;
    for (int rr = 0; rr < rows; ++rr) s += red[kk][rr * gb + jl];
    const int o = slot == KM ? taps : tap_row * k + slot;
    p.partial[(part * p.channels + gg * V + v) * (taps + 1) + o] = s;
  }
}

//! dweight[c, o] / dbias[c] = the pieces' partials summed in a fixed order (dw_grad_reduce's).
__global__ void __launch_bounds__(k_dw_red_threads) dw_grad_taps_reduce(const float* partial, std::int64_t parts,
                                                                    int channels, int taps, float* dweight,
                                                                    float* dbias) {
  constexpr int warps = k_dw_red_threads / 32;
  __shared__ float sums[warps][32];
  const int lane = static_cast<int>(threadIdx.x) % 32, w = static_cast<int>(threadIdx.x) / 32;
  const std::int64_t outs = static_cast<std::int64_t>(channels) * (taps + 1);
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
  for (int j = 1; j < warps; ++j) t += sums[j][lane];
  const int c = static_cast<int>(i / (taps + 1)), o = static_cast<int>(i % (taps + 1));
  if (o < taps) {
    if (dweight) dweight[static_cast<std::int64_t>(c) * taps + o] = t;
  } else if (dbias) {
    dbias[c] = t;
  }
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
