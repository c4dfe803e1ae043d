//! \file attention_simt.cuh
//! Private: the CUDA-core (SIMT) group window attention kernels, forward and backward.
//!
//! Work decomposition (all kernels): one CTA per (query- or key-row tile of 64 slots, group,
//! head, sample): grid (n_g * tiles, heads, B). A row (slot) is owned by a team of D/16 lanes,
//! each holding 16 of its head_dim elements in registers; dot products are reduced across the
//! team with a fixed xor butterfly. The other operand (keys/values, or queries/dO for the key-
//! major kernel) is staged through shared memory as fp32, 64 rows per tile, read straight from
//! the visible-token layout through `gather` (no grouped copy).
//!
//! Exact block-diagonal semantics: a row only ever visits slots x with attends(win_row, win[x])
//! (the same window); every other pair is skipped, so nothing of another window (not a NaN, not
//! an Inf) reaches a row, and padding rows/columns are never read or written. The loop over x is
//! warp-uniform (bounds = the warp's union of window ranges) so that team shuffles and the dbias
//! bookkeeping below stay convergent; lanes whose row does not attend x only skip the update.
//!
//! d(bias) determinism: in the dq kernel each warp owns a private float row of the table in
//! shared memory. For one key x, the lanes of a warp that attend x belong to one window and have
//! distinct coordinates, hence distinct buckets: the read-modify-writes of one iteration touch
//! distinct addresses, and a __syncwarp() orders successive iterations. The per-warp rows are then
//! summed in warp order into a per-CTA partial in the workspace, and `dbias_reduce` sums the
//! partials in a fixed order. No float atomics anywhere: bitwise identical run to run.
#pragma once

#include <climits>
#include <cstdint>

#include "attention_params.hpp"
#include "device_common.cuh"

