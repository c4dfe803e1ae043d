//! \file attention_bwd_mma.cuh
//! Private: tensor-core (mma.sync m16n8k16, fp16/bf16 in, fp32 accumulate) backward of group
//! window attention for groups of at most 64 slots, head_dim 32 or 64, in ONE pass. sm_80+.
//!
//! One CTA (4 warps) per (group, head, sample). The group's Q, K, V and dO rows (at most 64
//! each) are read through `gather` with 16-byte loads into padded shared memory (padding slots
//! and slots beyond G are zero rows); lse and delta = rowsum(dO * O) (O read once, in fp32, in
//! a fixed order) are staged per slot, the head's bias column too.
//!
//!   phase 1, warp w owns query rows [16w, 16w+16):
//!     S = Q K^T and dP = dO V^T (ldmatrix + mma), then for the pairs of the same window only
//!     (others are SELECTED to 0, so nothing of another window, not a NaN, survives):
//!     P = exp(scale S + bias - lse), dS = P (dP - delta). P and dS go to shared memory as
//!     16-bit [query][key] tiles (and dS as fp32 when d(bias) is wanted); dS stays in registers.
//!   barrier
//!   phase 2: dQ = scale dS K (A from the dS accumulators, K by ldmatrix.trans), staged through
//!     the warp's own (now dead) V rows and written with 16-byte stores; warp w now owns KEY rows
//!     [16w, 16w+16): dV = P^T dO (A = P^T by ldmatrix.trans of the P tile, dO by ldmatrix.trans)
//!   barrier
//!   phase 3: dV staged through the warp's own (dead) K rows; dK = scale dS^T Q likewise,
//!     staged through the warp's own (dead) P rows; both written with 16-byte stores.
//! Every real token row of dq, dk, dv is written exactly once; no atomics.
//!
//! Exactness: a masked P or dS is exactly 0, and 0 * x = 0 for finite x. The second products
//! multiply masked zeros by K (dQ), dO (dV) and Q (dK): when any real row of those is not finite
//! (0 * Inf = NaN would leak across windows) the whole CTA takes an exact per-pair path instead
//! (`bwd_group_exact`), which only visits attending pairs (one __syncthreads_and flag). A NaN in
//! V, O, lse or the bias only reaches S / dP entries that the selection drops for other windows.
//!
//! d(bias), deterministic: the fp32 dS tile [query][key] is summed into per-warp private rows of
//! the table in shared memory (laid over the operand tiles, dead by then: at head_dim 32 and
//! window 7 a CTA needs 57 KB, so 4 fit an sm_90 SM): warp w takes query rows (w & 1) * 32 + lane
//! and keys [(w >> 1) * 32, +32), one key per step (then __syncwarp); the lanes that attend one
//! key lie in one window with distinct coordinates, hence distinct buckets. The 4 rows are summed in warp
//! order into the CTA's partial in the workspace (the SIMT kernel's layout, q_tiles = 1), which
//! `dbias_reduce` reduces in a fixed order, as for the SIMT backward.
#pragma once

#include <climits>
#include <cstdint>

#include "attention_mma.cuh"
#include "attention_params.hpp"
#include "device_common.cuh"
#include "mma_layout.hpp"

