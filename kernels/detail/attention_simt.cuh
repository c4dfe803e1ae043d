//! \file attention_simt.cuh
//! Private: the CUDA-core (SIMT) attention kernels, any dtype, G <= GM_SIMT_MAX_GROUP: the
//! forward, and the backward in two kernels (query-major dq, key-major dk and dv).
//!
//! One CTA per (64-row tile, group, head, sample). A row (slot) is owned by a team of D/16 lanes,
//! each holding 16 of its head_dim elements in registers; dot products are reduced across the
//! team with a fixed xor butterfly. The other operand is staged through shared memory as fp32,
//! 64 rows per tile, read straight from the token layout through `gather`. A row only ever visits
//! slots of its own window (no value of another window, not a NaN, reaches it); the loop over
//! slots is warp-uniform (the warp's union of window ranges), so team shuffles stay convergent.
//! d(bias) is deterministic: each warp owns a float row of the table in shared memory (the lanes
//! attending one key have distinct buckets; __syncwarp orders the steps), summed in warp order
//! into a per-CTA partial that `dbias_reduce` sums in a fixed order.
#pragma once

#include <climits>
#include <cstdint>

#include "attention_params.hpp"
#include "device_common.cuh"
#include "mask.cuh"
#include "row_io.cuh"
#include "softmax.cuh"
#include "tile_stage.cuh"

