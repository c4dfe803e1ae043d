//! \file attention_mma.cuh
//! Private: tensor-core (mma.sync m16n8k16, fp16/bf16 in, fp32 accumulate) forward of group
//! window attention for groups of at most 64 slots, head_dim 32 or 64. sm_80+.
//!
//! One CTA (4 warps) per (group, head, sample). The group's Q, K, V rows (at most 64 each) are
//! read through `gather` with 16-byte loads into padded shared memory (padding slots and slots
//! beyond G are zero-filled); the head's bias column is staged too. Warp w owns query rows
//! [16w, 16w+16): S = Q K^T by ldmatrix + mma, then scale, bias and the exact block-diagonal mask
//! (cross-window / padding pairs are SELECTED to -inf, so a NaN in such a pair's q.k vanishes),
//! fp32 row softmax in registers (quad shuffles), P packed to 16 bit straight from the
//! accumulator layout into A fragments, O = P V (ldmatrix.trans for V), then O / l staged
//! through the warp's own Q rows and written to the token rows with 16-byte stores, plus lse.
//!
//! Exactness: a masked probability is exactly 0, and 0 * v = 0 for every finite v. When some V
//! row of the group is not finite (NaN/Inf: 0 * Inf = NaN would leak across windows), the whole
//! CTA takes the exact per-pair path instead (`mma_group_exact`), which only ever visits
//! attending pairs. That test is one flag per CTA (__syncthreads_or), so the common case pays
//! one bit test per loaded word.
#pragma once

#include <climits>
#include <cstdint>

#include "attention_params.hpp"
#include "device_common.cuh"
#include "mma_layout.hpp"

namespace greenmim {
namespace detail {
namespace cuda {

template <int D>
struct mma_tile {
  static_assert(D == 32 || D == 64, "mma path: head_dim 32 or 64");
  static constexpr int ROWS = 64;            // slots per CTA (G <= 64)
  static constexpr int THREADS = 128;        // 4 warps x 16 rows
  static constexpr int LDS = D + 8;          // padded smem row in 16-bit elements (16 B pad)
  static constexpr int CH = D * 2 / 16;      // 16-byte chunks per row
  static constexpr std::size_t smem(int bias_rows) {
    return 3u * ROWS * LDS * 2u + 2u * ROWS * sizeof(index_t) + static_cast<std::size_t>(bias_rows) * sizeof(float);
  }
};

// ---- PTX wrappers ---------------------------------------------------------------------------------
// Under GREENMIM_CUDA_EMULATION the emulator provides ldmatrix / mma.sync as warp collectives,
// written independently from the PTX ISA fragment tables (test/emu/cuda_emu.cpp).
#if defined(GREENMIM_CUDA_EMULATION)
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) { ::gm_emu::ldmatrix_x4(r, p, false); }
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  ::gm_emu::ldmatrix_x4(r, p, true);
}
#else
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}
#endif

template <class T>
struct mma16;  // d += a * b, m16n8k16, row.col, f32 accumulate

template <>
struct mma16<__nv_bfloat16> {
  __device__ __forceinline__ static void run(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
#if defined(GREENMIM_CUDA_EMULATION)
    ::gm_emu::mma_m16n8k16<__nv_bfloat16>(d, a, b0, b1);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
  }
  __device__ __forceinline__ static unsigned pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    unsigned u;
    memcpy(&u, &v, 4);
    return u;
  }
  //! True when neither 16-bit half of `w` is Inf or NaN (exponent all ones).
  __device__ __forceinline__ static bool finite2(unsigned w) {
    return (w & 0x7f80u) != 0x7f80u && (w & 0x7f800000u) != 0x7f800000u;
  }
};

template <>
struct mma16<__half> {
  __device__ __forceinline__ static void run(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
#if defined(GREENMIM_CUDA_EMULATION)
    ::gm_emu::mma_m16n8k16<__half>(d, a, b0, b1);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
  }
  __device__ __forceinline__ static unsigned pack(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    unsigned u;
    memcpy(&u, &v, 4);
    return u;
  }
  __device__ __forceinline__ static bool finite2(unsigned w) {
    return (w & 0x7c00u) != 0x7c00u && (w & 0x7c000000u) != 0x7c000000u;
  }
};

