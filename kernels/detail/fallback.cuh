//! \file fallback.cuh
//! Private: the exact per-pair paths of the tensor-core kernels. A masked probability is exactly 0
//! and 0 * x = 0 for finite x, so the tensor-core products are exact across windows; when an
//! operand multiplied by masked zeros holds a non-finite real row (0 * Inf = NaN would leak into
//! other windows), the kernels switch (one CTA-wide flag) to these loops, which visit attending
//! pairs only, over the same staged tiles.
#pragma once

#include <cstdint>

#include "attention_params.hpp"
#include "device_common.cuh"
#include "mask.cuh"
#include "mma_layout.hpp"
#include "softmax.cuh"

namespace greenmim {
namespace detail {
namespace cuda {

//! One-pass forward of a whole group (a non-finite V row): 2 threads per query row, each producing
//! half of the row's head_dim outputs, online softmax over the attending keys. Writes o and lse
//! of every real row.
template <class T, int D, int LDS>
__device__ __forceinline__ void group_exact_fwd(const fwd_params<T>& p, const T* qs, const T* ks, const T* vs,
                                                const index_t* win, const index_t* crd, const float* bias_s,
                                                const index_t* gather, int G, int h, int b) {
  constexpr int HALF = D / 2;
  const int i = threadIdx.x >> 1, part = threadIdx.x & 1;
  if (i >= G || win[i] < 0) return;
  const index_t wi = win[i];
  const bool with_bias = p.bias.data != nullptr;
  float acc[HALF];
#pragma unroll
  for (int e = 0; e < HALF; ++e) acc[e] = 0.f;
  float m = -INFINITY, l = 0.f;
  for (int x = 0; x < G; ++x) {
    if (!attends(wi, win[x])) continue;
    float d = 0.f;
    for (int e = 0; e < D; ++e) d = fmaf(to_float(qs[i * LDS + e]), to_float(ks[x * LDS + e]), d);
    float sc = d * p.scale;
    if (with_bias) {
      const int r = pair_bucket(crd[i], crd[x], p.window, p.bias.rows);
      sc += r >= 0 ? bias_s[r] : __int_as_float(0x7fc00000);
    }
    const float pr = online_softmax_add<T>(sc, m, l, acc);
#pragma unroll
    for (int e = 0; e < HALF; ++e) acc[e] = fmaf(pr, to_float(vs[x * LDS + part * HALF + e]), acc[e]);
  }
  T* out = p.o.row(b, gather[i], h) + part * HALF;
  const float inv = 1.f / l;
#pragma unroll
  for (int e = 0; e < HALF; ++e) out[e] = from_float<T>(acc[e] * inv);
  if (part == 0 && p.lse.data != nullptr) *p.lse.at(b, gather[i], h) = m + logf(l);
}

//! One-pass backward of a whole group (a non-finite Q, K or dO row): 2 threads per row, each
//! producing half of the row's head_dim outputs over attending pairs only. Writes dq, dk, dv of
//! every real row and, when `dsf` is given, the fp32 dS of every attending pair into it.
template <class T, int D, int LDS, int LDF>
__device__ __forceinline__ void group_exact_bwd(const bwd_params<T>& p, const T* qs, const T* ks, const T* vs,
                                                const T* dos, const index_t* win, const index_t* crd,
                                                const float* lse_s, const float* delta_s, const float* bias_s,
                                                float* dsf, const index_t* gather, int G, int h, int b) {
  constexpr int HALF = D / 2;
  const int i = threadIdx.x >> 1, part = threadIdx.x & 1;
  if (i >= G || win[i] < 0) return;
  const bool with_bias = p.bias.data != nullptr;
  const index_t wi = win[i];
  // P and dS of the pair (query a, key x)
  auto pair = [&](int a, int x, float& pr, float& ds) {
    float sd = 0.f, dpd = 0.f;
    for (int e = 0; e < D; ++e) {
      sd = fmaf(to_float(qs[a * LDS + e]), to_float(ks[x * LDS + e]), sd);
      dpd = fmaf(to_float(dos[a * LDS + e]), to_float(vs[x * LDS + e]), dpd);
    }
    const float sc = sd * p.scale + staged_bias(bias_s, with_bias, crd[a], crd[x], p.window, p.bias.rows);
    pr = softmax_exp<T>(sc - lse_s[a]);
    ds = pr * (dpd - delta_s[a]);
  };
  float acc[HALF], acc2[HALF];
  // dq of query row i
#pragma unroll
  for (int e = 0; e < HALF; ++e) acc[e] = 0.f;
  for (int x = 0; x < G; ++x) {
    if (!attends(wi, win[x])) continue;
    float pr, ds;
    pair(i, x, pr, ds);
    if (dsf != nullptr && part == 0) dsf[i * LDF + x] = ds;
#pragma unroll
    for (int e = 0; e < HALF; ++e) acc[e] = fmaf(ds, to_float(ks[x * LDS + part * HALF + e]), acc[e]);
  }
  T* out = p.dq.row(b, gather[i], h) + part * HALF;
#pragma unroll
  for (int e = 0; e < HALF; ++e) out[e] = from_float<T>(acc[e] * p.scale);
  // dk, dv of key row i
#pragma unroll
  for (int e = 0; e < HALF; ++e) acc[e] = acc2[e] = 0.f;
  for (int a = 0; a < G; ++a) {
    if (!attends(win[a], wi)) continue;
    float pr, ds;
    pair(a, i, pr, ds);
#pragma unroll
    for (int e = 0; e < HALF; ++e) {
      acc[e] = fmaf(pr, to_float(dos[a * LDS + part * HALF + e]), acc[e]);   // dv
      acc2[e] = fmaf(ds, to_float(qs[a * LDS + part * HALF + e]), acc2[e]);  // dk / scale
    }
  }
  T* odv = p.dv.row(b, gather[i], h) + part * HALF;
  T* odk = p.dk.row(b, gather[i], h) + part * HALF;
#pragma unroll
  for (int e = 0; e < HALF; ++e) {
    odv[e] = from_float<T>(acc[e]);
    odk[e] = from_float<T>(acc2[e] * p.scale);
  }
}

//! Tiled forward, O += P V of one key tile over attending pairs only (the tile's V holds a
//! non-finite row). `s` are the lane's fp32 probabilities (rows of the lane's accumulator rows,
//! keys of the tile in the accumulator layout, read by quad shuffles), `kn` the keys in use;
//! warp-uniform loops.
template <class T, int DT, int LDS>
__device__ __forceinline__ void tile_exact_pv(float (&o)[DT][4], const float (&s)[8][4], const T* vs,
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

//! Tiled backward, acc += P' X over attending pairs only: for the lane's accumulator element e of
//! row r (ra for e < 2, rb else; window wa / wb), the sum over the tile's columns c in [c0, c1)
//! whose slot x0 + c attends the row (and, when Bounded, lies below xend) of pf[r * LDF + c] *
//! x[c * LDS + column] (P' is a staged fp32 P or dS tile, X a staged 16-bit operand tile).
template <class T, int DT, int LDS, int LDF, bool Bounded>
__device__ __forceinline__ void tile_exact_acc(float (&acc)[DT][4], const float* pf, const T* x, const index_t* win,
                                               int x0, int xend, int c0, int c1, int ra, int rb, index_t wa,
                                               index_t wb, int lane) {
  namespace L = mma_layout;
#pragma unroll
  for (int dt = 0; dt < DT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e < 2 ? ra : rb, d = dt * 8 + L::acc_col(lane, e);
      const index_t wr = e < 2 ? wa : wb;
      float a = acc[dt][e];
      for (int c = c0; c < c1; ++c)
        if ((!Bounded || x0 + c < xend) && attends(wr, win[x0 + c])) a = fmaf(pf[r * LDF + c], to_float(x[c * LDS + d]), a);
      acc[dt][e] = a;
    }
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
