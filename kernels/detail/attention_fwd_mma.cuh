//! \file attention_fwd_mma.cuh
//! Private: the one-pass tensor-core forward (fp16/bf16, G <= 64, head_dim 32 or 64, sm_80+).
//! One CTA (4 warps) per (group, head, sample), or per (group, hpc heads, sample) in the
//! several-heads kernel. The group's Q, K, V rows are staged (zero rows for padding); warp w owns
//! query rows [16w, 16w + 16): S = Q K^T, scale, bias and mask, the row softmax in fp32
//! registers, O = P V, then O / l and lse. A non-finite V row sends the CTA down the exact
//! per-pair path (fallback.cuh).
#pragma once

#include <cstdint>

#include "attention_params.hpp"
#include "device_common.cuh"
#include "fallback.cuh"
#include "mask.cuh"
#include "mma_layout.hpp"
#include "softmax.cuh"
#include "tile_stage.cuh"
#include "warp_mma.cuh"

namespace greenmim {
namespace detail {
namespace cuda {

//! The one-pass row softmax and O = P V of one warp: from the masked scores `s` and the lane's
//! parts of their row maxima (ma, mb), the row maxima (quad max), P = exp(S - max) in place, the
//! row sums la, lb (quad sum) and O (KT 16-key chunks in use).
template <class T, int D, int LDS>
__device__ __forceinline__ void softmax_pv(float (&s)[8][4], float& ma, float& mb, float& la, float& lb,
                                           float (&o)[D / 8][4], const T* vs, int lane, int KT) {
  ma = quad_max(ma);
  mb = quad_max(mb);
  la = lb = 0.f;  // a padding row has base 0: every p is exp(-inf) = 0
  exp_scores<T>(s, softmax_base(ma), softmax_base(mb), la, lb);
  la = quad_sum(la);
  lb = quad_sum(lb);
  zero_acc(o);
  mma_pv<T, D / 8, LDS>(o, s, vs, lane, KT);
}

template <class T, int D>
__global__ void __launch_bounds__(mma_tile<D>::THREADS) attention_fwd_mma(const fwd_params<T> p) {
  using C = mma_tile<D>;
  constexpr int LDS = C::LDS, ROWS = C::ROWS, DT = D / 8;
  GM_DYNAMIC_SMEM(smem_f4);
  T* qs = reinterpret_cast<T*>(smem_f4);
  T* ks = qs + ROWS * LDS;
  T* vs = ks + ROWS * LDS;
  index_t* win = reinterpret_cast<index_t*>(vs + ROWS * LDS);
  index_t* crd = win + ROWS;
  float* bias_s = reinterpret_cast<float*>(crd + ROWS);

  const int G = p.part.group_size;  // <= 64 (checked by the launcher)
  const int g = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const std::int64_t base = static_cast<std::int64_t>(g) * G;
  const index_t* gather = p.part.gather + base;
  const index_t N = p.part.num_tokens;

  stage_slots<C::THREADS>(p.part, base, ROWS, win, crd);
  stage_bias_column<C::THREADS>(p.bias, h, bias_s);
  // no barrier yet: the rows' tokens are checked from global memory, as stage_slots does
  const bool finite = stage_qkv<T, D, ROWS, C::THREADS, LDS>(qs, ks, vs, p, gather, G, [&](int r, index_t t) {
    const index_t sw = p.part.slot_window[base + r];
    return sw >= 0 && t >= 0 && t < N;
  }, b, h);
  if (!__syncthreads_and(finite)) {
    group_exact_fwd<T, D, LDS>(p, qs, ks, vs, win, crd, bias_s, gather, G, h, b);
    return;
  }

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r0 = warp * 16;
  if (r0 >= G) return;  // no query row of this warp is in the group (no barrier follows)
  namespace L = mma_layout;

  float s[8][4];
  mma_scores<T, D, LDS>(s, qs, ks, r0, lane, (G + 7) / 8);

  const int ra = r0 + L::acc_row(lane, 0), rb = r0 + L::acc_row(lane, 2);  // the lane's two rows
  const index_t wa = win[ra], wb = win[rb];
  float ma, mb;
  mask_scores(s, ma, mb, win, crd, 0, ROWS, wa, wb, crd[ra], crd[rb], bias_s, p.bias.data != nullptr, p.bias.rows,
              p.scale, p.window, lane);
  float la, lb, o[DT][4];
  softmax_pv<T, D, LDS>(s, ma, mb, la, lb, o, vs, lane, (G + 15) / 16);
  write_fwd_rows<T, D, LDS>(
      p, qs, o, ma, mb, la, lb, [&](index_t& x, index_t& y) { x = wa, y = wb; }, win, gather, r0, lane, b, h);
}

//! Resident CTAs per SM the several-heads kernel is compiled for: those of the one-head kernel at
//! head_dim 32 on sm_90 (8), so that sharing the head-independent work costs no occupancy; 7 on
//! sm_80, where 8 would spill. Head_dim 64 keeps the one-head kernel (this one would spill at its
//! 6 CTAs per SM). Figures: docs/perf/kernel-journal.md.
constexpr int fwd_heads_min_ctas() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  return 7;
#else
  return 8;
#endif
}

//! Several heads per CTA: the one-head kernel's tile and arithmetic for heads [blockIdx.y * hpc,
//! + hpc) of one (group, sample) in turn, bitwise the same result per head. What does not depend
//! on the head is done once per CTA: the slot ids and coordinates, and each lane's mask and bias
//! row of its 32 accumulator elements (`pair_code`, int16 in shared memory, read back only by the
//! lane that wrote it: no barrier).
template <class T, int D>
__global__ void __launch_bounds__(mma_tile<D>::THREADS, fwd_heads_min_ctas())
    attention_fwd_mma_heads(const fwd_params<T> p, const int hpc) {
  using C = mma_tile<D>;
  constexpr int LDS = C::LDS, ROWS = C::ROWS, DT = D / 8;
  GM_DYNAMIC_SMEM(smem_f4);
  T* qs = reinterpret_cast<T*>(smem_f4);
  T* ks = qs + ROWS * LDS;
  T* vs = ks + ROWS * LDS;
  std::int16_t* codes = reinterpret_cast<std::int16_t*>(vs + ROWS * LDS);
  index_t* win = reinterpret_cast<index_t*>(codes + C::CODES);
  index_t* crd = win + ROWS;
  float* bias_s = reinterpret_cast<float*>(crd + ROWS);  // [hpc][rows]

  const int G = p.part.group_size;  // <= 64 (checked by the launcher)
  const int g = blockIdx.x, b = blockIdx.z;
  const int h0 = static_cast<int>(blockIdx.y) * hpc;
  const int nh = p.heads - h0 < hpc ? p.heads - h0 : hpc;
  const std::int64_t base = static_cast<std::int64_t>(g) * G;
  const index_t* gather = p.part.gather + base;
  const bool with_bias = p.bias.data != nullptr;
  const int brows = p.bias.rows;

  // ---- once per CTA: slot ids, bias columns, each lane's pair codes ----------------------------
  stage_slots<C::THREADS>(p.part, base, ROWS, win, crd);
  if (with_bias)
    for (int x = threadIdx.x; x < nh * brows; x += C::THREADS) {
      const int j = x / brows, r = x - j * brows;
      bias_s[x] = __ldg(p.bias.data + r * p.bias.s0 + (h0 + j) * p.bias.s1);
    }
  __syncthreads();  // win, crd, bias_s

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r0 = warp * 16;
  const bool has_rows = r0 < G;  // else this warp only helps loading (and meets the barriers)
  namespace L = mma_layout;
  const int ra = r0 + L::acc_row(lane, 0), rb = r0 + L::acc_row(lane, 2);  // the lane's two rows
  std::int16_t* my_codes = codes + warp * 16 * ROWS;  // element ((nt*2 + e)*2 + row)*32 + lane
  if (has_rows) {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int c = nt * 8 + L::acc_col(lane, e);
        my_codes[((nt * 2 + e) * 2 + 0) * 32 + lane] =
            static_cast<std::int16_t>(pair_code(win[ra], win[c], crd[ra], crd[c], with_bias, p.window, brows));
        my_codes[((nt * 2 + e) * 2 + 1) * 32 + lane] =
            static_cast<std::int16_t>(pair_code(win[rb], win[c], crd[rb], crd[c], with_bias, p.window, brows));
      }
    }
  }