//! S = Q K^T of one warp: query rows [r0, r0 + 16) of `qs` against keys [0, 8 NT) of `ks` (NT <= 8
//! n-tiles; staged 16-bit rows of LDS elements), ldmatrix + mma, accumulator layout.
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

//! Scale, bias and the exact block-diagonal mask of one warp's score tile, in place: key column c
//! is slot x0 + c, masked from slot `xend` on; the lane's rows lie in windows wa, wb at coordinates
//! ca, cb. Pairs of other windows and padding are SELECTED to -inf (a NaN in their q.k vanishes);
//! a relative position outside the table gives a NaN bias. Returns the lane's part of each row's
//! maximum (fmaxf drops NaN: a NaN score still yields a NaN probability).
__device__ __forceinline__ void mask_scores(float (&s)[8][4], float& ma, float& mb, const index_t* win, const index_t* crd,
                                            int x0, int xend, index_t wa, index_t wb, index_t ca, index_t cb,
                                            const table2f& bias, const float* bias_s, float scale, int window,
                                            int lane) {
  namespace L = mma_layout;
  const bool with_bias = bias.data != nullptr;
  auto staged_bias = [&](index_t cq, index_t ck) {
    if (!with_bias) return 0.f;
    const int r = pair_bucket(cq, ck, window, bias.rows);
    return r >= 0 ? bias_s[r] : __int_as_float(0x7fc00000);
  };
  ma = mb = -INFINITY;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int x = x0 + nt * 8 + L::acc_col(lane, e);
      const index_t wc = x < xend ? win[x] : pad_index, cc = x < xend ? crd[x] : 0;
      float va = -INFINITY, vb = -INFINITY;
      if (attends(wa, wc)) va = s[nt][e] * scale + staged_bias(ca, cc);
      if (attends(wb, wc)) vb = s[nt][2 + e] * scale + staged_bias(cb, cc);
      s[nt][e] = va;
      s[nt][2 + e] = vb;
      ma = fmaxf(ma, va);
      mb = fmaxf(mb, vb);
    }
  }
}

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

//! Exact per-pair fallback (non-finite V in the group): 2 threads per query row, each producing
//! half of the row's head_dim outputs; online softmax over attending keys only.
template <class T, int D>
__device__ __forceinline__ void mma_group_exact(const fwd_params<T>& p, const T* qs, const T* ks, const T* vs,
                                             const index_t* win, const index_t* crd, const float* bias_s,
                                             const index_t* gather, int G, int h, int b) {
  using C = mma_tile<D>;
  constexpr int HALF = D / 2;
  const int i = threadIdx.x >> 1, part = threadIdx.x & 1;
  if (i >= G || win[i] < 0) return;
  const index_t wi = win[i];
  float acc[HALF];
#pragma unroll
  for (int e = 0; e < HALF; ++e) acc[e] = 0.f;
  float m = -INFINITY, l = 0.f;
  for (int x = 0; x < G; ++x) {
    if (!attends(wi, win[x])) continue;
    float d = 0.f;
    for (int e = 0; e < D; ++e) d = fmaf(to_float(qs[i * C::LDS + e]), to_float(ks[x * C::LDS + e]), d);
    float sc = d * p.scale;
    if (p.bias.data != nullptr) {
      const int r = pair_bucket(crd[i], crd[x], p.window, p.bias.rows);
      sc += r >= 0 ? bias_s[r] : __int_as_float(0x7fc00000);
    }
    if (sc > m) {
      const float c = __expf(m - sc);
      l *= c;
#pragma unroll
      for (int e = 0; e < HALF; ++e) acc[e] *= c;
      m = sc;
    }
    const float pr = sc == -INFINITY ? 0.f : __expf(sc - m);
    l += pr;
#pragma unroll
    for (int e = 0; e < HALF; ++e) acc[e] = fmaf(pr, to_float(vs[x * C::LDS + part * HALF + e]), acc[e]);
  }
  T* out = p.o.row(b, gather[i], h) + part * HALF;
  const float inv = 1.f / l;
#pragma unroll
  for (int e = 0; e < HALF; ++e) out[e] = from_float<T>(acc[e] * inv);
  if (part == 0 && p.lse.data != nullptr) *p.lse.at(b, gather[i], h) = m + logf(l);
}

