//! \file attention_fwd_mma_tiled.cuh
//! Private: tensor-core (mma.sync m16n8k16, fp16/bf16 in, fp32 accumulate) forward of group
//! window attention for 64 < G <= 256 (window 14: 196 tokens; Swin V2's windows 12 and 16: 144
//! and 256), head_dim 32 or 64, FlashAttention-2 style. sm_80+.
//!
//! One CTA (4 warps) per (64-slot query tile, group, head, sample): grid (n_g * q_tiles, heads,
//! B), as the SIMT forward and the tiled backward. The prologue is the tiled backward's
//! (`bwd_tiled_prologue`: slot ids and coordinates of the whole group, the head's bias column,
//! and the union [klo, khi) of the window ranges of the tile's rows); the tile's Q rows and then,
//! 64 slots at a time, the K and V rows of [klo, khi) are staged with the backward's
//! `bwd_stage_tile` (16-byte loads through `gather`; padding slots and slots beyond khi are zero
//! rows). Warp w owns query rows [16w, 16w + 16) of the tile; per key tile: S = Q K^T (ldmatrix +
//! mma), scale, bias and the exact block-diagonal mask (pairs of other windows and padding are
//! SELECTED to -inf, as in the one-pass kernel), then the online softmax in fp32 registers: the
//! running row max m (quad shuffles), the correction exp(m_old - m_new) applied to the lane's
//! partial row sums l and to the O accumulators, P = exp(S - m) packed to 16 bit straight from
//! the accumulator layout into A fragments, O += P V (ldmatrix.trans for V). After the last key
//! tile: l summed over the quad, O / l staged through the warp's own Q rows and written once with
//! 16-byte stores (padding rows never), lse = m + log(l) when requested (the one-pass kernel's
//! convention). Registers: O (D/2 floats per lane), S (32), m and l of the lane's two rows.
//!
//! Exactness: a masked probability is exactly 0, and 0 * v = 0 for finite v. When the staged V
//! tile holds a non-finite real row (0 * Inf = NaN would leak across windows; K and Q cannot leak:
//! a non-finite K column or Q row only reaches scores that the mask selects away, or its own
//! window's), that tile's P V is accumulated by an exact per-pair loop instead (`fwd_tile_exact`:
//! the quad's fp32 probabilities by shuffles, attending pairs only) into the same registers. The
//! test is one flag per tile (__syncthreads_and). Shared memory: Q, K, V tiles, the group's slot
//! ids and coordinates (256 each) and the bias column: 45.6 KB at head_dim 64 and window 32, so
//! every window <= 32 fits the default 48 KB.
#pragma once

#include <climits>
#include <cstdint>

#include "attention_bwd_mma_tiled.cuh"
#include "attention_mma.cuh"

namespace greenmim {
namespace detail {
namespace cuda {

template <int D>
struct mma_fwd_tiled {
  using C = mma_bwd_tiled<D>;  // the staging helpers' tile: 64 rows, 128 threads, rows of D + 8
  static constexpr int ROWS = C::ROWS, MAXG = C::MAXG, THREADS = C::THREADS, LDS = C::LDS;
  static constexpr std::size_t smem(int bias_rows) {
    return 3u * ROWS * LDS * 2u + 2u * MAXG * sizeof(index_t) + static_cast<std::size_t>(bias_rows) * sizeof(float);
  }
};

//! O += P V of one key tile over attending pairs only (the tile's V holds a non-finite row).
//! `s` are the lane's fp32 probabilities (rows ra / rb = the lane's accumulator rows, keys of the
//! tile in the accumulator layout), `kn` the keys in use; warp-uniform loops (shuffles).
template <class T, int DT, int LDS>
__device__ __forceinline__ void fwd_tile_exact(float (&o)[DT][4], const float (&s)[8][4], const T* vs,
                                              const index_t* win, int k0, int kn, index_t wa, index_t wb, int lane) {
  namespace L = mma_layout;
  const int quad = lane & ~3;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    if (nt * 8 >= kn) break;
    for (int j = 0; j < 4; ++j) {  // the quad's lane j holds keys nt * 8 + 2j, + 1
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float pa = __shfl_sync(full_mask, s[nt][e], quad + j);
        const float pb = __shfl_sync(full_mask, s[nt][2 + e], quad + j);
        const int c = nt * 8 + 2 * j + e;
        if (c >= kn) continue;
        const index_t wc = win[k0 + c];
        const T* vr = vs + c * LDS;
        const bool att_a = attends(wa, wc), att_b = attends(wb, wc);
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          const int d = dt * 8 + L::acc_col(lane, 0);
          const float v0 = to_float(vr[d]), v1 = to_float(vr[d + 1]);
          if (att_a) {
            o[dt][0] = fmaf(pa, v0, o[dt][0]);
            o[dt][1] = fmaf(pa, v1, o[dt][1]);
          }
          if (att_b) {
            o[dt][2] = fmaf(pb, v0, o[dt][2]);
            o[dt][3] = fmaf(pb, v1, o[dt][3]);
          }
        }
      }
    }
  }
}

