//! \file attention_bwd_mma_tiled.cuh
//! Private: tensor-core (mma.sync m16n8k16, fp16/bf16 in, fp32 accumulate) backward of group
//! window attention for 64 < G <= 256 (window 14), head_dim 32 or 64, in two kernels that tile
//! the other operand by 64 slots. sm_80+.
//!
//! Kernel 1, query-major (`attention_bwd_dq_mma_tiled`): one CTA per (64-slot query tile, group,
//! head, sample) holds its Q and dO rows, lse and delta = rowsum(dO * O) (written to the
//! workspace for kernel 2); it walks the key tiles of the union of its rows' window ranges,
//! staging K and V (64 rows, zero for padding), and per warp (16 query rows) and half tile (32
//! keys): S = Q K^T, dP = dO V^T, P and dS on the pairs of one window (others selected to 0),
//! dQ += dS K (A fragments from the accumulators). dS goes to an fp32 tile for d(bias): per-warp
//! table rows, one key per step (as the one-pass kernel), then the CTA's partial.
//! Kernel 2, key-major (`attention_bwd_dkdv_mma_tiled`): one CTA per (64-slot key tile, ...)
//! holds K and V, walks the query tiles (Q, dO, lse, delta staged) and per warp (16 key rows)
//! computes S^T = K Q^T, dP^T = V dO^T, P^T, dS^T, dV += P^T dO, dK += dS^T Q.
//! Every real row of dq (kernel 1), dk and dv (kernel 2) is written once, no atomics.
//!
//! Exactness: when the tile multiplied by masked zeros (K in kernel 1; Q or dO in kernel 2) holds
//! a non-finite real row, that tile's products are accumulated by an exact per-pair loop instead
//! (over the fp32 P / dS tile, attending pairs only) into the same registers.
#pragma once

#include <climits>
#include <cstdint>

#include "attention_bwd_mma.cuh"
#include "attention_simt.cuh"

