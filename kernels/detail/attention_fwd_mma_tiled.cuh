//! \file attention_fwd_mma_tiled.cuh
//! Private: the tiled tensor-core forward (fp16/bf16, 64 < G <= GM_MMA_MAX_GROUP, head_dim 32 or
//! 64, sm_80+), FlashAttention-2 style. One CTA (4 warps) per (64-slot query tile, group, head,
//! sample). The tile's Q rows stay staged; the K and V rows of the slots its rows attend (the
//! union of their window ranges) are staged 64 at a time. Per key tile, warp w (query rows
//! [16w, 16w + 16)): S = Q K^T, scale, bias and mask, the online softmax (running row maximum,
//! l and O rescaled by exp(m_old - m_new)), O += P V. A key tile whose V holds a non-finite real
//! row is accumulated pair by pair instead (fallback.cuh). Shared memory fits the default 48 KB
//! for every window <= GM_MAX_WINDOW.
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

template <class T, int D>
__global__ void __launch_bounds__(mma_tile<D>::THREADS) attention_fwd_mma_tiled(const fwd_params<T> p) {
  using C = mma_tile<D>;
  namespace L = mma_layout;
  constexpr int LDS = C::LDS, ROWS = C::ROWS, THREADS = C::THREADS, DT = D / 8;
  GM_DYNAMIC_SMEM(smem_f4);
  T* qs = reinterpret_cast<T*>(smem_f4);
  T* ks = qs + ROWS * LDS;
  T* vs = ks + ROWS * LDS;
  index_t* win = reinterpret_cast<index_t*>(vs + ROWS * LDS);
  index_t* crd = win + C::MAXG;
  float* bias_s = reinterpret_cast<float*>(crd + C::MAXG);
  __shared__ int range[2];

  const int G = p.part.group_size;  // in (64, GM_MMA_MAX_GROUP] (checked by the launcher)
  const int tile = blockIdx.x % p.q_tiles, g = blockIdx.x / p.q_tiles;
  const int h = blockIdx.y, b = blockIdx.z;
  const int q0 = tile * ROWS;
  const std::int64_t base = static_cast<std::int64_t>(g) * G;
  const index_t* gather = p.part.gather + base;

  stage_group_range<THREADS, ROWS, C::MAXG>(p.part, p.bias, base, q0, h, win, crd, bias_s, range);
  stage_rows16<T, D, ROWS, THREADS, LDS>(qs, p.q, gather, win, q0, G, b, h);  // a non-finite Q row stays in its row

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r0 = warp * 16;
  const bool active = q0 + r0 < G;
  const int ra = r0 + L::acc_row(lane, 0), rb = r0 + L::acc_row(lane, 2);  // local rows
  const index_t wa = win[q0 + ra], wb = win[q0 + rb];  // pad_index beyond G (prologue)
  const index_t ca = crd[q0 + ra], cb = crd[q0 + rb];
  const bool with_bias = p.bias.data != nullptr;
  float o[DT][4];
  zero_acc(o);
  float ma = -INFINITY, mb = -INFINITY;  // running row maxima (quad-uniform)
  float la = 0.f, lb = 0.f;              // the lane's partial row sums
  const int klo = range[0], khi = range[1];

  for (int k0 = klo; k0 < khi; k0 += ROWS) {
    stage_rows16<T, D, ROWS, THREADS, LDS>(ks, p.k, gather, win, k0, khi, b, h);
    const bool finite = stage_rows16<T, D, ROWS, THREADS, LDS>(vs, p.v, gather, win, k0, khi, b, h);
    const bool tile_finite = __syncthreads_and(finite);  // also: Q staged (first tile)
    if (active) {
      const int kn = min(ROWS, khi - k0);  // keys in use
      float s[8][4];
      mma_scores<T, D, LDS>(s, qs, ks, r0, lane, (kn + 7) / 8);
      float ta, tb;  // the tile's row maxima
      mask_scores(s, ta, tb, win, crd, k0, khi, wa, wb, ca, cb, bias_s, with_bias, p.bias.rows, p.scale, p.window,
                  lane);
      ta = quad_max(ta);
      tb = quad_max(tb);
      // online softmax: rescale l and O by exp(m_old - m_new), P = exp(S - m_new)
      const float na = fmaxf(ma, ta), nb = fmaxf(mb, tb);
      const float ba = softmax_base(na), bb = softmax_base(nb);  // no attending key yet: p = 0
      const float fa = softmax_exp<T>(ma - ba), fb = softmax_exp<T>(mb - bb);
      ma = na;
      mb = nb;
      la *= fa;
      lb *= fb;
      scale_rows(o, fa, fb);
      exp_scores<T>(s, ba, bb, la, lb);
      if (tile_finite) mma_pv<T, DT, LDS>(o, s, vs, lane, (kn + 15) / 16);
      else tile_exact_pv<T, DT, LDS>(o, s, vs, win, k0, kn, wa, wb, lane);
    }
    __syncthreads();  // before the next tile overwrites K and V
  }

  __syncthreads();  // (no key tile at all: the staging of Q is still ordered before the epilogue)
  if (!active) return;
  write_fwd_rows<T, D, LDS>(
      p, qs, o, ma, mb, quad_sum(la), quad_sum(lb), [&](index_t& x, index_t& y) { x = wa, y = wb; }, win + q0,
      gather + q0, r0, lane, b, h);
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
