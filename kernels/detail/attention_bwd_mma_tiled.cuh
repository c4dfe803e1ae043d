//! \file attention_bwd_mma_tiled.cuh
//! Private: the tiled tensor-core backward (fp16/bf16, 64 < G <= GM_MMA_MAX_GROUP, head_dim 32
//! or 64, sm_80+), in two kernels that tile the other operand by 64 slots; every real row of dq
//! (kernel 1), dk and dv (kernel 2) is written once, no atomics.
//! - Kernel 1, query-major: one CTA per (64-slot query tile, group, head, sample) holds its Q and
//!   dO rows, lse and delta = rowsum(dO * O) (written to the workspace for kernel 2), and walks
//!   the key tiles its rows attend; per warp (16 query rows) and half tile (32 keys): S = Q K^T,
//!   dP = dO V^T, P and dS on the pairs of one window, dQ += dS K; d(bias) from the fp32 dS tile
//!   (dbias.cuh).
//! - Kernel 2, key-major: one CTA per (64-slot key tile, ...) holds K and V, walks the query
//!   tiles (Q, dO, lse, delta staged): S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q.
//! A tile multiplied by masked zeros (K in kernel 1; Q or dO in kernel 2) that holds a non-finite
//! real row is accumulated pair by pair instead (fallback.cuh).
#pragma once

#include <cstdint>

#include "attention_params.hpp"
#include "dbias.cuh"
#include "device_common.cuh"
#include "fallback.cuh"
#include "mask.cuh"
#include "mma_layout.hpp"
#include "mma_ptx.cuh"
#include "softmax.cuh"
#include "tile_stage.cuh"
#include "warp_mma.cuh"