namespace greenmim {
namespace detail {
namespace cuda {

template <int D>
struct mma_bwd_tiled {
  static_assert(D == 32 || D == 64, "mma backward: head_dim 32 or 64");
  static constexpr int ROWS = 64;        // slots per tile
  static constexpr int MAXG = 256;       // largest group
  static constexpr int THREADS = 128;    // 4 warps x 16 rows
  static constexpr int WARPS = 4;
  static constexpr int LDS = D + 8;      // 16-bit rows
  static constexpr int LDF = ROWS + 1;   // fp32 P / dS tile rows
  static constexpr int CH = D * 2 / 16;
  static constexpr std::size_t base_bytes(int bias_rows) {
    return 4u * ROWS * LDS * 2u + 2u * MAXG * 4u + 2u * ROWS * 4u + static_cast<std::size_t>(bias_rows) * 4u +
           static_cast<std::size_t>(ROWS) * LDF * 4u;
  }
  //! Kernel 1: 4 tiles, win/crd of the group, lse/delta of the tile, the bias column, the fp32
  //! dS tile, and with d(bias) one table row per warp.
  static constexpr std::size_t smem_dq(int bias_rows, bool dbias) {
    return base_bytes(bias_rows) + (dbias ? static_cast<std::size_t>(WARPS) * bias_rows * 4u : 0u);
  }
  static constexpr std::size_t smem_dkdv(int bias_rows) { return base_bytes(bias_rows); }
};

//! Stages the 64 rows [t0, t0 + 64) of a 16-bit tensor into `dst` (zero rows beyond `hi` and for
//! padding) and reports whether every staged real row is finite.
template <class T, int D>
__device__ __forceinline__ bool bwd_stage_tile(T* dst, const rows4<const T>& src, const index_t* gather,
                                              const index_t* win, int t0, int hi, int b, int h) {
  using C = mma_bwd_tiled<D>;
  using M = mma16<T>;
  bool finite = true;
#pragma unroll
  for (int it = 0; it < C::ROWS * C::CH / C::THREADS; ++it) {
    const int idx = threadIdx.x + it * C::THREADS;
    const int r = idx / C::CH, c = idx % C::CH, x = t0 + r;
    uint4 u = make_uint4(0, 0, 0, 0);
    if (x < hi && win[x] >= 0) {
      u = __ldg(reinterpret_cast<const uint4*>(src.row(b, gather[x], h)) + c);
      finite = finite && M::finite2(u.x) && M::finite2(u.y) && M::finite2(u.z) && M::finite2(u.w);
    }
    *reinterpret_cast<uint4*>(dst + r * C::LDS + c * 8) = u;
  }
  return finite;
}

//! win/crd of the whole group, the bias column; `range` = union of the window ranges of the rows
//! [t0, t0 + 64) (empty: INT_MAX, INT_MIN). Ends with a barrier.
template <class T, int D>
__device__ __forceinline__ void bwd_tiled_prologue(const bwd_params<T>& p, std::int64_t base, int t0, index_t* win,
                                                  index_t* crd, float* bias_s, int* range, int h) {
  const int G = p.part.group_size;
  stage_slots(p.part, base, win, crd);
  for (int i = G + threadIdx.x; i < mma_bwd_tiled<D>::MAXG; i += blockDim.x) {  // rows beyond G: padding
    win[i] = pad_index;
    crd[i] = 0;
  }
  if (p.bias.data != nullptr)
    for (int r = threadIdx.x; r < p.bias.rows; r += blockDim.x)
      bias_s[r] = __ldg(p.bias.data + r * p.bias.s0 + h * p.bias.s1);
  if (threadIdx.x == 0) {
    range[0] = INT_MAX;
    range[1] = INT_MIN;
  }
  __syncthreads();
  if (threadIdx.x < mma_bwd_tiled<D>::ROWS) {
    const int s = t0 + static_cast<int>(threadIdx.x);
    int lo, hi;
    window_range(win, G, s < G ? win[s] : pad_index, lo, hi);
    if (lo < hi) {
      atomicMin(&range[0], lo);
      atomicMax(&range[1], hi);
    }
  }
  __syncthreads();
}

// =================================================================================================
// Kernel 1 (query-major): delta -> workspace, dq, per-CTA d(bias) partial
// =================================================================================================
template <class T, int D>
__global__ void __launch_bounds__(mma_bwd_tiled<D>::THREADS) attention_bwd_dq_mma_tiled(const bwd_params<T> p) {
  using C = mma_bwd_tiled<D>;
  using M = mma16<T>;
  namespace L = mma_layout;
  constexpr int LDS = C::LDS, LDF = C::LDF, CH = C::CH, ROWS = C::ROWS;
  constexpr int DT = D / 8, KS = D / 16;
  GM_DYNAMIC_SMEM(smem_f4);
  T* qs = reinterpret_cast<T*>(smem_f4);
  T* dos = qs + ROWS * LDS;
  T* ks = dos + ROWS * LDS;
  T* vs = ks + ROWS * LDS;
  index_t* win = reinterpret_cast<index_t*>(vs + ROWS * LDS);
  index_t* crd = win + C::MAXG;
  float* lse_s = reinterpret_cast<float*>(crd + C::MAXG);
  float* delta_s = lse_s + ROWS;
  float* bias_s = delta_s + ROWS;
  const int rows = p.bias.rows;
  float* dsf = bias_s + rows;        // [ROWS][LDF] fp32 dS of the current key tile
  float* wbuf = dsf + ROWS * LDF;    // [WARPS][rows] with d(bias)
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
  bwd_tiled_prologue<T, D>(p, base, q0, win, crd, bias_s, range, h);

  // ---- Q, dO of the tile, lse, delta (-> workspace) -----------------------------------------------
  for (int i = threadIdx.x; i < ROWS; i += C::THREADS) {
    const int s = q0 + i;
    lse_s[i] = s < G && win[s] >= 0 ? *p.lse.at(b, gather[s], h) : 0.f;
  }
  bwd_stage_tile<T, D>(qs, p.q, gather, win, q0, G, b, h);
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
      dl = bwd_dot8<T>(ud, __ldg(reinterpret_cast<const uint4*>(p.o.row(b, t, h)) + c), 0.f);
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
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.f;
  const int klo = range[0], khi = range[1];

  for (int k0 = klo; k0 < khi; k0 += ROWS) {
    bool finite = bwd_stage_tile<T, D>(ks, p.k, gather, win, k0, khi, b, h);
    bwd_stage_tile<T, D>(vs, p.v, gather, win, k0, khi, b, h);
    const bool tile_finite = __syncthreads_and(finite);  // also: Q, dO, lse, delta staged
    if (active) {
      const float la = lse_s[ra], lb = lse_s[rb], da = delta_s[ra], db = delta_s[rb];
#pragma unroll
      for (int hc = 0; hc < 2; ++hc) {  // keys k0 + [32 hc, 32 hc + 32)
        float s[4][4], ds[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[nt][e] = ds[nt][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) {
          unsigned aq[4], ad[4];
          ldmatrix_x4(aq, qs + (r0 + L::a_ld_row(lane)) * LDS + kk * 16 + L::a_ld_col(lane));
          ldmatrix_x4(ad, dos + (r0 + L::a_ld_row(lane)) * LDS + kk * 16 + L::a_ld_col(lane));
#pragma unroll
          for (int np = 0; np < 2; ++np) {
            unsigned bk[4], bv[4];
            ldmatrix_x4(bk, ks + (32 * hc + np * 16 + L::bk_ld_row(lane)) * LDS + kk * 16 + L::bk_ld_col(lane));
            ldmatrix_x4(bv, vs + (32 * hc + np * 16 + L::bk_ld_row(lane)) * LDS + kk * 16 + L::bk_ld_col(lane));
            M::run(s[2 * np], aq, bk[0], bk[1]);
            M::run(s[2 * np + 1], aq, bk[2], bk[3]);
            M::run(ds[2 * np], ad, bv[0], bv[1]);
            M::run(ds[2 * np + 1], ad, bv[2], bv[3]);
          }
        }
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int c = 32 * hc + nt * 8 + L::acc_col(lane, e), x = k0 + c;
            const index_t wc = x < khi ? win[x] : pad_index, cc = x < khi ? crd[x] : 0;
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
            ds[nt][e] = dsa;
            ds[nt][2 + e] = dsb;
            dsf[ra * LDF + c] = dsa;
            dsf[rb * LDF + c] = dsb;
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
        const int kn = min(ROWS, khi - k0);
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = e < 2 ? ra : rb, d = dt * 8 + L::acc_col(lane, e);
            const index_t wr = e < 2 ? wa : wb;
            float acc = dq[dt][e];
            for (int c = 0; c < kn; ++c)
              if (attends(wr, win[k0 + c])) acc = fmaf(dsf[r * LDF + c], to_float(ks[c * LDS + d]), acc);
            dq[dt][e] = acc;
          }
      }
    }
    if (want_dbias) {
      __syncthreads();  // the dS tile is complete
      const int i = (warp & 1) * 32 + lane, s = q0 + i;
      const index_t wi = s < G ? win[s] : pad_index, ci = s < G ? crd[s] : 0;
      const int j0 = (warp >> 1) * 32, j1 = min(j0 + 32, khi - k0);
      float* mine = wbuf + warp * rows;
      for (int j = j0; j < j1; ++j) {
        if (attends(wi, win[k0 + j])) {
          const int r = pair_bucket(ci, crd[k0 + j], p.window, rows);
          if (r >= 0) mine[r] += dsf[i * LDF + j];
        }
        __syncwarp();
      }
    }
    __syncthreads();  // before the next tile overwrites K, V and the dS tile
  }

  __syncthreads();  // (no key tile at all: the staging of Q is still ordered before the epilogue)
  if (active) {  // dq through the warp's own Q rows (read by this warp only)
    bwd_stage_acc<T, DT>(qs, LDS, r0, lane, dq, p.scale);
    __syncwarp();
    bwd_write_rows<T, D>(p.dq, qs, LDS, r0, lane, win + q0, gather + q0, b, h);
  }
  if (want_dbias) {
    const std::int64_t cta = (static_cast<std::int64_t>(b) * p.part.num_groups + g) * p.q_tiles + tile;
    float* out = p.dbias_partial + (cta * p.heads + h) * rows;
    for (int r = threadIdx.x; r < rows; r += C::THREADS)
      out[r] = ((wbuf[r] + wbuf[rows + r]) + wbuf[2 * rows + r]) + wbuf[3 * rows + r];
  }
}

// =================================================================================================
// Kernel 2 (key-major): dk, dv. Needs delta from kernel 1 (same stream, earlier launch).
// =================================================================================================
template <class T, int D>
__global__ void __launch_bounds__(mma_bwd_tiled<D>::THREADS) attention_bwd_dkdv_mma_tiled(const bwd_params<T> p) {
  using C = mma_bwd_tiled<D>;
  using M = mma16<T>;
  namespace L = mma_layout;
  constexpr int LDS = C::LDS, LDF = C::LDF, ROWS = C::ROWS;
  constexpr int DT = D / 8, KS = D / 16;
  GM_DYNAMIC_SMEM(smem_f4);
  T* ks = reinterpret_cast<T*>(smem_f4);
  T* vs = ks + ROWS * LDS;
  T* qs = vs + ROWS * LDS;
  T* dos = qs + ROWS * LDS;
  index_t* win = reinterpret_cast<index_t*>(dos + ROWS * LDS);
  index_t* crd = win + C::MAXG;
  float* lse_s = reinterpret_cast<float*>(crd + C::MAXG);
  float* delta_s = lse_s + ROWS;
  float* bias_s = delta_s + ROWS;
  const int rows = p.bias.rows;
  float* pf = bias_s + rows;  // [ROWS keys][LDF] fp32 P^T or dS^T of a half tile (exact path)
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

  bwd_tiled_prologue<T, D>(p, base, k0, win, crd, bias_s, range, h);
  bwd_stage_tile<T, D>(ks, p.k, gather, win, k0, G, b, h);
  bwd_stage_tile<T, D>(vs, p.v, gather, win, k0, G, b, h);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r0 = warp * 16;
  const bool active = k0 + r0 < G;
  const int ja = r0 + L::acc_row(lane, 0), jb = r0 + L::acc_row(lane, 2);  // local key rows
  const index_t wa = k0 + ja < G ? win[k0 + ja] : pad_index, wb = k0 + jb < G ? win[k0 + jb] : pad_index;
  const index_t ca = k0 + ja < G ? crd[k0 + ja] : 0, cb = k0 + jb < G ? crd[k0 + jb] : 0;
  float dk[DT][4], dv[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.f;
  const int alo = range[0], ahi = range[1];

  for (int a0 = alo; a0 < ahi; a0 += ROWS) {
    bool finite = bwd_stage_tile<T, D>(qs, p.q, gather, win, a0, ahi, b, h);
    finite = bwd_stage_tile<T, D>(dos, p.d_o, gather, win, a0, ahi, b, h) && finite;
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
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) pt[nt][e] = dst[nt][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) {
          unsigned ak[4], av[4];
          ldmatrix_x4(ak, ks + (r0 + L::a_ld_row(lane)) * LDS + kk * 16 + L::a_ld_col(lane));
          ldmatrix_x4(av, vs + (r0 + L::a_ld_row(lane)) * LDS + kk * 16 + L::a_ld_col(lane));
#pragma unroll
          for (int np = 0; np < 2; ++np) {
            unsigned bq[4], bd[4];
            ldmatrix_x4(bq, qs + (32 * hc + np * 16 + L::bk_ld_row(lane)) * LDS + kk * 16 + L::bk_ld_col(lane));
            ldmatrix_x4(bd, dos + (32 * hc + np * 16 + L::bk_ld_row(lane)) * LDS + kk * 16 + L::bk_ld_col(lane));
            M::run(pt[2 * np], ak, bq[0], bq[1]);
            M::run(pt[2 * np + 1], ak, bq[2], bq[3]);
            M::run(dst[2 * np], av, bd[0], bd[1]);
            M::run(dst[2 * np + 1], av, bd[2], bd[3]);
          }
        }
        // P^T and dS^T on the pairs of one window (query column a, key row j)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int c = 32 * hc + nt * 8 + L::acc_col(lane, e), a = a0 + c;
            const index_t wc = a < ahi ? win[a] : pad_index, cc = a < ahi ? crd[a] : 0;
            const float lc = lse_s[c], dc = delta_s[c];
            float pa = 0.f, dsa = 0.f, pb = 0.f, dsb = 0.f;
            if (attends(wc, wa)) {
              const float bias = bwd_staged_bias(bias_s, with_bias, cc, ca, p.window, rows);
              pa = softmax_exp<T>(pt[nt][e] * p.scale + bias - lc);
              dsa = pa * (dst[nt][e] - dc);
            }
            if (attends(wc, wb)) {
              const float bias = bwd_staged_bias(bias_s, with_bias, cc, cb, p.window, rows);
              pb = softmax_exp<T>(pt[nt][2 + e] * p.scale + bias - lc);
              dsb = pb * (dst[nt][2 + e] - dc);
            }
            pt[nt][e] = pa;
            pt[nt][2 + e] = pb;
            dst[nt][e] = dsa;
            dst[nt][2 + e] = dsb;
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
            const T* op = pass == 0 ? dos : qs;
#pragma unroll
            for (int dt = 0; dt < DT; ++dt)
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                const int j = e < 2 ? ja : jb, d = dt * 8 + L::acc_col(lane, e);
                const index_t wj = e < 2 ? wa : wb;
                float acc = pass == 0 ? dv[dt][e] : dk[dt][e];
                for (int c = 32 * hc; c < 32 * hc + 32; ++c) {
                  const int a = a0 + c;
                  if (a < ahi && attends(win[a], wj)) acc = fmaf(pf[j * LDF + c], to_float(op[c * LDS + d]), acc);
                }
                if (pass == 0) dv[dt][e] = acc;
                else dk[dt][e] = acc;
              }
          }
        }
      }
    }
    __syncthreads();  // before the next tile overwrites Q, dO, lse, delta
  }

  __syncthreads();  // (no query tile at all: the staging of K, V is still ordered before the epilogue)
  if (active) {  // dv, dk through the warp's own V, K rows (read by this warp only)
    bwd_stage_acc<T, DT>(vs, LDS, r0, lane, dv, 1.f);
    bwd_stage_acc<T, DT>(ks, LDS, r0, lane, dk, p.scale);
    __syncwarp();
    bwd_write_rows<T, D>(p.dv, vs, LDS, r0, lane, win + k0, gather + k0, b, h);
    bwd_write_rows<T, D>(p.dk, ks, LDS, r0, lane, win + k0, gather + k0, b, h);
  }
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