namespace greenmim {
namespace detail {
namespace cuda {

//! Shared-memory bytes of the SIMT kernels (dynamic part).
template <int D>
struct simt_smem {
  using C = simt_tile<D>;
  static constexpr std::size_t tiles = 2u * C::TILE * C::LD * sizeof(float);
  static std::size_t fwd(int G) { return tiles + 2u * static_cast<std::size_t>(G) * sizeof(index_t); }
  static std::size_t bwd_dq(int G, int dbias_rows) {
    return fwd(G) + static_cast<std::size_t>(C::WARPS) * dbias_rows * sizeof(float);
  }
  static std::size_t bwd_dkdv(int G) { return fwd(G) + 2u * C::TILE * sizeof(float); }
};

//! Stages the group's slot windows and coordinates into shared memory. A slot counts as real iff
//! its window id is >= 0 and its token lies in [0, N); anything else is treated as padding.
__device__ __forceinline__ void stage_slots(const partition_view& part, std::int64_t base, index_t* win,
                                            index_t* crd) {
  const int G = part.group_size;
  for (int i = threadIdx.x; i < G; i += blockDim.x) {
    const index_t t = part.gather[base + i];
    const index_t w = part.slot_window[base + i];
    win[i] = (w >= 0 && t >= 0 && t < part.num_tokens) ? w : pad_index;
    crd[i] = part.slot_coord != nullptr ? part.slot_coord[base + i] : 0;
  }
}

//! [lo, hi) = the smallest slot range holding every slot of window `w` (any slot layout; the
//! builders make it exactly the window's run). Empty (INT_MAX, INT_MIN) for padding.
__device__ __forceinline__ void window_range(const index_t* win, int G, index_t w, int& lo, int& hi) {
  lo = INT_MAX;
  hi = INT_MIN;
  if (w < 0) return;
  for (int x = 0; x < G; ++x)
    if (attends(w, win[x])) {
      lo = lo < x ? lo : x;
      hi = x + 1;
    }
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

  const int tile = blockIdx.x % p.q_tiles;
  const int g = blockIdx.x / p.q_tiles;
  const int h = blockIdx.y, b = blockIdx.z;
  const std::int64_t base = static_cast<std::int64_t>(g) * G;
  const index_t* gather = p.part.gather + base;

  stage_slots(p.part, base, win, crd);
  if (threadIdx.x == 0) { cta_range[0] = INT_MAX; cta_range[1] = INT_MIN; }
  __syncthreads();

  const int lane = threadIdx.x & 31;
  const int row = threadIdx.x / TEAM, j = threadIdx.x % TEAM;
  const int s = tile * C::ROWS + row;
  const index_t my_win = s < G ? win[s] : pad_index;
  const bool valid = my_win >= 0;
  const index_t my_crd = valid ? crd[s] : 0;
  const index_t t = valid ? gather[s] : 0;

  int lo, hi;
  window_range(win, G, my_win, lo, hi);
  const int wlo = __reduce_min_sync(full_mask, lo);
  const int whi = __reduce_max_sync(full_mask, hi);
  if (lane == 0 && wlo < whi) {
    atomicMin(&cta_range[0], wlo);
    atomicMax(&cta_range[1], whi);
  }

  float q[E], acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.f;
  if (valid) {
    seg_io<T>::load(p.q.row(b, t, h) + j * E, p.vec, q);
#pragma unroll
    for (int e = 0; e < E; ++e) q[e] *= p.scale;
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) q[e] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  __syncthreads();
  const int klo = cta_range[0], khi = cta_range[1];

  for (int k0 = klo; k0 < khi; k0 += TILE) {
    const int kn = min(TILE, khi - k0);
    for (int i = threadIdx.x; i < kn * TEAM; i += blockDim.x) {
      const int kk = i / TEAM, jj = i % TEAM, x = k0 + kk;
      if (win[x] >= 0) {
        const index_t tk = gather[x];
        float tmp[E];
        seg_io<T>::load(p.k.row(b, tk, h) + jj * E, p.vec, tmp);
        smem_store16(ks + kk * LD + jj * E, tmp);
        seg_io<T>::load(p.v.row(b, tk, h) + jj * E, p.vec, tmp);
        smem_store16(vs + kk * LD + jj * E, tmp);
      }
    }
    __syncthreads();
    const int xa = max(wlo, k0), xb = min(whi, k0 + kn);
    for (int x = xa; x < xb; ++x) {
      const bool att = valid && attends(my_win, win[x]);
      if (!__any_sync(full_mask, att)) continue;
      float kr[E];
      smem_load16(ks + (x - k0) * LD + j * E, kr);
      float d = 0.f;
#pragma unroll
      for (int e = 0; e < E; ++e) d = fmaf(q[e], kr[e], d);
      d = team_sum<TEAM>(d);
      if (att) {
        const float sc = d + pair_bias(p.bias.data, p.bias.s0, p.bias.s1, p.bias.rows, h, my_crd, crd[x], p.window);
        if (sc > m) {  // false for NaN: a NaN score then poisons l and acc below, as it must
          const float c = softmax_exp<T>(m - sc);
          l *= c;
#pragma unroll
          for (int e = 0; e < E; ++e) acc[e] *= c;
          m = sc;
        }
        const float pr = sc == -INFINITY ? 0.f : softmax_exp<T>(sc - m);
        l += pr;
        float vr[E];
        smem_load16(vs + (x - k0) * LD + j * E, vr);
#pragma unroll
        for (int e = 0; e < E; ++e) acc[e] = fmaf(pr, vr[e], acc[e]);
      }
    }
    __syncthreads();
  }

  if (valid) {
    const float inv = 1.f / l;
    float out[E];
#pragma unroll
    for (int e = 0; e < E; ++e) out[e] = acc[e] * inv;
    seg_io<T>::store(p.o.row(b, t, h) + j * E, p.vec, out);
    if (j == 0 && p.lse.data != nullptr) *p.lse.at(b, t, h) = m + logf(l);
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

  const int tile = blockIdx.x % p.q_tiles;
  const int g = blockIdx.x / p.q_tiles;
  const int h = blockIdx.y, b = blockIdx.z;
  const std::int64_t base = static_cast<std::int64_t>(g) * G;
  const std::int64_t slots = static_cast<std::int64_t>(p.part.num_groups) * G;
  const index_t* gather = p.part.gather + base;

  stage_slots(p.part, base, win, crd);
  if (want_dbias)
    for (int i = threadIdx.x; i < C::WARPS * rows; i += blockDim.x) wbuf[i] = 0.f;
  if (threadIdx.x == 0) { cta_range[0] = INT_MAX; cta_range[1] = INT_MIN; }
  __syncthreads();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row = threadIdx.x / TEAM, j = threadIdx.x % TEAM;
  const int s = tile * C::ROWS + row;
  const index_t my_win = s < G ? win[s] : pad_index;
  const bool valid = my_win >= 0;
  const index_t my_crd = valid ? crd[s] : 0;
  const index_t t = valid ? gather[s] : 0;

  int lo, hi;
  window_range(win, G, my_win, lo, hi);
  const int wlo = __reduce_min_sync(full_mask, lo);
  const int whi = __reduce_max_sync(full_mask, hi);
  if (lane == 0 && wlo < whi) {
    atomicMin(&cta_range[0], wlo);
    atomicMax(&cta_range[1], whi);
  }

  float q[E], dout[E], dq[E];
  float lse_a = 0.f, delta_a = 0.f;
#pragma unroll
  for (int e = 0; e < E; ++e) dq[e] = 0.f;
  if (valid) {
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
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) q[e] = dout[e] = 0.f;
  }
  delta_a = team_sum<TEAM>(delta_a);
  if (valid && j == 0) p.delta[(static_cast<std::int64_t>(b) * p.heads + h) * slots + base + s] = delta_a;
  __syncthreads();
  const int klo = cta_range[0], khi = cta_range[1];

  for (int k0 = klo; k0 < khi; k0 += TILE) {
    const int kn = min(TILE, khi - k0);
    for (int i = threadIdx.x; i < kn * TEAM; i += blockDim.x) {
      const int kk = i / TEAM, jj = i % TEAM, x = k0 + kk;
      if (win[x] >= 0) {
        const index_t tk = gather[x];
        float tmp[E];
        seg_io<T>::load(p.k.row(b, tk, h) + jj * E, p.vec, tmp);
        smem_store16(ks + kk * LD + jj * E, tmp);
        seg_io<T>::load(p.v.row(b, tk, h) + jj * E, p.vec, tmp);
        smem_store16(vs + kk * LD + jj * E, tmp);
      }
    }
    __syncthreads();
    const int xa = max(wlo, k0), xb = min(whi, k0 + kn);
    for (int x = xa; x < xb; ++x) {
      const bool att = valid && attends(my_win, win[x]);
      if (!__any_sync(full_mask, att)) continue;
      float kr[E], vr[E];
      smem_load16(ks + (x - k0) * LD + j * E, kr);
      smem_load16(vs + (x - k0) * LD + j * E, vr);
      float d1 = 0.f, d2 = 0.f;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        d1 = fmaf(q[e], kr[e], d1);
        d2 = fmaf(dout[e], vr[e], d2);
      }
      d1 = team_sum<TEAM>(d1);
      d2 = team_sum<TEAM>(d2);
      if (att) {
        float bias = 0.f;
        int bucket = -1;
        if (p.bias.data != nullptr) {
          bucket = pair_bucket(my_crd, crd[x], p.window, rows);
          bias = bucket >= 0 ? __ldg(p.bias.data + bucket * p.bias.s0 + h * p.bias.s1) : __int_as_float(0x7fc00000);
        }
        const float pr = softmax_exp<T>(d1 + bias - lse_a);
        const float ds = pr * (d2 - delta_a);
#pragma unroll
        for (int e = 0; e < E; ++e) dq[e] = fmaf(ds, kr[e], dq[e]);
        if (want_dbias && j == 0 && bucket >= 0) wbuf[warp * rows + bucket] += ds;
      }
      __syncwarp();  // orders this iteration's wbuf updates before the next iteration's
    }
    __syncthreads();
  }