namespace greenmim {
namespace detail {
namespace cuda {

namespace mma_bwd_layout {
//! A operand (16 x 16, rows m, columns k) read with ldmatrix.x4.TRANS from a matrix stored
//! k-major (smem rows = k, columns = m): the row (k) and column (m) offset whose address `lane`
//! passes, so that the registers are a0..a3 = (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15),
//! (m 8-15, k 8-15). Used for P^T and dS^T from the [query][key] tiles.
GREENMIM_HOST_DEVICE constexpr int at_ld_row(int lane) { return (lane & 7) + ((lane >> 4) << 3); }
GREENMIM_HOST_DEVICE constexpr int at_ld_col(int lane) { return ((lane >> 3) & 1) * 8; }
}  // namespace mma_bwd_layout

template <int D>
struct mma_bwd_tile {
  static_assert(D == 32 || D == 64, "mma backward: head_dim 32 or 64");
  static constexpr int ROWS = 64;        // slots per CTA (G <= 64)
  static constexpr int THREADS = 128;    // 4 warps x 16 rows
  static constexpr int WARPS = 4;
  static constexpr int LDS = D + 8;      // Q, K, V, dO rows, 16-bit elements (16 B pad)
  static constexpr int LDP = ROWS + 8;   // P, dS rows, 16-bit (also dK staging: D + 8 <= LDP)
  static constexpr int LDF = ROWS + 1;   // fp32 dS rows (d(bias)): conflict-free column reads
  static constexpr int CH = D * 2 / 16;  // 16-byte chunks per row
  static constexpr std::size_t tiles = 4u * ROWS * LDS * 2u + 2u * ROWS * LDP * 2u;  // Q K V dO P dS
  //! Bytes at the start of the dynamic shared memory: the 6 tiles, which the per-warp d(bias)
  //! table rows overlay once the tiles are dead (a multiple of 16).
  static constexpr std::size_t head(int bias_rows, bool dbias) {
    return dbias && static_cast<std::size_t>(WARPS) * bias_rows * 4u > tiles
               ? static_cast<std::size_t>(WARPS) * bias_rows * 4u
               : tiles;
  }
  //! Dynamic shared memory: the head, win/crd/lse/delta, the bias column, and with d(bias) the
  //! fp32 dS tile. (D = 32, window 7, d(bias): 57,252 bytes, 4 CTAs per sm_90 SM.)
  static constexpr std::size_t smem(int bias_rows, bool dbias) {
    return head(bias_rows, dbias) + 4u * ROWS * 4u + static_cast<std::size_t>(bias_rows) * 4u +
           (dbias ? static_cast<std::size_t>(ROWS) * LDF * 4u : 0u);
  }
};

template <class T>
struct bwd_pair16;
template <>
struct bwd_pair16<__half> {
  using type = __half2;
};
template <>
struct bwd_pair16<__nv_bfloat16> {
  using type = __nv_bfloat162;
};

//! fma-accumulates the 8 products of two uint4 of 16-bit elements, in element order.
template <class T>
__device__ __forceinline__ float bwd_dot8(uint4 a, uint4 b, float acc) {
  using T2 = typename bwd_pair16<T>::type;
  const unsigned wa[4] = {a.x, a.y, a.z, a.w}, wb[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    T2 ta, tb;
    memcpy(static_cast<void*>(&ta), &wa[k], 4);
    memcpy(static_cast<void*>(&tb), &wb[k], 4);
    const float2 fa = seg_io<T>::to_f2(ta), fb = seg_io<T>::to_f2(tb);
    acc = fmaf(fa.x, fb.x, acc);
    acc = fmaf(fa.y, fb.y, acc);
  }
  return acc;
}

//! Bias of the pair from the staged column: 0 without a table, NaN outside it.
__device__ __forceinline__ float bwd_staged_bias(const float* bias_s, bool with_bias, index_t cq, index_t ck,
                                                 int window, int rows) {
  if (!with_bias) return 0.f;
  const int r = pair_bucket(cq, ck, window, rows);
  return r >= 0 ? bias_s[r] : __int_as_float(0x7fc00000);
}

//! Exact per-pair fallback (a non-finite Q, K or dO row in the group): 2 threads per row, each
//! producing half of the row's head_dim outputs; only attending pairs are visited. Writes dq,
//! dk, dv of every real row and, with d(bias), the fp32 dS of every attending pair into `dsf`.
template <class T, int D>
__device__ __forceinline__ void bwd_group_exact(const bwd_params<T>& p, const T* qs, const T* ks, const T* vs,
                                               const T* dos, const index_t* win, const index_t* crd,
                                               const float* lse_s, const float* delta_s, const float* bias_s,
                                               float* dsf, const index_t* gather, int G, int h, int b) {
  using C = mma_bwd_tile<D>;
  constexpr int HALF = D / 2, LDS = C::LDS;
  const int i = threadIdx.x >> 1, part = threadIdx.x & 1;
  if (i >= G || win[i] < 0) return;
  const bool with_bias = p.bias.data != nullptr;
  const index_t wi = win[i];
  // score and dP of the pair (query a, key x)
  auto pair = [&](int a, int x, float& pr, float& ds) {
    float sd = 0.f, dpd = 0.f;
    for (int e = 0; e < D; ++e) {
      sd = fmaf(to_float(qs[a * LDS + e]), to_float(ks[x * LDS + e]), sd);
      dpd = fmaf(to_float(dos[a * LDS + e]), to_float(vs[x * LDS + e]), dpd);
    }
    const float sc = sd * p.scale + bwd_staged_bias(bias_s, with_bias, crd[a], crd[x], p.window, p.bias.rows);
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
    if (dsf != nullptr && part == 0) dsf[i * C::LDF + x] = ds;
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

//! Packs a 16 x D fp32 accumulator block (rows r0 + acc_row) into 16-bit rows of `dst` (row
//! stride ld elements), multiplied by `mul`.
template <class T, int DT>
__device__ __forceinline__ void bwd_stage_acc(T* dst, int ld, int r0, int lane, const float (&acc)[DT][4], float mul) {
  using M = mma16<T>;
  namespace L = mma_layout;
  const int ra = r0 + L::acc_row(lane, 0), rb = r0 + L::acc_row(lane, 2);
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) {
    const int c = dt * 8 + L::acc_col(lane, 0);
    *reinterpret_cast<unsigned*>(dst + ra * ld + c) = M::pack(acc[dt][0] * mul, acc[dt][1] * mul);
    *reinterpret_cast<unsigned*>(dst + rb * ld + c) = M::pack(acc[dt][2] * mul, acc[dt][3] * mul);
  }
}

//! Writes the 16 staged rows [r0, r0+16) of `src` (row stride ld) to the real token rows of `out`
//! with 16-byte stores (one warp).
template <class T, int D>
__device__ __forceinline__ void bwd_write_rows(const rows4<T>& out, const T* src, int ld, int r0, int lane,
                                           const index_t* win, const index_t* gather, int b, int h) {
  constexpr int CH = D * 2 / 16;
#pragma unroll
  for (int it = 0; it < 16 * CH / 32; ++it) {
    const int idx = lane + it * 32;
    const int r = r0 + idx / CH, c = idx % CH;
    if (win[r] >= 0)
      reinterpret_cast<uint4*>(out.row(b, gather[r], h))[c] = *reinterpret_cast<const uint4*>(src + r * ld + c * 8);
  }
}

template <class T, int D>
__global__ void __launch_bounds__(mma_bwd_tile<D>::THREADS) attention_bwd_mma(const bwd_params<T> p) {
  using C = mma_bwd_tile<D>;
  using M = mma16<T>;
  namespace L = mma_layout;
  namespace LB = mma_bwd_layout;
  constexpr int LDS = C::LDS, LDP = C::LDP, LDF = C::LDF, CH = C::CH, ROWS = C::ROWS;
  constexpr int DT = D / 8;   // n-tiles of a head_dim-wide output
  constexpr int KS = D / 16;  // k-steps over head_dim
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
  index_t* win = reinterpret_cast<index_t*>(reinterpret_cast<char*>(smem_f4) + C::head(rows, want_dbias));
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

  // ---- stage slot ids, lse, bias column, d(bias) rows ------------------------------------------
  for (int i = threadIdx.x; i < ROWS; i += C::THREADS) {
    index_t w = pad_index, c = 0;
    float l = 0.f;
    if (i < G) {
      const index_t t = gather[i];
      const index_t sw = p.part.slot_window[base + i];
      w = (sw >= 0 && t >= 0 && t < N) ? sw : pad_index;
      c = p.part.slot_coord != nullptr ? p.part.slot_coord[base + i] : 0;
      if (w >= 0) l = *p.lse.at(b, t, h);
    }
    win[i] = w;
    crd[i] = c;
    lse_s[i] = l;
  }
  if (with_bias)
    for (int r = threadIdx.x; r < rows; r += C::THREADS) bias_s[r] = __ldg(p.bias.data + r * p.bias.s0 + h * p.bias.s1);

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
        dl = bwd_dot8<T>(ud, uo, 0.f);
        finite = finite && M::finite2(uq.x) && M::finite2(uq.y) && M::finite2(uq.z) && M::finite2(uq.w) &&
                 M::finite2(uk.x) && M::finite2(uk.y) && M::finite2(uk.z) && M::finite2(uk.w) &&
                 M::finite2(ud.x) && M::finite2(ud.y) && M::finite2(ud.z) && M::finite2(ud.w);
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
    bwd_group_exact<T, D>(p, qs, ks, vs, dos, win, crd, lse_s, delta_s, bias_s, want_dbias ? dsf : nullptr, gather,
                          G, h, b);
  } else {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r0 = warp * 16;
    const bool active = r0 < G;   // warp-uniform; the barriers below stay outside the branches
    const int NT = (G + 7) / 8;   // key n-tiles in use
    const int KT = (G + 15) / 16; // 16-row chunks in use
    float ds[8][4];               // dS of the warp's query rows (phase 1 -> phase 2)
    float dv[DT][4];              // dV of the warp's key rows (phase 2 -> phase 3)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) ds[nt][0] = ds[nt][1] = ds[nt][2] = ds[nt][3] = 0.f;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) dv[dt][0] = dv[dt][1] = dv[dt][2] = dv[dt][3] = 0.f;

    // ---- phase 1: S = Q K^T, dP = dO V^T, P, dS --------------------------------------------------
    if (active) {
      float s[8][4];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < KS; ++kk) {
        unsigned aq[4], ad[4];
        ldmatrix_x4(aq, qs + (r0 + L::a_ld_row(lane)) * LDS + kk * 16 + L::a_ld_col(lane));
        ldmatrix_x4(ad, dos + (r0 + L::a_ld_row(lane)) * LDS + kk * 16 + L::a_ld_col(lane));
#pragma unroll
        for (int np = 0; np < 4; ++np) {  // pairs of key n-tiles: keys [16 np, 16 np + 16)
          if (2 * np < NT) {
            unsigned bk[4], bv[4];
            ldmatrix_x4(bk, ks + (np * 16 + L::bk_ld_row(lane)) * LDS + kk * 16 + L::bk_ld_col(lane));
            ldmatrix_x4(bv, vs + (np * 16 + L::bk_ld_row(lane)) * LDS + kk * 16 + L::bk_ld_col(lane));
            M::run(s[2 * np], aq, bk[0], bk[1]);
            M::run(ds[2 * np], ad, bv[0], bv[1]);
            if (2 * np + 1 < NT) {
              M::run(s[2 * np + 1], aq, bk[2], bk[3]);
              M::run(ds[2 * np + 1], ad, bv[2], bv[3]);
            }
          }
        }
      }
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
          float pa = 0.f, dsa = 0.f, pb = 0.f, dsb = 0.f;
          if (attends(wa, wc)) {
            const float bias = bwd_staged_bias(bias_s, with_bias, ca, cc, p.window, rows);
            pa = softmax_exp<T>(s[nt][e] * p.scale + bias - la);
            dsa = pa * (ds[nt][e] - da);
          }
          if (attends(wb, wc)) {
            const float bias = bwd_staged_bias(bias_s, with_bias, cb, cc, p.window, rows);
            pb = softmax_exp<T>(s[nt][2 + e] * p.scale + bias - lb);
            dsb = pb * (ds[nt][2 + e] - db);
          }
          s[nt][e] = pa;
          s[nt][2 + e] = pb;
          ds[nt][e] = dsa;
          ds[nt][2 + e] = dsb;
        }
      }
      bwd_stage_acc<T, 8>(ps, LDP, r0, lane, s, 1.f);
      bwd_stage_acc<T, 8>(dss, LDP, r0, lane, ds, 1.f);
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
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.f;
#pragma unroll
      for (int kc = 0; kc < 4; ++kc) {
        if (kc < KT) {
          unsigned a[4];
          L::acc_to_a(ds[2 * kc], ds[2 * kc + 1], a, [](float lo, float hi) { return M::pack(lo, hi); });
          unsigned at[4];
          ldmatrix_x4_trans(at, ps + (kc * 16 + LB::at_ld_row(lane)) * LDP + r0 + LB::at_ld_col(lane));
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
      bwd_stage_acc<T, DT>(vs, LDS, r0, lane, dq, p.scale);  // the warp's own V rows (dead)
      __syncwarp();
      bwd_write_rows<T, D>(p.dq, vs, LDS, r0, lane, win, gather, b, h);
    }
    __syncthreads();  // nobody reads K or P any more

    // ---- phase 3: dK = scale dS^T Q (key rows); dV and dK written ---------------------------------
    if (active) {
      bwd_stage_acc<T, DT>(ks, LDS, r0, lane, dv, 1.f);  // the warp's own K rows (dead)
      float dk[DT][4];
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) dk[dt][0] = dk[dt][1] = dk[dt][2] = dk[dt][3] = 0.f;
#pragma unroll
      for (int kc = 0; kc < 4; ++kc) {
        if (kc < KT) {
          unsigned at[4];
          ldmatrix_x4_trans(at, dss + (kc * 16 + LB::at_ld_row(lane)) * LDP + r0 + LB::at_ld_col(lane));
#pragma unroll
          for (int dp = 0; dp < DT / 2; ++dp) {
            unsigned bq[4];
            ldmatrix_x4_trans(bq, qs + (kc * 16 + L::bv_ld_row(lane)) * LDS + dp * 16 + L::bv_ld_col(lane));
            M::run(dk[2 * dp], at, bq[0], bq[1]);
            M::run(dk[2 * dp + 1], at, bq[2], bq[3]);
          }
        }
      }
      bwd_stage_acc<T, DT>(ps, LDP, r0, lane, dk, p.scale);  // the warp's own P rows (dead)
      __syncwarp();
      bwd_write_rows<T, D>(p.dv, ks, LDS, r0, lane, win, gather, b, h);
      bwd_write_rows<T, D>(p.dk, ps, LDP, r0, lane, win, gather, b, h);
    }
  }

