//! \file warp_mma.cuh
//! Private: the two warp-level products of the tensor-core forward on staged 16-bit tiles, in the
//! mma.sync accumulator layout (mma_layout.hpp): S = Q K^T of 16 query rows, and O += P V with P
//! taken straight from the score accumulators.
#pragma once

#include "mma_layout.hpp"
#include "mma_ptx.cuh"

namespace greenmim {
namespace detail {
namespace cuda {

//! S = Q K^T of one warp: query rows [r0, r0 + 16) of `qs` against keys [0, 8 NT) of `ks` (NT <= 8
//! n-tiles; rows of LDS elements), ldmatrix + mma.
template <class T, int D, int LDS>
__device__ __forceinline__ void mma_scores(float (&s)[8][4], const T* qs, const T* ks, int r0, int lane, int NT) {
  using M = mma16<T>;
  namespace L = mma_layout;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    unsigned a[4];
    ldmatrix_x4(a, qs + (r0 + L::a_ld_row(lane)) * LDS + kk * 16 + L::a_ld_col(lane));
#pragma unroll
    for (int np = 0; np < 4; ++np) {  // pairs of key n-tiles: keys [16 np, 16 np + 16)
      if (2 * np < NT) {
        unsigned bk[4];
        ldmatrix_x4(bk, ks + (np * 16 + L::bk_ld_row(lane)) * LDS + kk * 16 + L::bk_ld_col(lane));
        M::run(s[2 * np], a, bk[0], bk[1]);
        if (2 * np + 1 < NT) M::run(s[2 * np + 1], a, bk[2], bk[3]);
      }
    }
  }
}

//! O += P V of one warp: P = the 16-bit packed accumulators `s` (keys [0, 16 KT), KT <= 4), V the
//! staged rows of `vs` (ldmatrix.trans), O in the accumulator layout (DT = head_dim / 8 n-tiles).
template <class T, int DT, int LDS>
__device__ __forceinline__ void mma_pv(float (&o)[DT][4], const float (&s)[8][4], const T* vs, int lane, int KT) {
  using M = mma16<T>;
  namespace L = mma_layout;
#pragma unroll
  for (int kc = 0; kc < 4; ++kc) {
    if (kc < KT) {
      unsigned a[4];
      L::acc_to_a(s[2 * kc], s[2 * kc + 1], a, [](float lo, float hi) { return M::pack(lo, hi); });
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {  // pairs of output n-tiles: dims [16 dp, 16 dp + 16)
        unsigned bv[4];
        ldmatrix_x4_trans(bv, vs + (kc * 16 + L::bv_ld_row(lane)) * LDS + dp * 16 + L::bv_ld_col(lane));
        M::run(o[2 * dp], a, bv[0], bv[1]);
        M::run(o[2 * dp + 1], a, bv[2], bv[3]);
      }
    }
  }
}

//! Two products of one warp against the rows [c0, c0 + 16 NP) of two staged tiles at once (the
//! backward's S = Q K^T with dP = dO V^T, or S^T = K Q^T with dP^T = V dO^T): s += A1 B1^T and
//! t += A2 B2^T for the warp's rows [r0, r0 + 16) of a1, a2; n-tiles from NT on are skipped.
template <class T, int D, int LDS, int NP>
__device__ __forceinline__ void mma_two_products(float (&s)[2 * NP][4], float (&t)[2 * NP][4], const T* a1,
                                                 const T* a2, const T* b1, const T* b2, int r0, int c0, int lane,
                                                 int NT) {
  using M = mma16<T>;
  namespace L = mma_layout;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    unsigned x1[4], x2[4];
    ldmatrix_x4(x1, a1 + (r0 + L::a_ld_row(lane)) * LDS + kk * 16 + L::a_ld_col(lane));
    ldmatrix_x4(x2, a2 + (r0 + L::a_ld_row(lane)) * LDS + kk * 16 + L::a_ld_col(lane));
#pragma unroll
    for (int np = 0; np < NP; ++np) {  // pairs of n-tiles: rows c0 + [16 np, 16 np + 16)
      if (2 * np < NT) {
        unsigned y1[4], y2[4];
        ldmatrix_x4(y1, b1 + (c0 + np * 16 + L::bk_ld_row(lane)) * LDS + kk * 16 + L::bk_ld_col(lane));
        ldmatrix_x4(y2, b2 + (c0 + np * 16 + L::bk_ld_row(lane)) * LDS + kk * 16 + L::bk_ld_col(lane));
        M::run(s[2 * np], x1, y1[0], y1[1]);
        M::run(t[2 * np], x2, y2[0], y2[1]);
        if (2 * np + 1 < NT) {
          M::run(s[2 * np + 1], x1, y1[2], y1[3]);
          M::run(t[2 * np + 1], x2, y2[2], y2[3]);
        }
      }
    }
  }
}

//! Zeroes an accumulator block.
template <int DT>
__device__ __forceinline__ void zero_acc(float (&o)[DT][4]) {
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