template <class T, int D>
__global__ void __launch_bounds__(mma_tile<D>::THREADS) attention_fwd_mma(const fwd_params<T> p) {
  using C = mma_tile<D>;
  using M = mma16<T>;
  constexpr int LDS = C::LDS, CH = C::CH, ROWS = C::ROWS;
  constexpr int DT = D / 8;    // n-tiles of the output
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

  // ---- stage slot ids, bias column, and the Q/K/V rows ---------------------------------------
  for (int i = threadIdx.x; i < ROWS; i += C::THREADS) {
    index_t w = pad_index, c = 0;
    if (i < G) {
      const index_t t = gather[i];
      const index_t sw = p.part.slot_window[base + i];
      w = (sw >= 0 && t >= 0 && t < N) ? sw : pad_index;
      c = p.part.slot_coord != nullptr ? p.part.slot_coord[base + i] : 0;
    }
    win[i] = w;
    crd[i] = c;
  }
  if (p.bias.data != nullptr)
    for (int r = threadIdx.x; r < p.bias.rows; r += C::THREADS) bias_s[r] = __ldg(p.bias.data + r * p.bias.s0 + h * p.bias.s1);
  bool finite = true;
#pragma unroll
  for (int it = 0; it < ROWS * CH / C::THREADS; ++it) {
    const int idx = threadIdx.x + it * C::THREADS;
    const int r = idx / CH, c = idx % CH;
    uint4 uq = make_uint4(0, 0, 0, 0), uk = uq, uv = uq;
    if (r < G) {
      const index_t t = gather[r];
      const index_t sw = p.part.slot_window[base + r];
      if (sw >= 0 && t >= 0 && t < N) {
        uq = __ldg(reinterpret_cast<const uint4*>(p.q.row(b, t, h)) + c);
        uk = __ldg(reinterpret_cast<const uint4*>(p.k.row(b, t, h)) + c);
        uv = __ldg(reinterpret_cast<const uint4*>(p.v.row(b, t, h)) + c);
        finite = finite && M::finite2(uv.x) && M::finite2(uv.y) && M::finite2(uv.z) && M::finite2(uv.w);
      }
    }
    *reinterpret_cast<uint4*>(qs + r * LDS + c * 8) = uq;
    *reinterpret_cast<uint4*>(ks + r * LDS + c * 8) = uk;
    *reinterpret_cast<uint4*>(vs + r * LDS + c * 8) = uv;
  }
  const bool all_finite = __syncthreads_and(finite);
  if (!all_finite) {
    mma_group_exact<T, D>(p, qs, ks, vs, win, crd, bias_s, gather, G, h, b);
    return;
  }

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r0 = warp * 16;
  if (r0 >= G) return;  // no query row of this warp is in the group (no barrier follows)
  const int NT = (G + 7) / 8;   // key n-tiles in use
  namespace L = mma_layout;

  // ---- S = Q K^T ----------------------------------------------------------------------------
  float s[8][4];
  mma_scores<T, D, LDS>(s, qs, ks, r0, lane, NT);

  // ---- scale, bias, exact mask, row softmax ---------------------------------------------------
  const int ra = r0 + L::acc_row(lane, 0), rb = r0 + L::acc_row(lane, 2);  // the two rows this lane holds
  const index_t wa = win[ra], wb = win[rb];
  const index_t ca = crd[ra], cb = crd[rb];
  float ma, mb;
  mask_scores(s, ma, mb, win, crd, 0, ROWS, wa, wb, ca, cb, p.bias, bias_s, p.scale, p.window, lane);
  ma = quad_max(ma);
  mb = quad_max(mb);
  float la = 0.f, lb = 0.f;  // a padding row has base 0: every p is exp(-inf) = 0
  exp_scores<T>(s, softmax_base(ma), softmax_base(mb), la, lb);
  la = quad_sum(la);
  lb = quad_sum(lb);

  // ---- O = P V ------------------------------------------------------------------------------
  float o[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  mma_pv<T, DT, LDS>(o, s, vs, lane, (G + 15) / 16);  // 16-key chunks in use

  // ---- epilogue: O / l through the warp's own Q rows, 16-byte stores ----------------------------
  const float ia = 1.f / la, ib = 1.f / lb;
  __syncwarp();  // every lane is done reading this warp's Q rows (ldmatrix above)
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) {
    const int c = dt * 8 + L::acc_col(lane, 0);  // and c + 1 = acc_col(lane, 1)
    *reinterpret_cast<unsigned*>(qs + ra * LDS + c) = M::pack(o[dt][0] * ia, o[dt][1] * ia);
    *reinterpret_cast<unsigned*>(qs + rb * LDS + c) = M::pack(o[dt][2] * ib, o[dt][3] * ib);
  }
  if (L::tig(lane) == 0 && p.lse.data != nullptr) {
    if (wa >= 0) *p.lse.at(b, gather[ra], h) = ma + logf(la);
    if (wb >= 0) *p.lse.at(b, gather[rb], h) = mb + logf(lb);
  }
  __syncwarp();
#pragma unroll
  for (int it = 0; it < 16 * CH / 32; ++it) {
    const int idx = lane + it * 32;
    const int r = r0 + idx / CH, c = idx % CH;
    if (win[r] >= 0)
      reinterpret_cast<uint4*>(p.o.row(b, gather[r], h))[c] = *reinterpret_cast<const uint4*>(qs + r * LDS + c * 8);
  }
}

