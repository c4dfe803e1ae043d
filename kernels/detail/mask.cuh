//! \file mask.cuh
//! Private: the block-diagonal mask and the relative-position bias of a score, for every
//! attention kernel. A pair attends iff both slots are real tokens of one window (geometry.hpp's
//! `attends`); every other pair is skipped or SELECTED away (never multiplied by a zero), so no
//! value of another window, not a NaN, reaches a row. A relative position outside the bias table
//! (a partition that does not match `window`) gives a NaN bias: visible, never an out-of-bounds
//! read.
#pragma once

#include <cstdint>

#include "device_common.cuh"
#include "mma_layout.hpp"

namespace greenmim {
namespace detail {
namespace cuda {

//! Relative-position bucket of the pair (query coord cq, key coord ck), or -1 outside the table.
__device__ __forceinline__ int pair_bucket(index_t cq, index_t ck, int window, int rows) {
  const index_t r = rel_pos_index(coord_h(cq), coord_w(cq), coord_h(ck), coord_w(ck), window);
  return static_cast<unsigned>(r) < static_cast<unsigned>(rows) ? r : -1;
}

//! Bias of the pair for head h read from the table in global memory; zero without a table.
__device__ __forceinline__ float pair_bias(const float* __restrict__ table, std::int64_t s0, std::int64_t s1,
                                           int rows, int h, index_t cq, index_t ck, int window) {
  if (table == nullptr) return 0.f;
  const index_t r = rel_pos_index(coord_h(cq), coord_w(cq), coord_h(ck), coord_w(ck), window);
  return static_cast<unsigned>(r) < static_cast<unsigned>(rows) ? __ldg(table + r * s0 + h * s1) : __int_as_float(0x7fc00000);
}

//! Bias of the pair from the head's column staged in shared memory; zero without a table.
__device__ __forceinline__ float staged_bias(const float* bias_s, bool with_bias, index_t cq, index_t ck, int window,
                                             int rows) {
  if (!with_bias) return 0.f;
  const int r = pair_bucket(cq, ck, window, rows);
  return r >= 0 ? bias_s[r] : __int_as_float(0x7fc00000);
}

//! Scale, bias and mask of one warp's 16 x 64 score tile (accumulator layout), in place: key
//! column c is slot x0 + c, padding from slot `xend` on; the lane's rows lie in windows wa, wb at
//! coordinates ca, cb. Masked pairs become -inf. Returns the lane's part of each row's maximum
//! (fmaxf drops NaN: a NaN score still yields a NaN probability).
__device__ __forceinline__ void mask_scores(float (&s)[8][4], float& ma, float& mb, const index_t* win, const index_t* crd,
                                            int x0, int xend, index_t wa, index_t wb, index_t ca, index_t cb,
                                            const float* bias_s, bool with_bias, int rows, float scale, int window,
                                            int lane) {
  namespace L = mma_layout;
  ma = mb = -INFINITY;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int x = x0 + nt * 8 + L::acc_col(lane, e);
      const index_t wc = x < xend ? win[x] : pad_index, cc = x < xend ? crd[x] : 0;
      float va = -INFINITY, vb = -INFINITY;
      if (attends(wa, wc)) va = s[nt][e] * scale + staged_bias(bias_s, with_bias, ca, cc, window, rows);
      if (attends(wb, wc)) vb = s[nt][2 + e] * scale + staged_bias(bias_s, with_bias, cb, cc, window, rows);
      s[nt][e] = va;
      s[nt][2 + e] = vb;
      ma = fmaxf(ma, va);
      mb = fmaxf(mb, vb);
    }
  }
}

//! The mask and bias row of a pair as one code (the several-heads forward computes them once per
//! CTA): -1 masked, -2 attending with a bucket outside the table (NaN bias), else the bias row
//! (0 without a table).
constexpr int k_code_masked = -1, k_code_nan = -2;
__device__ __forceinline__ int pair_code(index_t wq, index_t wk, index_t cq, index_t ck, bool with_bias, int window,
                                         int rows) {
  if (!attends(wq, wk)) return k_code_masked;
  if (!with_bias) return 0;
  const int r = pair_bucket(cq, ck, window, rows);
  return r >= 0 ? r : k_code_nan;
}
//! The bias of a pair with code `code` (not k_code_masked) from the head's staged column.
__device__ __forceinline__ float code_bias(int code, const float* bias_s, bool with_bias) {
  return code >= 0 ? (with_bias ? bias_s[code] : 0.f) : __int_as_float(0x7fc00000);
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