  for (int j = 0; j < nh; ++j) {
    const int h = h0 + j;
    const float* bias_h = bias_s + j * brows;
    if (j > 0) __syncthreads();  // every warp is done with the previous head's Q, K, V tiles
    // a real slot's token was checked against N by stage_slots
    const bool finite = stage_qkv<T, D, ROWS, C::THREADS, LDS>(
        qs, ks, vs, p, gather, G, [&](int r, index_t) { return win[r] >= 0; }, b, h);
    if (!__syncthreads_and(finite)) {  // CTA-uniform
      group_exact_fwd<T, D, LDS>(p, qs, ks, vs, win, crd, bias_h, gather, G, h, b);
      continue;
    }
    if (!has_rows) continue;

    float s[8][4];
    mma_scores<T, D, LDS>(s, qs, ks, r0, lane, (G + 7) / 8);
    float ma = -INFINITY, mb = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int code_a = my_codes[((nt * 2 + e) * 2 + 0) * 32 + lane];
        const int code_b = my_codes[((nt * 2 + e) * 2 + 1) * 32 + lane];
        const float va = code_a != k_code_masked ? s[nt][e] * p.scale + code_bias(code_a, bias_h, with_bias) : -INFINITY;
        const float vb =
            code_b != k_code_masked ? s[nt][2 + e] * p.scale + code_bias(code_b, bias_h, with_bias) : -INFINITY;
        s[nt][e] = va;
        s[nt][2 + e] = vb;
        ma = fmaxf(ma, va);
        mb = fmaxf(mb, vb);
      }
    }
    float la, lb, o[DT][4];
    softmax_pv<T, D, LDS>(s, ma, mb, la, lb, o, vs, lane, (G + 15) / 16);
    write_fwd_rows<T, D, LDS>(
        p, qs, o, ma, mb, la, lb, [&](index_t& x, index_t& y) { x = win[ra], y = win[rb]; }, win, gather, r0, lane, b,
        h);
  }
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
