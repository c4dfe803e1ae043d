//! \file attention_bwd_mma.cuh
//! Private: the one-pass tensor-core backward (fp16/bf16, G <= 64, head_dim 32 or 64, sm_80+).
//! One CTA (4 warps) per (group, head, sample) stages the group's Q, K, V, dO rows, lse and
//! delta = rowsum(dO * O), then:
//!   phase 1, warp w owns query rows [16w, 16w + 16): S = Q K^T, dP = dO V^T; P and dS on the
//!     pairs of one window (others SELECTED to 0), staged as 16-bit [query][key] tiles;
//!   phase 2: dQ = scale dS K (query rows); warp w now owns KEY rows [16w, 16w + 16): dV = P^T dO;
//!   phase 3: dK = scale dS^T Q; dQ, dV, dK staged through the warp's own dead rows and written
//!     once with 16-byte stores, no atomics.
//! A non-finite real row of K, dO or Q (multiplied by masked zeros in phase 2 and 3) sends the
//! CTA down the exact per-pair path (fallback.cuh). d(bias) is deterministic: the fp32 dS tile is
//! summed into per-warp table rows (over the dead tiles), then in warp order into the CTA's
//! partial, which `dbias_reduce` sums in a fixed order.
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

template <class T, int D>
__global__ void __launch_bounds__(mma_tile<D>::THREADS) attention_bwd_mma(const bwd_params<T> p) {
  using C = mma_tile<D>;
  using M = mma16<T>;
  namespace L = mma_layout;
  constexpr int LDS = C::LDS, LDP = C::LDP, LDF = C::LDF, CH = C::CH, ROWS = C::ROWS;
  constexpr int DT = D / 8;   // n-tiles of a head_dim-wide output
  GM_DYNAMIC_SMEM(smem_f4);
  T* qs = reinterpret_cast<T*>(smem_f4);
  T* ks = qs + ROWS * LDS;
  T* vs = ks + ROWS * LDS;
  T* dos = vs + ROWS * LDS;
  T* ps = dos + ROWS * LDS;   // P  [query][key]
  T* dss = ps + ROWS * LDP;   // dS [query][key]
  const int rows = p.bias.rows;
  const bool want_dbias = p.dbias_partial != nullptr;
  float* wbuf = reinterpret_cast<float*>(smem_f4);  // [WARPS][rows] with d(bias), over the dead tiles
  index_t* win = reinterpret_cast<index_t*>(reinterpret_cast<char*>(smem_f4) + C::bwd_head(rows, want_dbias));
  index_t* crd = win + ROWS;
  float* lse_s = reinterpret_cast<float*>(crd + ROWS);
  float* delta_s = lse_s + ROWS;
  float* bias_s = delta_s + ROWS;
  float* dsf = bias_s + rows;        // [ROWS][LDF] fp32 dS, with d(bias)

  const int G = p.part.group_size;  // <= 64 (checked by the launcher)
  const int g = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const std::int64_t base = static_cast<std::int64_t>(g) * G;
  const index_t* gather = p.part.gather + base;
  const index_t N = p.part.num_tokens;
  const bool with_bias = p.bias.data != nullptr;

  // ---- slot ids, lse, bias column --------------------------------------------------------------
  stage_slots<C::THREADS>(p.part, base, ROWS, win, crd, [&](int i, index_t w, index_t t) {
    lse_s[i] = w >= 0 ? *p.lse.at(b, t, h) : 0.f;
  });
  stage_bias_column<C::THREADS>(p.bias, h, bias_s);

  // ---- Q, K, V, dO rows (zero rows for padding) and delta = rowsum(dO * O) ------------------------
  bool finite = true;
#pragma unroll
  for (int it = 0; it < ROWS * CH / C::THREADS; ++it) {
    const int idx = threadIdx.x + it * C::THREADS;
    const int r = idx / CH, c = idx % CH;
    uint4 uq = make_uint4(0, 0, 0, 0), uk = uq, uv = uq, ud = uq;
    float dl = 0.f;
    if (r < G) {
      const index_t t = gather[r];
      const index_t sw = p.part.slot_window[base + r];
      if (sw >= 0 && t >= 0 && t < N) {
        uq = __ldg(reinterpret_cast<const uint4*>(p.q.row(b, t, h)) + c);
        uk = __ldg(reinterpret_cast<const uint4*>(p.k.row(b, t, h)) + c);
        uv = __ldg(reinterpret_cast<const uint4*>(p.v.row(b, t, h)) + c);
        ud = __ldg(reinterpret_cast<const uint4*>(p.d_o.row(b, t, h)) + c);
        const uint4 uo = __ldg(reinterpret_cast<const uint4*>(p.o.row(b, t, h)) + c);
        dl = M::dot8(ud, uo, 0.f);
        finite = finite && M::finite8(uq) && M::finite8(uk) && M::finite8(ud);
      }
    }
    *reinterpret_cast<uint4*>(qs + r * LDS + c * 8) = uq;
    *reinterpret_cast<uint4*>(ks + r * LDS + c * 8) = uk;
    *reinterpret_cast<uint4*>(vs + r * LDS + c * 8) = uv;
    *reinterpret_cast<uint4*>(dos + r * LDS + c * 8) = ud;
    // the CH chunks of row r are CH consecutive lanes: a fixed butterfly over them
#pragma unroll
    for (int o = CH / 2; o > 0; o /= 2) dl += __shfl_xor_sync(full_mask, dl, o);
    if (c == 0) delta_s[r] = dl;
  }
  const bool all_finite = __syncthreads_and(finite);

  if (!all_finite) {
    group_exact_bwd<T, D, LDS, LDF>(p, qs, ks, vs, dos, win, crd, lse_s, delta_s, bias_s, want_dbias ? dsf : nullptr,
                                    gather, G, h, b);
  } else {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r0 = warp * 16;
    const bool active = r0 < G;   // warp-uniform; the barriers below stay outside the branches
    const int NT = (G + 7) / 8;   // key n-tiles in use
    const int KT = (G + 15) / 16; // 16-row chunks in use
    float ds[8][4];               // dS of the warp's query rows (phase 1 -> phase 2)
    float dv[DT][4];              // dV of the warp's key rows (phase 2 -> phase 3)
    zero_acc(ds);
    zero_acc(dv);

    // ---- phase 1: S = Q K^T, dP = dO V^T, P, dS --------------------------------------------------
    if (active) {
      float s[8][4];
      zero_acc(s);
      mma_two_products<T, D, LDS, 4>(s, ds, qs, dos, ks, vs, r0, 0, lane, NT);
      // P and dS on the pairs of one window; every other entry is selected to exactly 0
      const int ra = r0 + L::acc_row(lane, 0), rb = r0 + L::acc_row(lane, 2);
      const index_t wa = win[ra], wb = win[rb], ca = crd[ra], cb = crd[rb];
      const float la = lse_s[ra], lb = lse_s[rb], da = delta_s[ra], db = delta_s[rb];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = nt * 8 + L::acc_col(lane, e);
          const index_t wc = win[c], cc = crd[c];
          recompute_p_ds<T>(s[nt][e], ds[nt][e], attends(wa, wc), bias_s, with_bias, ca, cc, p.window, rows, p.scale,
                            la, da);
          recompute_p_ds<T>(s[nt][2 + e], ds[nt][2 + e], attends(wb, wc), bias_s, with_bias, cb, cc, p.window, rows,
                            p.scale, lb, db);
        }
      }
      stage_acc<T, 8>(ps, LDP, r0, lane, s, 1.f);
      stage_acc<T, 8>(dss, LDP, r0, lane, ds, 1.f);
      if (want_dbias) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          const int c = nt * 8 + L::acc_col(lane, 0);
          dsf[ra * LDF + c] = ds[nt][0];
          dsf[ra * LDF + c + 1] = ds[nt][1];
          dsf[rb * LDF + c] = ds[nt][2];
          dsf[rb * LDF + c + 1] = ds[nt][3];
        }
      }
    }
    __syncthreads();  // P, dS of every warp visible; nobody reads V any more

    // ---- phase 2: dQ = scale dS K (query rows), dV = P^T dO (key rows) ---------------------------
    if (active) {
      float dq[DT][4];
      zero_acc(dq);
#pragma unroll
      for (int kc = 0; kc < 4; ++kc) {
        if (kc < KT) {
          unsigned a[4];
          L::acc_to_a(ds[2 * kc], ds[2 * kc + 1], a, [](float lo, float hi) { return M::pack(lo, hi); });
          unsigned at[4];
          ldmatrix_x4_trans(at, ps + (kc * 16 + L::at_ld_row(lane)) * LDP + r0 + L::at_ld_col(lane));
#pragma unroll
          for (int dp = 0; dp < DT / 2; ++dp) {  // pairs of output n-tiles: dims [16 dp, 16 dp + 16)
            unsigned bk[4], bo[4];
            ldmatrix_x4_trans(bk, ks + (kc * 16 + L::bv_ld_row(lane)) * LDS + dp * 16 + L::bv_ld_col(lane));
            ldmatrix_x4_trans(bo, dos + (kc * 16 + L::bv_ld_row(lane)) * LDS + dp * 16 + L::bv_ld_col(lane));
            M::run(dq[2 * dp], a, bk[0], bk[1]);
            M::run(dq[2 * dp + 1], a, bk[2], bk[3]);
            M::run(dv[2 * dp], at, bo[0], bo[1]);
            M::run(dv[2 * dp + 1], at, bo[2], bo[3]);
          }
        }
      }
      stage_acc<T, DT>(vs, LDS, r0, lane, dq, p.scale);  // the warp's own V rows (dead)
      __syncwarp();
      write_rows<T, D>(p.dq, vs, LDS, r0, lane, win, gather, b, h);
    }