//! Several heads per CTA: the same tile and arithmetic as attention_fwd_mma, for heads
//! [blockIdx.y * hpc, + hpc) of one (group, sample) in turn. What does not depend on the head is
//! done once per CTA instead of once per head: the slot ids and coordinates (a row is loaded iff
//! its id is a window, which already says that its token index is valid), and, per lane, the
//! mask / relative-position
//! bucket of each of its 32 accumulator elements (`codes`, int16 in shared memory, each lane
//! reading only what it wrote: no barrier). Per head, the scale-bias-mask step is then a table
//! lookup instead of the pair's window test and bucket arithmetic. The result of each head is
//! bitwise that of attention_fwd_mma (same operations in the same order).
template <int D>
struct mma_heads_tile {
  using C = mma_tile<D>;
  static constexpr int CODES = C::ROWS * C::ROWS;  // 16 rows x 64 keys per warp, int16
  static constexpr std::size_t smem(int bias_rows, int hpc) {
    return 3u * C::ROWS * C::LDS * 2u + CODES * sizeof(std::int16_t) + 2u * C::ROWS * sizeof(index_t) +
           static_cast<std::size_t>(hpc) * static_cast<std::size_t>(bias_rows) * sizeof(float);
  }
};

//! Code of an accumulator element: the pair is masked (-1), attends with a bucket outside the
//! table (-2: NaN bias, as pair_bucket's -1 in attention_fwd_mma), or attends with bias row >= 0
//! (0 without a table).
constexpr int k_code_masked = -1, k_code_nan = -2;

//! Resident CTAs per SM the several-heads kernel is compiled for: those of the one-head kernel at
//! head_dim 32 (63 registers: 8) on sm_90, so that sharing the head-independent work does not
//! cost occupancy (left to itself ptxas takes 93 registers); 7 on sm_80, where 8 would spill.
//! No spills either way (nvcc 13.0). Head_dim 64 keeps the one-head kernel: capped at its 6
//! CTAs per SM this kernel spills (44 bytes on sm_90).
constexpr int fwd_heads_min_ctas() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  return 7;
#else
  return 8;
#endif
}