namespace greenmim {
namespace detail {
namespace cuda {

//! The shared memory of both kernels (mma_tile::smem_bwd_tiled): four 16-bit row tiles, the
//! group's slot ids and coordinates, lse and delta of the staged query tile, the head's bias
//! column, an fp32 P / dS tile (LDF), then (kernel 1, with d(bias)) one table row per warp.
template <class T, int D>
struct bwd_tiled_smem {
  T* tile[4];
  index_t *win, *crd;
  float *lse, *delta, *bias, *pf, *wbuf;
  __device__ __forceinline__ bwd_tiled_smem(float4* smem, int bias_rows) {
    using C = mma_tile<D>;
    tile[0] = reinterpret_cast<T*>(smem);
    for (int i = 1; i < 4; ++i) tile[i] = tile[i - 1] + C::ROWS * C::LDS;
    win = reinterpret_cast<index_t*>(tile[3] + C::ROWS * C::LDS);
    crd = win + C::MAXG;
    lse = reinterpret_cast<float*>(crd + C::MAXG);
    delta = lse + C::ROWS;
    bias = delta + C::ROWS;
    pf = bias + bias_rows;
    wbuf = pf + C::ROWS * C::LDF;
  }
};

// =================================================================================================
// Kernel 1 (query-major): delta -> workspace, dq, per-CTA d(bias) partial
// =================================================================================================
template <class T, int D>
__global__ void __launch_bounds__(mma_tile<D>::THREADS) attention_bwd_dq_mma_tiled(const bwd_params<T> p) {
  using C = mma_tile<D>;
  using M = mma16<T>;
  namespace L = mma_layout;
  constexpr int LDS = C::LDS, LDF = C::LDF, CH = C::CH, ROWS = C::ROWS;
  constexpr int DT = D / 8;
  GM_DYNAMIC_SMEM(smem_f4);
  const int rows = p.bias.rows;
  const bwd_tiled_smem<T, D> sm(smem_f4, rows);
  T *qs = sm.tile[0], *dos = sm.tile[1], *ks = sm.tile[2], *vs = sm.tile[3];
  index_t *win = sm.win, *crd = sm.crd;
  float *lse_s = sm.lse, *delta_s = sm.delta, *bias_s = sm.bias;
  float* dsf = sm.pf;     // [ROWS][LDF] fp32 dS of the current key tile
  float* wbuf = sm.wbuf;  // [WARPS][rows] with d(bias)
  __shared__ int range[2];

  const int G = p.part.group_size;
  const int tile = blockIdx.x % p.q_tiles, g = blockIdx.x / p.q_tiles;
  const int h = blockIdx.y, b = blockIdx.z;
  const int q0 = tile * ROWS;
  const std::int64_t base = static_cast<std::int64_t>(g) * G;
  const std::int64_t slots = static_cast<std::int64_t>(p.part.num_groups) * G;
  const index_t* gather = p.part.gather + base;
  const bool want_dbias = p.dbias_partial != nullptr;
  const bool with_bias = p.bias.data != nullptr;

  if (want_dbias)
    for (int i = threadIdx.x; i < C::WARPS * rows; i += C::THREADS) wbuf[i] = 0.f;
  stage_group_range<C::THREADS, ROWS, C::MAXG>(p.part, p.bias, base, q0, h, win, crd, bias_s, range);

  // ---- Q, dO of the tile, lse, delta (-> workspace) -----------------------------------------------
  for (int i = threadIdx.x; i < ROWS; i += C::THREADS) {
    const int s = q0 + i;
    lse_s[i] = s < G && win[s] >= 0 ? *p.lse.at(b, gather[s], h) : 0.f;
  }
  stage_rows16<T, D, ROWS, C::THREADS, LDS>(qs, p.q, gather, win, q0, G, b, h);
#pragma unroll
  for (int it = 0; it < ROWS * CH / C::THREADS; ++it) {
    const int idx = threadIdx.x + it * C::THREADS;
    const int r = idx / CH, c = idx % CH, s = q0 + r;
    uint4 ud = make_uint4(0, 0, 0, 0);
    float dl = 0.f;
    const bool real = s < G && win[s] >= 0;
    if (real) {
      const index_t t = gather[s];
      ud = __ldg(reinterpret_cast<const uint4*>(p.d_o.row(b, t, h)) + c);
      dl = M::dot8(ud, __ldg(reinterpret_cast<const uint4*>(p.o.row(b, t, h)) + c), 0.f);
    }
    *reinterpret_cast<uint4*>(dos + r * LDS + c * 8) = ud;
#pragma unroll
    for (int o = CH / 2; o > 0; o /= 2) dl += __shfl_xor_sync(full_mask, dl, o);
    if (c == 0) {
      delta_s[r] = dl;
      if (real) p.delta[(static_cast<std::int64_t>(b) * p.heads + h) * slots + base + s] = dl;
    }
  }

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r0 = warp * 16;
  const bool active = q0 + r0 < G;
  const int ra = r0 + L::acc_row(lane, 0), rb = r0 + L::acc_row(lane, 2);  // local rows
  const index_t wa = q0 + ra < G ? win[q0 + ra] : pad_index, wb = q0 + rb < G ? win[q0 + rb] : pad_index;
  const index_t ca = q0 + ra < G ? crd[q0 + ra] : 0, cb = q0 + rb < G ? crd[q0 + rb] : 0;
  float dq[DT][4];
  zero_acc(dq);
  const int klo = range[0], khi = range[1];

  for (int k0 = klo; k0 < khi; k0 += ROWS) {
    bool finite = stage_rows16<T, D, ROWS, C::THREADS, LDS>(ks, p.k, gather, win, k0, khi, b, h);
    stage_rows16<T, D, ROWS, C::THREADS, LDS>(vs, p.v, gather, win, k0, khi, b, h);
    const bool tile_finite = __syncthreads_and(finite);  // also: Q, dO, lse, delta staged
    if (active) {
      const float la = lse_s[ra], lb = lse_s[rb], da = delta_s[ra], db = delta_s[rb];
#pragma unroll
      for (int hc = 0; hc < 2; ++hc) {  // keys k0 + [32 hc, 32 hc + 32)
        float s[4][4], ds[4][4];
        zero_acc(s);
        zero_acc(ds);
        mma_two_products<T, D, LDS, 2>(s, ds, qs, dos, ks, vs, r0, 32 * hc, lane, 4);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int c = 32 * hc + nt * 8 + L::acc_col(lane, e), x = k0 + c;
            const index_t wc = x < khi ? win[x] : pad_index, cc = x < khi ? crd[x] : 0;
            recompute_p_ds<T>(s[nt][e], ds[nt][e], attends(wa, wc), bias_s, with_bias, ca, cc, p.window, rows,
                              p.scale, la, da);
            recompute_p_ds<T>(s[nt][2 + e], ds[nt][2 + e], attends(wb, wc), bias_s, with_bias, cb, cc, p.window,
                              rows, p.scale, lb, db);
            dsf[ra * LDF + c] = ds[nt][e];
            dsf[rb * LDF + c] = ds[nt][2 + e];
          }
        }
        if (tile_finite) {
#pragma unroll
          for (int kc = 0; kc < 2; ++kc) {
            unsigned a[4];
            L::acc_to_a(ds[2 * kc], ds[2 * kc + 1], a, [](float lo, float hi) { return M::pack(lo, hi); });
#pragma unroll
            for (int dp = 0; dp < DT / 2; ++dp) {
              unsigned bk[4];
              ldmatrix_x4_trans(bk, ks + (32 * hc + kc * 16 + L::bv_ld_row(lane)) * LDS + dp * 16 + L::bv_ld_col(lane));
              M::run(dq[2 * dp], a, bk[0], bk[1]);
              M::run(dq[2 * dp + 1], a, bk[2], bk[3]);
            }
          }
        }
      }
      if (!tile_finite) {  // exact: attending pairs only (a non-finite K row of another window)
        __syncwarp();
        tile_exact_acc<T, DT, LDS, LDF, false>(dq, dsf, ks, win, k0, khi, 0, min(ROWS, khi - k0), ra, rb, wa, wb, lane);
      }
    }
    if (want_dbias) {
      __syncthreads();  // the dS tile is complete
      const int i = (warp & 1) * 32 + lane, s = q0 + i;
      const index_t wi = s < G ? win[s] : pad_index, ci = s < G ? crd[s] : 0;
      const int j0 = (warp >> 1) * 32;
      dbias_add_row<LDF>(wbuf + warp * rows, dsf, i, wi, ci, win + k0, crd + k0, j0, min(j0 + 32, khi - k0), p.window,
                         rows);
    }
    __syncthreads();  // before the next tile overwrites K, V and the dS tile
  }