  if (valid) {
#pragma unroll
    for (int e = 0; e < E; ++e) dq[e] *= p.scale;
    seg_io<T>::store(p.dq.row(b, t, h) + j * E, p.vec, dq);
  }
  if (want_dbias) {
    // (the loop above ends with __syncthreads(); with no key tile at all wbuf is still zero)
    __syncthreads();
    const std::int64_t cta = (static_cast<std::int64_t>(b) * p.part.num_groups + g) * p.q_tiles + tile;
    float* out = p.dbias_partial + (cta * p.heads + h) * rows;
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
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

  const int tile = blockIdx.x % p.q_tiles;
  const int g = blockIdx.x / p.q_tiles;
  const int h = blockIdx.y, b = blockIdx.z;
  const std::int64_t base = static_cast<std::int64_t>(g) * G;
  const std::int64_t slots = static_cast<std::int64_t>(p.part.num_groups) * G;
  const index_t* gather = p.part.gather + base;
  const float* delta = p.delta + (static_cast<std::int64_t>(b) * p.heads + h) * slots + base;

  stage_slots(p.part, base, win, crd);
  if (threadIdx.x == 0) { cta_range[0] = INT_MAX; cta_range[1] = INT_MIN; }
  __syncthreads();

  const int lane = threadIdx.x & 31;
  const int row = threadIdx.x / TEAM, j = threadIdx.x % TEAM;
  const int s = tile * C::ROWS + row;  // this row is a KEY slot
  const index_t my_win = s < G ? win[s] : pad_index;
  const bool valid = my_win >= 0;
  const index_t my_crd = valid ? crd[s] : 0;
  const index_t t = valid ? gather[s] : 0;

  int lo, hi;
  window_range(win, G, my_win, lo, hi);
  const int wlo = __reduce_min_sync(full_mask, lo);
  const int whi = __reduce_max_sync(full_mask, hi);
  if (lane == 0 && wlo < whi) {
    atomicMin(&cta_range[0], wlo);
    atomicMax(&cta_range[1], whi);
  }

  float k[E], v[E], dk[E], dv[E];
#pragma unroll
  for (int e = 0; e < E; ++e) dk[e] = dv[e] = 0.f;
  if (valid) {
    seg_io<T>::load(p.k.row(b, t, h) + j * E, p.vec, k);
    seg_io<T>::load(p.v.row(b, t, h) + j * E, p.vec, v);
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) k[e] = v[e] = 0.f;
  }
  __syncthreads();
  const int alo = cta_range[0], ahi = cta_range[1];