template <class T, int D>
__global__ void __launch_bounds__(mma_tile<D>::THREADS, fwd_heads_min_ctas()) attention_fwd_mma_heads(const fwd_params<T> p, const int hpc) {
  using C = mma_tile<D>;
  using M = mma16<T>;
  constexpr int LDS = C::LDS, CH = C::CH, ROWS = C::ROWS;
  constexpr int DT = D / 8;    // n-tiles of the output
  constexpr int LOADS = ROWS * CH / C::THREADS;  // 16-byte chunks per thread and tensor
  GM_DYNAMIC_SMEM(smem_f4);
  T* qs = reinterpret_cast<T*>(smem_f4);
  T* ks = qs + ROWS * LDS;
  T* vs = ks + ROWS * LDS;
  std::int16_t* codes = reinterpret_cast<std::int16_t*>(vs + ROWS * LDS);
  index_t* win = reinterpret_cast<index_t*>(codes + mma_heads_tile<D>::CODES);
  index_t* crd = win + ROWS;
  float* bias_s = reinterpret_cast<float*>(crd + ROWS);  // [hpc][rows]

  const int G = p.part.group_size;  // <= 64 (checked by the launcher)
  const int g = blockIdx.x, b = blockIdx.z;
  const int h0 = static_cast<int>(blockIdx.y) * hpc;
  const int nh = p.heads - h0 < hpc ? p.heads - h0 : hpc;
  const std::int64_t base = static_cast<std::int64_t>(g) * G;
  const index_t* gather = p.part.gather + base;
  const index_t N = p.part.num_tokens;
  const bool with_bias = p.bias.data != nullptr;
  const int brows = p.bias.rows;

  // ---- once per CTA: slot ids, bias columns, the rows' tokens --------------------------------
  for (int i = threadIdx.x; i < ROWS; i += C::THREADS) {
    index_t w = pad_index, c = 0;
    if (i < G) {
      const index_t t = gather[i];
      const index_t sw = p.part.slot_window[base + i];
      w = (sw >= 0 && t >= 0 && t < N) ? sw : pad_index;
      c = p.part.slot_coord != nullptr ? p.part.slot_coord[base + i] : 0;
    }
    win[i] = w;
    crd[i] = c;
  }
  if (with_bias)
    for (int x = threadIdx.x; x < nh * brows; x += C::THREADS) {
      const int j = x / brows, r = x - j * brows;
      bias_s[x] = __ldg(p.bias.data + r * p.bias.s0 + (h0 + j) * p.bias.s1);
    }
  __syncthreads();  // win, crd, bias_s

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r0 = warp * 16;
  const bool has_rows = r0 < G;  // else this warp only helps loading (and meets the barriers)
  const int NT = (G + 7) / 8;    // key n-tiles in use
  const int KT = (G + 15) / 16;  // 16-key chunks in use
  namespace L = mma_layout;
  const int ra = r0 + L::acc_row(lane, 0), rb = r0 + L::acc_row(lane, 2);  // the two rows this lane holds
  std::int16_t* my_codes = codes + warp * 16 * ROWS;  // element ((nt*2 + e)*2 + row)*32 + lane
  if (has_rows) {
    const index_t wa = win[ra], wb = win[rb];
    const index_t ca = crd[ra], cb = crd[rb];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int c = nt * 8 + L::acc_col(lane, e);
        const index_t wc = win[c], cc = crd[c];
        int code_a = k_code_masked, code_b = k_code_masked;
        if (attends(wa, wc)) {
          code_a = 0;
          if (with_bias) {
            const int r = pair_bucket(ca, cc, p.window, brows);
            code_a = r >= 0 ? r : k_code_nan;
          }
        }
        if (attends(wb, wc)) {
          code_b = 0;
          if (with_bias) {
            const int r = pair_bucket(cb, cc, p.window, brows);
            code_b = r >= 0 ? r : k_code_nan;
          }
        }
        my_codes[((nt * 2 + e) * 2 + 0) * 32 + lane] = static_cast<std::int16_t>(code_a);
        my_codes[((nt * 2 + e) * 2 + 1) * 32 + lane] = static_cast<std::int16_t>(code_b);
      }
    }
  }

  for (int j = 0; j < nh; ++j) {
    const int h = h0 + j;
    const float* bias_h = bias_s + j * brows;
    if (j > 0) __syncthreads();  // every warp is done with the previous head's Q, K, V tiles
    // ---- this head's Q/K/V rows -----------------------------------------------------------------
    bool finite = true;
#pragma unroll
    for (int it = 0; it < LOADS; ++it) {
      const int idx = threadIdx.x + it * C::THREADS;
      const int r = idx / CH, c = idx % CH;
      uint4 uq = make_uint4(0, 0, 0, 0), uk = uq, uv = uq;
      if (win[r] >= 0) {  // a real token (the slot's id was checked against gather once, above)
        const index_t t = gather[r];
        uq = __ldg(reinterpret_cast<const uint4*>(p.q.row(b, t, h)) + c);
        uk = __ldg(reinterpret_cast<const uint4*>(p.k.row(b, t, h)) + c);
        uv = __ldg(reinterpret_cast<const uint4*>(p.v.row(b, t, h)) + c);
        finite = finite && M::finite2(uv.x) && M::finite2(uv.y) && M::finite2(uv.z) && M::finite2(uv.w);
      }
      *reinterpret_cast<uint4*>(qs + r * LDS + c * 8) = uq;
      *reinterpret_cast<uint4*>(ks + r * LDS + c * 8) = uk;
      *reinterpret_cast<uint4*>(vs + r * LDS + c * 8) = uv;
    }
    const bool all_finite = __syncthreads_and(finite);
    if (!all_finite) {  // CTA-uniform
      mma_group_exact<T, D>(p, qs, ks, vs, win, crd, bias_h, gather, G, h, b);
      continue;
    }
    if (!has_rows) continue;

    // ---- S = Q K^T ------------------------------------------------------------------------------
    float s[8][4];
    mma_scores<T, D, LDS>(s, qs, ks, r0, lane, NT);

    // ---- scale, bias, exact mask (from the codes), row softmax ---------------------------------
    float ma = -INFINITY, mb = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int code_a = my_codes[((nt * 2 + e) * 2 + 0) * 32 + lane];
        const int code_b = my_codes[((nt * 2 + e) * 2 + 1) * 32 + lane];
        float va = -INFINITY, vb = -INFINITY;
        if (code_a != k_code_masked) {
          const float bias = code_a >= 0 ? (with_bias ? bias_h[code_a] : 0.f) : __int_as_float(0x7fc00000);
          va = s[nt][e] * p.scale + bias;
        }
        if (code_b != k_code_masked) {
          const float bias = code_b >= 0 ? (with_bias ? bias_h[code_b] : 0.f) : __int_as_float(0x7fc00000);
          vb = s[nt][2 + e] * p.scale + bias;
        }
        s[nt][e] = va;
        s[nt][2 + e] = vb;
        ma = fmaxf(ma, va);
        mb = fmaxf(mb, vb);
      }
    }
    ma = quad_max(ma);
    mb = quad_max(mb);
    float la = 0.f, lb = 0.f;
    exp_scores<T>(s, softmax_base(ma), softmax_base(mb), la, lb);
    la = quad_sum(la);
    lb = quad_sum(lb);

    // ---- O = P V ----------------------------------------------------------------------------------
    float o[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
    mma_pv<T, DT, LDS>(o, s, vs, lane, KT);

    // ---- epilogue: O / l through the warp's own Q rows, 16-byte stores ------------------------------
    const float ia = 1.f / la, ib = 1.f / lb;
    __syncwarp();
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      const int c = dt * 8 + L::acc_col(lane, 0);
      *reinterpret_cast<unsigned*>(qs + ra * LDS + c) = M::pack(o[dt][0] * ia, o[dt][1] * ia);
      *reinterpret_cast<unsigned*>(qs + rb * LDS + c) = M::pack(o[dt][2] * ib, o[dt][3] * ib);
    }
    if (L::tig(lane) == 0 && p.lse.data != nullptr) {
      if (win[ra] >= 0) *p.lse.at(b, gather[ra], h) = ma + logf(la);
      if (win[rb] >= 0) *p.lse.at(b, gather[rb], h) = mb + logf(lb);
    }
    __syncwarp();
#pragma unroll
    for (int it = 0; it < 16 * CH / 32; ++it) {
      const int idx = lane + it * 32;
      const int r = r0 + idx / CH, c = idx % CH;
      if (win[r] >= 0)
        reinterpret_cast<uint4*>(p.o.row(b, gather[r], h))[c] = *reinterpret_cast<const uint4*>(qs + r * LDS + c * 8);
    }
  }
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
