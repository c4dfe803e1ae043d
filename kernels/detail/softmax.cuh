//! \file softmax.cuh
//! Private: the row softmax of the attention kernels in fp32: the exponential per element type,
//! quad reductions of the tensor-core accumulator rows, P = exp(S - base), and the online
//! (running maximum) update of one score.
#pragma once

#include "device_common.cuh"
#include "mask.cuh"

namespace greenmim {
namespace detail {
namespace cuda {

//! exp for softmax in element type T: the accurate expf for fp32 (fp32 promises 1e-5 against the
//! reference, and __expf's 2 + 1.17|x| ulp would spend much of that margin before the backward's
//! cancellations), the fast __expf for fp16/bf16, whose storage rounding dwarfs it. The forward's
//! lse and the backward's recomputed P use the same one.
template <class T>
__device__ __forceinline__ float softmax_exp(float x) { return __expf(x); }
template <>
__device__ __forceinline__ float softmax_exp<float>(float x) { return expf(x); }

//! Max / sum over the 4 lanes (a quad) that hold one accumulator row, fixed order.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(full_mask, v, 1));
  return fmaxf(v, __shfl_xor_sync(full_mask, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(full_mask, v, 1);
  return v + __shfl_xor_sync(full_mask, v, 2);
}

//! The softmax base of a row with running maximum m: m, or 0 when the row has no attending key
//! (yet): every p is then exp(-inf) = 0 instead of exp(-inf - -inf) = NaN.
__device__ __forceinline__ float softmax_base(float m) { return m == -INFINITY ? 0.f : m; }

//! P = exp(S - base) in place for the lane's two accumulator rows (a: elements 0, 1; b: 2, 3),
//! added to the lane's partial row sums la, lb (not yet summed over the quad).
template <class T>
__device__ __forceinline__ void exp_scores(float (&s)[8][4], float ba, float bb, float& la, float& lb) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      s[nt][e] = softmax_exp<T>(s[nt][e] - ba);
      s[nt][2 + e] = softmax_exp<T>(s[nt][2 + e] - bb);
      la += s[nt][e];
      lb += s[nt][2 + e];
    }
  }
}

//! Multiplies the lane's accumulator rows: row a (elements 0, 1) by fa, row b (2, 3) by fb.
template <int DT>
__device__ __forceinline__ void scale_rows(float (&o)[DT][4], float fa, float fb) {
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) {
    o[dt][0] *= fa;
    o[dt][1] *= fa;
    o[dt][2] *= fb;
    o[dt][3] *= fb;
  }
}

//! Online softmax, one attending score `sc` of a row with running maximum m, sum l and output
//! accumulators acc: rescales l and acc when sc raises the maximum, returns p = exp(sc - m) (0
//! for -inf) and adds it to l; the caller adds p * v to acc. A NaN score never raises m (the
//! comparison is false), so p, l and acc become NaN, as they must.
template <class T, int E>
__device__ __forceinline__ float online_softmax_add(float sc, float& m, float& l, float (&acc)[E]) {
  if (sc > m) {
    const float c = softmax_exp<T>(m - sc);
    l *= c;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] *= c;
    m = sc;
  }
  const float pr = sc == -INFINITY ? 0.f : softmax_exp<T>(sc - m);
  l += pr;
  return pr;
}

//! The backward's recomputed softmax of one pair, in place: s (the q.k score) becomes
//! p = exp(scale s + bias - lse) and dp (the dO.v product) becomes ds = p (dp - delta), where the
//! pair attends; both become exactly 0 where it does not (selected, never multiplied).
template <class T>
__device__ __forceinline__ void recompute_p_ds(float& s, float& dp, bool att, const float* bias_s, bool with_bias,
                                               index_t cq, index_t ck, int window, int rows, float scale, float lse,
                                               float delta) {
  float pr = 0.f, ds = 0.f;
  if (att) {
    const float bias = staged_bias(bias_s, with_bias, cq, ck, window, rows);
    pr = softmax_exp<T>(s * scale + bias - lse);
    ds = pr * (dp - delta);
  }
  s = pr;
  dp = ds;
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