namespace greenmim {
namespace detail {
namespace cuda {

//! A SIMT thread's row: the slot s of its tile (query or key, by kernel), that slot's window,
//! coordinate and token, the thread's part j of the row (elements [16 j, 16 j + 16)), and the
//! warp's union [lo, hi) of its rows' window ranges.
struct simt_row {
  int slot, j;
  index_t win, crd, token;
  bool valid;
  int lo, hi;
};

//! The group's slot ids and coordinates, and an empty CTA range; the caller's barrier follows.
template <int D>
__device__ __forceinline__ void simt_stage_group(const partition_view& part, std::int64_t base, index_t* win,
                                                 index_t* crd, int* cta_range) {
  stage_slots<simt_tile<D>::THREADS>(part, base, part.group_size, win, crd);
  if (threadIdx.x == 0) {
    cta_range[0] = INT_MAX;
    cta_range[1] = INT_MIN;
  }
}

//! This thread's row of tile `tile` (after the barrier), its warp's range merged into cta_range.
template <int D>
__device__ __forceinline__ simt_row simt_row_of(const index_t* win, const index_t* crd, const index_t* gather, int G,
                                                int tile, int* cta_range) {
  using C = simt_tile<D>;
  simt_row r;
  r.slot = tile * C::ROWS + static_cast<int>(threadIdx.x / C::TEAM);
  r.j = static_cast<int>(threadIdx.x % C::TEAM);
  r.win = r.slot < G ? win[r.slot] : pad_index;
  r.valid = r.win >= 0;
  r.crd = r.valid ? crd[r.slot] : 0;
  r.token = r.valid ? gather[r.slot] : 0;
  int lo, hi;
  window_range(win, G, r.win, lo, hi);
  r.lo = __reduce_min_sync(full_mask, lo);
  r.hi = __reduce_max_sync(full_mask, hi);
  if ((threadIdx.x & 31) == 0 && r.lo < r.hi) {
    atomicMin(&cta_range[0], r.lo);
    atomicMax(&cta_range[1], r.hi);
  }
  return r;
}

//! Stages the rows [t0, t0 + n) of two [B, N, heads, D] tensors as fp32 into xs, ys (row stride
//! LD) through `gather`, x multiplied by x_mul when ScaleX; padding rows are left alone (never
//! read). `per_row(i, slot, token)` runs once per real row.
template <class T, int D, bool ScaleX, class PerRow>
__device__ __forceinline__ void simt_stage_pair(float* xs, float* ys, const rows4<const T>& x, const rows4<const T>& y,
                                                float x_mul, const index_t* gather, const index_t* win, int t0, int n,
                                                int b, int h, bool vec, PerRow per_row) {
  using C = simt_tile<D>;
  constexpr int E = C::E;
  for (int i = threadIdx.x; i < n * C::TEAM; i += blockDim.x) {
    const int kk = i / C::TEAM, jj = i % C::TEAM, s = t0 + kk;
    if (win[s] >= 0) {
      const index_t t = gather[s];
      float tmp[E];
      seg_io<T>::load(x.row(b, t, h) + jj * E, vec, tmp);
      if constexpr (ScaleX) {
#pragma unroll
        for (int e = 0; e < E; ++e) tmp[e] *= x_mul;
      }
      smem_store16(xs + kk * C::LD + jj * E, tmp);
      seg_io<T>::load(y.row(b, t, h) + jj * E, vec, tmp);
      smem_store16(ys + kk * C::LD + jj * E, tmp);
      if (jj == 0) per_row(kk, s, t);
    }
  }
}

//! The tile walk every SIMT kernel makes over the other operand: the rows [lo, hi) of x and y are
//! staged TILE at a time (simt_stage_pair), and for each slot s that some lane of the warp
//! attends (the warp's range, warp-uniform: team shuffles stay convergent),
//! body(s, i, x_row, y_row, att) runs with s's index i in the staged tile, the thread's part of
//! the staged rows and whether its own row attends s. Barriers before and after each tile.
template <class T, int D, bool ScaleX, class PerRow, class Body>
__device__ __forceinline__ void simt_walk(float* xs, float* ys, const rows4<const T>& x, const rows4<const T>& y,
                                          float x_mul, const index_t* gather, const index_t* win, const simt_row& row,
                                          int lo, int hi, int b, int h, bool vec, PerRow per_row, Body body) {
  using C = simt_tile<D>;
  for (int t0 = lo; t0 < hi; t0 += C::TILE) {
    const int n = min(C::TILE, hi - t0);
    simt_stage_pair<T, D, ScaleX>(xs, ys, x, y, x_mul, gather, win, t0, n, b, h, vec, per_row);
    __syncthreads();
    for (int s = max(row.lo, t0), se = min(row.hi, t0 + n); s < se; ++s) {
      const bool att = row.valid && attends(row.win, win[s]);
      if (!__any_sync(full_mask, att)) continue;  // no lane of the warp attends the slot
      const int off = (s - t0) * C::LD + row.j * C::E;
      body(s, s - t0, xs + off, ys + off, att);
    }
    __syncthreads();
  }
}

//! Two dot products at once (interleaved fused multiply-adds), each summed over the team.
template <int Team, int E>
__device__ __forceinline__ void team_dot2(const float (&x1)[E], const float (&y1)[E], const float (&x2)[E],
                                          const float (&y2)[E], float& d1, float& d2) {
  d1 = 0.f;
  d2 = 0.f;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    d1 = fmaf(x1[e], y1[e], d1);
    d2 = fmaf(x2[e], y2[e], d2);
  }
  d1 = team_sum<Team>(d1);
  d2 = team_sum<Team>(d2);
}

//! The dot product of a row with a staged row, each lane holding E elements, summed over the team.
template <int Team, int E>
__device__ __forceinline__ float team_dot(const float (&x)[E], const float (&y)[E]) {
  float d = 0.f;
#pragma unroll
  for (int e = 0; e < E; ++e) d = fmaf(x[e], y[e], d);
  return team_sum<Team>(d);
}

// =================================================================================================
// Forward
// =================================================================================================
template <class T, int D>
__global__ void __launch_bounds__(simt_tile<D>::THREADS) attention_fwd_simt(const fwd_params<T> p) {
  using C = simt_tile<D>;
  constexpr int E = C::E, TEAM = C::TEAM, LD = C::LD, TILE = C::TILE;
  GM_DYNAMIC_SMEM(smem_f4);
  const int G = p.part.group_size;
  float* ks = reinterpret_cast<float*>(smem_f4);
  float* vs = ks + TILE * LD;
  index_t* win = reinterpret_cast<index_t*>(vs + TILE * LD);
  index_t* crd = win + G;
  __shared__ int cta_range[2];

  const int tile = blockIdx.x % p.q_tiles, g = blockIdx.x / p.q_tiles;
  const int h = blockIdx.y, b = blockIdx.z;
  const std::int64_t base = static_cast<std::int64_t>(g) * G;
  const index_t* gather = p.part.gather + base;

  simt_stage_group<D>(p.part, base, win, crd, cta_range);
  __syncthreads();
  const simt_row row = simt_row_of<D>(win, crd, gather, G, tile, cta_range);
  const int j = row.j;

  float q[E], acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = q[e] = 0.f;
  if (row.valid) {
    seg_io<T>::load(p.q.row(b, row.token, h) + j * E, p.vec, q);
#pragma unroll
    for (int e = 0; e < E; ++e) q[e] *= p.scale;
  }
  float m = -INFINITY, l = 0.f;
  __syncthreads();  // cta_range

  simt_walk<T, D, false>(ks, vs, p.k, p.v, 1.f, gather, win, row, cta_range[0], cta_range[1], b, h, p.vec,
                         [](int, int, index_t) {}, [&](int x, int, const float* k_row, const float* v_row, bool att) {
    float kr[E];
    smem_load16(k_row, kr);
    const float d = team_dot<TEAM>(q, kr);
    if (att) {
      const float sc = d + pair_bias(p.bias.data, p.bias.s0, p.bias.s1, p.bias.rows, h, row.crd, crd[x], p.window);
      const float pr = online_softmax_add<T>(sc, m, l, acc);
      float vr[E];
      smem_load16(v_row, vr);
#pragma unroll
      for (int e = 0; e < E; ++e) acc[e] = fmaf(pr, vr[e], acc[e]);
    }
  });

  if (row.valid) {
    const float inv = 1.f / l;
    float out[E];
#pragma unroll
    for (int e = 0; e < E; ++e) out[e] = acc[e] * inv;
    seg_io<T>::store(p.o.row(b, row.token, h) + j * E, p.vec, out);
    if (j == 0 && p.lse.data != nullptr) *p.lse.at(b, row.token, h) = m + logf(l);
  }
}

// =================================================================================================
// Backward, part 1 (query-major): delta = rowsum(dO * O), dq, and the per-CTA d(bias) partial.
// =================================================================================================
template <class T, int D>
__global__ void __launch_bounds__(simt_tile<D>::THREADS) attention_bwd_dq_simt(const bwd_params<T> p) {
  using C = simt_tile<D>;
  constexpr int E = C::E, TEAM = C::TEAM, LD = C::LD, TILE = C::TILE;
  GM_DYNAMIC_SMEM(smem_f4);
  const int G = p.part.group_size;
  const int rows = p.bias.rows;
  const bool want_dbias = p.dbias_partial != nullptr;
  float* ks = reinterpret_cast<float*>(smem_f4);
  float* vs = ks + TILE * LD;
  index_t* win = reinterpret_cast<index_t*>(vs + TILE * LD);
  index_t* crd = win + G;
  float* wbuf = reinterpret_cast<float*>(crd + G);  // [WARPS][rows] when want_dbias
  __shared__ int cta_range[2];

  const int tile = blockIdx.x % p.q_tiles, g = blockIdx.x / p.q_tiles;
  const int h = blockIdx.y, b = blockIdx.z;
  const std::int64_t base = static_cast<std::int64_t>(g) * G;
  const std::int64_t slots = static_cast<std::int64_t>(p.part.num_groups) * G;
  const index_t* gather = p.part.gather + base;

  simt_stage_group<D>(p.part, base, win, crd, cta_range);
  if (want_dbias)
    for (int i = threadIdx.x; i < C::WARPS * rows; i += C::THREADS) wbuf[i] = 0.f;
  __syncthreads();
  const simt_row row = simt_row_of<D>(win, crd, gather, G, tile, cta_range);
  const int warp = threadIdx.x >> 5, j = row.j;
  const index_t t = row.token;

  float q[E], dout[E], dq[E];
  float lse_a = 0.f, delta_a = 0.f;
#pragma unroll
  for (int e = 0; e < E; ++e) dq[e] = q[e] = dout[e] = 0.f;
  if (row.valid) {
    float o[E];
    seg_io<T>::load(p.o.row(b, t, h) + j * E, p.vec, o);
    seg_io<T>::load(p.d_o.row(b, t, h) + j * E, p.vec, dout);
    seg_io<T>::load(p.q.row(b, t, h) + j * E, p.vec, q);
#pragma unroll
    for (int e = 0; e < E; ++e) {
      q[e] *= p.scale;
      delta_a = fmaf(dout[e], o[e], delta_a);
    }
    lse_a = *p.lse.at(b, t, h);
  }
  delta_a = team_sum<TEAM>(delta_a);
  if (row.valid && j == 0) p.delta[(static_cast<std::int64_t>(b) * p.heads + h) * slots + base + row.slot] = delta_a;
  __syncthreads();  // cta_range
  // simt_walk's loop written out: with the walk's lambda ptxas takes 1-2 more registers here
  for (int t0 = cta_range[0], hi = cta_range[1]; t0 < hi; t0 += TILE) {
    const int n = min(TILE, hi - t0);
    simt_stage_pair<T, D, false>(ks, vs, p.k, p.v, 1.f, gather, win, t0, n, b, h, p.vec, [](int, int, index_t) {});
    __syncthreads();
    for (int x = max(row.lo, t0), se = min(row.hi, t0 + n); x < se; ++x) {
      const bool att = row.valid && attends(row.win, win[x]);
      if (!__any_sync(full_mask, att)) continue;
      float kr[E], vr[E];
      smem_load16(ks + (x - t0) * LD + j * E, kr);
      smem_load16(vs + (x - t0) * LD + j * E, vr);
      float d1, d2;
      team_dot2<TEAM>(q, kr, dout, vr, d1, d2);
      if (att) {
        float bias = 0.f;
        int bucket = -1;
        if (p.bias.data != nullptr) {
          bucket = pair_bucket(row.crd, crd[x], p.window, rows);
          bias = bucket >= 0 ? __ldg(p.bias.data + bucket * p.bias.s0 + h * p.bias.s1) : __int_as_float(0x7fc00000);
        }
        const float pr = softmax_exp<T>(d1 + bias - lse_a);
        const float ds = pr * (d2 - delta_a);
#pragma unroll
        for (int e = 0; e < E; ++e) dq[e] = fmaf(ds, kr[e], dq[e]);
        if (want_dbias && j == 0 && bucket >= 0) wbuf[warp * rows + bucket] += ds;
      }
      __syncwarp();  // orders this slot's wbuf updates before the next slot's
    }
    __syncthreads();
  }

  if (row.valid) {
#pragma unroll
    for (int e = 0; e < E; ++e) dq[e] *= p.scale;
    seg_io<T>::store(p.dq.row(b, t, h) + j * E, p.vec, dq);
  }
  if (want_dbias) {
    // (the loop above ends with __syncthreads(); with no key tile at all wbuf is still zero)
    __syncthreads();
    const std::int64_t cta = (static_cast<std::int64_t>(b) * p.part.num_groups + g) * p.q_tiles + tile;
    float* out = p.dbias_partial + (cta * p.heads + h) * rows;
    for (int r = threadIdx.x; r < rows; r += C::THREADS) {
      float sum = 0.f;
      for (int w = 0; w < C::WARPS; ++w) sum += wbuf[w * rows + r];
      out[r] = sum;
    }
  }
}

// =================================================================================================
// Backward, part 2 (key-major): dk, dv. Needs `delta` from part 1 (same stream, earlier launch).
// =================================================================================================
template <class T, int D>
__global__ void __launch_bounds__(simt_tile<D>::THREADS) attention_bwd_dkdv_simt(const bwd_params<T> p) {
  using C = simt_tile<D>;
  constexpr int E = C::E, TEAM = C::TEAM, LD = C::LD, TILE = C::TILE;
  GM_DYNAMIC_SMEM(smem_f4);
  const int G = p.part.group_size;
  float* qs = reinterpret_cast<float*>(smem_f4);  // scale * q
  float* dos = qs + TILE * LD;
  index_t* win = reinterpret_cast<index_t*>(dos + TILE * LD);
  index_t* crd = win + G;
  float* lse_s = reinterpret_cast<float*>(crd + G);
  float* delta_s = lse_s + TILE;
  __shared__ int cta_range[2];

  const int tile = blockIdx.x % p.q_tiles, g = blockIdx.x / p.q_tiles;
  const int h = blockIdx.y, b = blockIdx.z;
  const std::int64_t base = static_cast<std::int64_t>(g) * G;
  const std::int64_t slots = static_cast<std::int64_t>(p.part.num_groups) * G;
  const index_t* gather = p.part.gather + base;
  const float* delta = p.delta + (static_cast<std::int64_t>(b) * p.heads + h) * slots + base;

  simt_stage_group<D>(p.part, base, win, crd, cta_range);
  __syncthreads();
  const simt_row row = simt_row_of<D>(win, crd, gather, G, tile, cta_range);  // this row is a KEY slot
  const int j = row.j;

  float k[E], v[E], dk[E], dv[E];
#pragma unroll
  for (int e = 0; e < E; ++e) k[e] = v[e] = dk[e] = dv[e] = 0.f;
  if (row.valid) {
    seg_io<T>::load(p.k.row(b, row.token, h) + j * E, p.vec, k);
    seg_io<T>::load(p.v.row(b, row.token, h) + j * E, p.vec, v);
  }
  __syncthreads();  // cta_range
  simt_walk<T, D, true>(qs, dos, p.q, p.d_o, p.scale, gather, win, row, cta_range[0], cta_range[1], b, h, p.vec,
                        [&](int i, int a, index_t ta) {
                          lse_s[i] = *p.lse.at(b, ta, h);
                          delta_s[i] = delta[a];
                        },
                        [&](int a, int i, const float* q_row, const float* do_row, bool att) {
    float qr[E], dr[E];
    smem_load16(q_row, qr);
    smem_load16(do_row, dr);
    float d1, d2;
    team_dot2<TEAM>(qr, k, dr, v, d1, d2);
    if (att) {
      const float sc = d1 + pair_bias(p.bias.data, p.bias.s0, p.bias.s1, p.bias.rows, h, crd[a], row.crd, p.window);
      const float pr = softmax_exp<T>(sc - lse_s[i]);
      const float ds = pr * (d2 - delta_s[i]);
#pragma unroll
      for (int e = 0; e < E; ++e) {
        dv[e] = fmaf(pr, dr[e], dv[e]);
        dk[e] = fmaf(ds, qr[e], dk[e]);  // qr holds scale * q: dk = scale * sum ds q
      }
    }
  });

  if (row.valid) {
    seg_io<T>::store(p.dk.row(b, row.token, h) + j * E, p.vec, dk);
    seg_io<T>::store(p.dv.row(b, row.token, h) + j * E, p.vec, dv);
  }
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