  __syncthreads();  // (no key tile at all: the staging of Q is still ordered before the epilogue)
  if (active) {  // dq through the warp's own Q rows (read by this warp only)
    stage_acc<T, DT>(qs, LDS, r0, lane, dq, p.scale);
    __syncwarp();
    write_rows<T, D>(p.dq, qs, LDS, r0, lane, win + q0, gather + q0, b, h);
  }
  if (want_dbias) {
    const std::int64_t cta = (static_cast<std::int64_t>(b) * p.part.num_groups + g) * p.q_tiles + tile;
    float* out = p.dbias_partial + (cta * p.heads + h) * rows;
    dbias_write_partial<C::THREADS>(out, wbuf, rows);
  }
}

// =================================================================================================
// Kernel 2 (key-major): dk, dv. Needs delta from kernel 1 (same stream, earlier launch).
// =================================================================================================
template <class T, int D>
__global__ void __launch_bounds__(mma_tile<D>::THREADS) attention_bwd_dkdv_mma_tiled(const bwd_params<T> p) {
  using C = mma_tile<D>;
  using M = mma16<T>;
  namespace L = mma_layout;
  constexpr int LDS = C::LDS, LDF = C::LDF, ROWS = C::ROWS;
  constexpr int DT = D / 8;
  GM_DYNAMIC_SMEM(smem_f4);
  const int rows = p.bias.rows;
  const bwd_tiled_smem<T, D> sm(smem_f4, rows);
  T *ks = sm.tile[0], *vs = sm.tile[1], *qs = sm.tile[2], *dos = sm.tile[3];
  index_t *win = sm.win, *crd = sm.crd;
  float *lse_s = sm.lse, *delta_s = sm.delta, *bias_s = sm.bias;
  float* pf = sm.pf;  // [ROWS keys][LDF] fp32 P^T or dS^T of a half tile (exact path)
  __shared__ int range[2];

  const int G = p.part.group_size;
  const int tile = blockIdx.x % p.q_tiles, g = blockIdx.x / p.q_tiles;
  const int h = blockIdx.y, b = blockIdx.z;
  const int k0 = tile * ROWS;
  const std::int64_t base = static_cast<std::int64_t>(g) * G;
  const std::int64_t slots = static_cast<std::int64_t>(p.part.num_groups) * G;
  const index_t* gather = p.part.gather + base;
  const float* delta = p.delta + (static_cast<std::int64_t>(b) * p.heads + h) * slots + base;
  const bool with_bias = p.bias.data != nullptr;

  stage_group_range<C::THREADS, ROWS, C::MAXG>(p.part, p.bias, base, k0, h, win, crd, bias_s, range);
  stage_rows16<T, D, ROWS, C::THREADS, LDS>(ks, p.k, gather, win, k0, G, b, h);
  stage_rows16<T, D, ROWS, C::THREADS, LDS>(vs, p.v, gather, win, k0, G, b, h);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r0 = warp * 16;
  const bool active = k0 + r0 < G;
  const int ja = r0 + L::acc_row(lane, 0), jb = r0 + L::acc_row(lane, 2);  // local key rows
  const index_t wa = k0 + ja < G ? win[k0 + ja] : pad_index, wb = k0 + jb < G ? win[k0 + jb] : pad_index;
  const index_t ca = k0 + ja < G ? crd[k0 + ja] : 0, cb = k0 + jb < G ? crd[k0 + jb] : 0;
  float dk[DT][4], dv[DT][4];
  zero_acc(dk);
  zero_acc(dv);
  const int alo = range[0], ahi = range[1];

  for (int a0 = alo; a0 < ahi; a0 += ROWS) {
    bool finite = stage_rows16<T, D, ROWS, C::THREADS, LDS>(qs, p.q, gather, win, a0, ahi, b, h);
    finite = stage_rows16<T, D, ROWS, C::THREADS, LDS>(dos, p.d_o, gather, win, a0, ahi, b, h) && finite;
    for (int i = threadIdx.x; i < ROWS; i += C::THREADS) {
      const int a = a0 + i;
      const bool real = a < ahi && win[a] >= 0;
      lse_s[i] = real ? *p.lse.at(b, gather[a], h) : 0.f;
      delta_s[i] = real ? delta[a] : 0.f;
    }
    const bool tile_finite = __syncthreads_and(finite);  // also: K, V staged
    if (active) {
#pragma unroll
      for (int hc = 0; hc < 2; ++hc) {  // queries a0 + [32 hc, 32 hc + 32)
        float pt[4][4], dst[4][4];
        zero_acc(pt);
        zero_acc(dst);
        mma_two_products<T, D, LDS, 2>(pt, dst, ks, vs, qs, dos, r0, 32 * hc, lane, 4);
        // P^T and dS^T on the pairs of one window (query column a, key row j)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int c = 32 * hc + nt * 8 + L::acc_col(lane, e), a = a0 + c;
            const index_t wc = a < ahi ? win[a] : pad_index, cc = a < ahi ? crd[a] : 0;
            const float lc = lse_s[c], dc = delta_s[c];
            recompute_p_ds<T>(pt[nt][e], dst[nt][e], attends(wc, wa), bias_s, with_bias, cc, ca, p.window, rows,
                              p.scale, lc, dc);
            recompute_p_ds<T>(pt[nt][2 + e], dst[nt][2 + e], attends(wc, wb), bias_s, with_bias, cc, cb, p.window,
                              rows, p.scale, lc, dc);
          }
        }
        if (tile_finite) {
#pragma unroll
          for (int kc = 0; kc < 2; ++kc) {
            unsigned ap[4], as[4];
            L::acc_to_a(pt[2 * kc], pt[2 * kc + 1], ap, [](float lo, float hi) { return M::pack(lo, hi); });
            L::acc_to_a(dst[2 * kc], dst[2 * kc + 1], as, [](float lo, float hi) { return M::pack(lo, hi); });
#pragma unroll
            for (int dp = 0; dp < DT / 2; ++dp) {
              unsigned bo[4], bq[4];
              const int off = (32 * hc + kc * 16 + L::bv_ld_row(lane)) * LDS + dp * 16 + L::bv_ld_col(lane);
              ldmatrix_x4_trans(bo, dos + off);
              ldmatrix_x4_trans(bq, qs + off);
              M::run(dv[2 * dp], ap, bo[0], bo[1]);
              M::run(dv[2 * dp + 1], ap, bo[2], bo[3]);
              M::run(dk[2 * dp], as, bq[0], bq[1]);
              M::run(dk[2 * dp + 1], as, bq[2], bq[3]);
            }
          }
        } else {  // exact: attending pairs only (a non-finite Q or dO row of another window)
#pragma unroll
          for (int pass = 0; pass < 2; ++pass) {  // 0: dv from P^T and dO, 1: dk from dS^T and Q
            __syncwarp();
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
              const int c = 32 * hc + nt * 8 + L::acc_col(lane, 0);
              const float(&src)[4] = pass == 0 ? pt[nt] : dst[nt];
              pf[ja * LDF + c] = src[0];
              pf[ja * LDF + c + 1] = src[1];
              pf[jb * LDF + c] = src[2];
              pf[jb * LDF + c + 1] = src[3];
            }
            __syncwarp();
            float(&acc)[DT][4] = pass == 0 ? dv : dk;
            tile_exact_acc<T, DT, LDS, LDF, true>(acc, pf, pass == 0 ? dos : qs, win, a0, ahi, 32 * hc, 32 * hc + 32, ja,
                                                  jb, wa, wb, lane);
          }
        }
      }
    }
    __syncthreads();  // before the next tile overwrites Q, dO, lse, delta
  }

  __syncthreads();  // (no query tile at all: the staging of K, V is still ordered before the epilogue)
  if (active) {  // dv, dk through the warp's own V, K rows (read by this warp only)
    stage_acc<T, DT>(vs, LDS, r0, lane, dv, 1.f);
    stage_acc<T, DT>(ks, LDS, r0, lane, dk, p.scale);
    __syncwarp();
    write_rows<T, D>(p.dv, vs, LDS, r0, lane, win + k0, gather + k0, b, h);
    write_rows<T, D>(p.dk, ks, LDS, r0, lane, win + k0, gather + k0, b, h);
  }
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