  // ---- d(bias): fp32 dS into per-warp table rows, then the CTA's partial -------------------------
  if (want_dbias) {
    __syncthreads();  // dsf complete (either path); the tiles are dead
    for (int i = threadIdx.x; i < C::WARPS * rows; i += C::THREADS) wbuf[i] = 0.f;
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int i = (warp & 1) * 32 + lane;
    const int j0 = (warp >> 1) * 32, j1 = min(j0 + 32, G);
    const index_t wi = win[i], ci = crd[i];
    float* mine = wbuf + warp * rows;
    for (int j = j0; j < j1; ++j) {
      if (attends(wi, win[j])) {
        const int r = pair_bucket(ci, crd[j], p.window, rows);
        if (r >= 0) mine[r] += dsf[i * LDF + j];
      }
      __syncwarp();  // orders this step's read-modify-writes before the next step's
    }
    __syncthreads();
    const std::int64_t cta = static_cast<std::int64_t>(b) * p.part.num_groups + g;  // q_tiles = 1
    float* out = p.dbias_partial + (cta * p.heads + h) * rows;
    for (int r = threadIdx.x; r < rows; r += C::THREADS)
      out[r] = ((wbuf[r] + wbuf[rows + r]) + wbuf[2 * rows + r]) + wbuf[3 * rows + r];
  }
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