#ifndef GREENMIM_TEST_DROP_BWD_PHASE_BARRIER  // test-only: racecheck must see this barrier's race
    __syncthreads();  // nobody reads K or P any more
#endif

    // ---- phase 3: dK = scale dS^T Q (key rows); dV and dK written ---------------------------------
    if (active) {
      stage_acc<T, DT>(ks, LDS, r0, lane, dv, 1.f);  // the warp's own K rows (dead)
      float dk[DT][4];
      zero_acc(dk);
#pragma unroll
      for (int kc = 0; kc < 4; ++kc) {
        if (kc < KT) {
          unsigned at[4];
          ldmatrix_x4_trans(at, dss + (kc * 16 + L::at_ld_row(lane)) * LDP + r0 + L::at_ld_col(lane));
#pragma unroll
          for (int dp = 0; dp < DT / 2; ++dp) {
            unsigned bq[4];
            ldmatrix_x4_trans(bq, qs + (kc * 16 + L::bv_ld_row(lane)) * LDS + dp * 16 + L::bv_ld_col(lane));
            M::run(dk[2 * dp], at, bq[0], bq[1]);
            M::run(dk[2 * dp + 1], at, bq[2], bq[3]);
          }
        }
      }
      stage_acc<T, DT>(ps, LDP, r0, lane, dk, p.scale);  // the warp's own P rows (dead)
      __syncwarp();
      write_rows<T, D>(p.dv, ks, LDS, r0, lane, win, gather, b, h);
      write_rows<T, D>(p.dk, ps, LDP, r0, lane, win, gather, b, h);
    }
  }

  // ---- d(bias): fp32 dS into per-warp table rows, then the CTA's partial -------------------------
  if (want_dbias) {
    __syncthreads();  // dsf complete (either path); the tiles are dead
    for (int i = threadIdx.x; i < C::WARPS * rows; i += C::THREADS) wbuf[i] = 0.f;
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int i = (warp & 1) * 32 + lane, j0 = (warp >> 1) * 32;
    dbias_add_row<LDF>(wbuf + warp * rows, dsf, i, win[i], crd[i], win, crd, j0, min(j0 + 32, G), p.window, rows);
    __syncthreads();
    const std::int64_t cta = static_cast<std::int64_t>(b) * p.part.num_groups + g;  // q_tiles = 1
    float* out = p.dbias_partial + (cta * p.heads + h) * rows;
    dbias_write_partial<C::THREADS>(out, wbuf, rows);
  }
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