//! Multiplies the accumulator rows of the lane: row a (elements 0, 1) by fa, row b (2, 3) by fb.
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

template <class T, int D>
__global__ void __launch_bounds__(mma_fwd_tiled<D>::THREADS) attention_fwd_mma_tiled(const fwd_params<T> p) {
  using C = mma_fwd_tiled<D>;
  namespace L = mma_layout;
  constexpr int LDS = C::LDS, ROWS = C::ROWS;
  constexpr int DT = D / 8;
  GM_DYNAMIC_SMEM(smem_f4);
  T* qs = reinterpret_cast<T*>(smem_f4);
  T* ks = qs + ROWS * LDS;
  T* vs = ks + ROWS * LDS;
  index_t* win = reinterpret_cast<index_t*>(vs + ROWS * LDS);
  index_t* crd = win + C::MAXG;
  float* bias_s = reinterpret_cast<float*>(crd + C::MAXG);
  __shared__ int range[2];

  const int G = p.part.group_size;  // in (64, 256] (checked by the launcher)
  const int tile = blockIdx.x % p.q_tiles, g = blockIdx.x / p.q_tiles;
  const int h = blockIdx.y, b = blockIdx.z;
  const int q0 = tile * ROWS;
  const std::int64_t base = static_cast<std::int64_t>(g) * G;
  const index_t* gather = p.part.gather + base;

  {  // the backward's prologue reads only the partition and the bias table
    bwd_params<T> bp;
    bp.part = p.part;
    bp.bias = p.bias;
    bwd_tiled_prologue<T, D>(bp, base, q0, win, crd, bias_s, range, h);
  }
  bwd_stage_tile<T, D>(qs, p.q, gather, win, q0, G, b, h);  // a non-finite Q row stays in its row

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r0 = warp * 16;
  const bool active = q0 + r0 < G;
  const int ra = r0 + L::acc_row(lane, 0), rb = r0 + L::acc_row(lane, 2);  // local rows
  const index_t wa = win[q0 + ra], wb = win[q0 + rb];  // pad_index beyond G (prologue)
  const index_t ca = crd[q0 + ra], cb = crd[q0 + rb];
  float o[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  float ma = -INFINITY, mb = -INFINITY;  // running row maxima (quad-uniform)
  float la = 0.f, lb = 0.f;              // the lane's partial row sums
  const int klo = range[0], khi = range[1];

  for (int k0 = klo; k0 < khi; k0 += ROWS) {
    bwd_stage_tile<T, D>(ks, p.k, gather, win, k0, khi, b, h);
    const bool finite = bwd_stage_tile<T, D>(vs, p.v, gather, win, k0, khi, b, h);
    const bool tile_finite = __syncthreads_and(finite);  // also: Q staged (first tile)
    if (active) {
      const int kn = min(ROWS, khi - k0);  // keys in use

      // ---- S = Q K^T ------------------------------------------------------------------------------
      float s[8][4];
      mma_scores<T, D, LDS>(s, qs, ks, r0, lane, (kn + 7) / 8);

      // ---- scale, bias, exact mask; the tile's row maxima -------------------------------------------
      float ta, tb;
      mask_scores(s, ta, tb, win, crd, k0, khi, wa, wb, ca, cb, p.bias, bias_s, p.scale, p.window, lane);
      ta = quad_max(ta);
      tb = quad_max(tb);

      // ---- online softmax: rescale l and O by exp(m_old - m_new), P = exp(S - m_new) ------------------
      const float na = fmaxf(ma, ta), nb = fmaxf(mb, tb);
      const float ba = softmax_base(na), bb = softmax_base(nb);  // no attending key yet: p = 0
      const float fa = softmax_exp<T>(ma - ba), fb = softmax_exp<T>(mb - bb);
      ma = na;
      mb = nb;
      la *= fa;
      lb *= fb;
      scale_rows(o, fa, fb);
      exp_scores<T>(s, ba, bb, la, lb);

      // ---- O += P V -----------------------------------------------------------------------------------
      if (tile_finite) mma_pv<T, DT, LDS>(o, s, vs, lane, (kn + 15) / 16);
      else fwd_tile_exact<T, DT, LDS>(o, s, vs, win, k0, kn, wa, wb, lane);
    }
    __syncthreads();  // before the next tile overwrites K and V
  }

  __syncthreads();  // (no key tile at all: the staging of Q is still ordered before the epilogue)
  if (!active) return;
  // ---- epilogue: O / l through the warp's own Q rows (read by this warp only), lse ----------------------
  la = quad_sum(la);
  lb = quad_sum(lb);
  scale_rows(o, 1.f / la, 1.f / lb);
  bwd_stage_acc<T, DT>(qs, LDS, r0, lane, o, 1.f);
  if (L::tig(lane) == 0 && p.lse.data != nullptr) {
    if (wa >= 0) *p.lse.at(b, gather[q0 + ra], h) = ma + logf(la);
    if (wb >= 0) *p.lse.at(b, gather[q0 + rb], h) = mb + logf(lb);
  }
  __syncwarp();
  bwd_write_rows<T, D>(p.o, qs, LDS, r0, lane, win + q0, gather + q0, b, h);
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