  for (int a0 = alo; a0 < ahi; a0 += TILE) {
    const int an = min(TILE, ahi - a0);
    for (int i = threadIdx.x; i < an * TEAM; i += blockDim.x) {
      const int aa = i / TEAM, jj = i % TEAM, a = a0 + aa;
      if (win[a] >= 0) {
        const index_t ta = gather[a];
        float tmp[E];
        seg_io<T>::load(p.q.row(b, ta, h) + jj * E, p.vec, tmp);
#pragma unroll
        for (int e = 0; e < E; ++e) tmp[e] *= p.scale;
        smem_store16(qs + aa * LD + jj * E, tmp);
        seg_io<T>::load(p.d_o.row(b, ta, h) + jj * E, p.vec, tmp);
        smem_store16(dos + aa * LD + jj * E, tmp);
        if (jj == 0) {
          lse_s[aa] = *p.lse.at(b, ta, h);
          delta_s[aa] = delta[a];
        }
      }
    }
    __syncthreads();
    const int xa = max(wlo, a0), xb = min(whi, a0 + an);
    for (int a = xa; a < xb; ++a) {
      const bool att = valid && attends(win[a], my_win);
      if (!__any_sync(full_mask, att)) continue;
      float qr[E], dr[E];
      smem_load16(qs + (a - a0) * LD + j * E, qr);
      smem_load16(dos + (a - a0) * LD + j * E, dr);
      float d1 = 0.f, d2 = 0.f;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        d1 = fmaf(qr[e], k[e], d1);
        d2 = fmaf(dr[e], v[e], d2);
      }
      d1 = team_sum<TEAM>(d1);
      d2 = team_sum<TEAM>(d2);
      if (att) {
        const float sc = d1 + pair_bias(p.bias.data, p.bias.s0, p.bias.s1, p.bias.rows, h, crd[a], my_crd, p.window);
        const float pr = softmax_exp<T>(sc - lse_s[a - a0]);
        const float ds = pr * (d2 - delta_s[a - a0]);
#pragma unroll
        for (int e = 0; e < E; ++e) {
          dv[e] = fmaf(pr, dr[e], dv[e]);
          dk[e] = fmaf(ds, qr[e], dk[e]);  // qr holds scale * q: dk = scale * sum ds q
        }
      }
    }
    __syncthreads();
  }

  if (valid) {
    seg_io<T>::store(p.dk.row(b, t, h) + j * E, p.vec, dk);
    seg_io<T>::store(p.dv.row(b, t, h) + j * E, p.vec, dv);
  }
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
