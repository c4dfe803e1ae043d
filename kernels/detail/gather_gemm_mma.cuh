//! \file gather_gemm_mma.cuh
//! Private: C[M, N] = A[M, K] B[K, N] on tensor cores (mma.sync m16n8k16, fp16/bf16 in, fp32
//! accumulate) for operands that no GEMM library can read: rows gathered through a table,
//! columns scattered on store. The block conv's three products use it (block_conv.cu).
//!
//! The operator `Op` says how to read and store:
//! - `using elem = T` (__half or __nv_bfloat16); `using layout = tc_layout<A k-major?, B k-major?>`;
//! - `int M, N, K`;
//! - `uint4 a8(int m, int k, int k_end)`: 8 consecutive elements of A packed in 16 bytes, along
//!   the operand's staged row: A[m][k .. k+8) when A is not k-major, A[m .. m+8)[k] when it is;
//! - `uint4 b8(int k, int n, int k_end)`: B[k .. k+8)[n] when B is not k-major (n-major: its
//!   staged rows are columns of B), B[k][n .. n+8) when it is;
//!   both return zeros for elements outside the matrix or at k >= k_end, and their values never
//!   depend on how they are read (vector or element loads), so results do not depend on alignment;
//! - `void store(int m, int n, float v)`.
//!
//! Tiles of 64 x 64 outputs, 32-deep steps, 4 warps of 32 x 32 (2 m-tiles x 4 n-tiles each), the
//! next step's operands loaded into registers while the tensor cores run on the current one.
//! Split-K as the SIMT kernel: blockIdx.z covers k in [z k_per, (z + 1) k_per) (k_per a multiple of
//! 16) and, with `partial`, writes its sums to partial[z][M][N]. k ascending in a fixed order:
//! deterministic.
#pragma once

#include <cstdint>

#include "device_common.cuh"
#include "mma_layout.hpp"
#include "mma_ptx.cuh"

namespace greenmim {
namespace detail {
namespace cuda {

//! How an operator's operands are staged (Op::layout): A k-major or not, B k-major or not.
template <bool AKMajor, bool BKMajor>
struct tc_layout {
  static constexpr bool a_kmajor = AKMajor, b_kmajor = BKMajor;
};

constexpr int k_tc_bm = 64, k_tc_bn = 64, k_tc_bk = 32, k_tc_threads = 128;
constexpr int k_tc_pad = 8;  // elements per staged row beyond the tile: 16-byte aligned rows, staggered banks

//! Staged tile geometry of one operand: `kmajor` rows are k (`rows` = 32, `cols` = 64 + pad),
//! else rows are m or n (`rows` = 64, `cols` = 32 + pad).
template <bool KMajor>
struct tc_tile {
  static constexpr int rows = KMajor ? k_tc_bk : k_tc_bm;
  static constexpr int ld = (KMajor ? k_tc_bm : k_tc_bk) + k_tc_pad;
  static constexpr int chunks_per_row = (KMajor ? k_tc_bm : k_tc_bk) / 8;
  static constexpr int chunks = rows * chunks_per_row;  // 256
  static constexpr int per_thread = chunks / k_tc_threads;  // 2
  static constexpr int words = rows * ld / 8;  // uint4 words of shared memory
};

//! 8 elements of `p` (the first `valid` of them in range, the rest zero) packed in 16 bytes: one
//! 16-byte load when all are in range and `p` is 16-byte aligned, else element loads.
template <class T>
__device__ __forceinline__ uint4 load8(const T* p, int valid) {
  if (valid >= 8 && (reinterpret_cast<std::uintptr_t>(p) & 15) == 0) return __ldg(reinterpret_cast<const uint4*>(p));
  unsigned short h[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    T v = from_float<T>(0.f);
    if (e < valid) v = __ldg(p + e);
    memcpy(&h[e], &v, 2);
  }
  uint4 u;
  u.x = h[0] | (static_cast<unsigned>(h[1]) << 16);
  u.y = h[2] | (static_cast<unsigned>(h[3]) << 16);
  u.z = h[4] | (static_cast<unsigned>(h[5]) << 16);
  u.w = h[6] | (static_cast<unsigned>(h[7]) << 16);
  return u;
}

//! Element e of a packed 8-element chunk replaced by `v` (the gathered operands' odd cases).
template <class T>
__device__ __forceinline__ void set8(uint4& u, int e, T v) {
  unsigned short h;
  memcpy(&h, &v, 2);
  unsigned* w = e < 2 ? &u.x : e < 4 ? &u.y : e < 6 ? &u.z : &u.w;
  const int sh = (e & 1) * 16;
  *w = (*w & ~(0xffffu << sh)) | (static_cast<unsigned>(h) << sh);
}

__device__ __forceinline__ uint4 zero_chunk() { return make_uint4(0u, 0u, 0u, 0u); }

//! Dynamic shared memory of gather_gemm_mma<Op> (the operands' staged tiles, ~10 KB).
template <class Op>
constexpr std::size_t gather_gemm_mma_smem() {
  return (tc_tile<Op::layout::a_kmajor>::words + tc_tile<Op::layout::b_kmajor>::words) * sizeof(uint4);
}

//! A CTA's place in the product: its thread and warp, the warp's 32 x 32 outputs (rows wm.., columns
//! wn.. of the tile), the tile's first output (m0, n0), and its split's reduction [k_begin, k_end).
struct tc_cta {
  int tid, lane, wm, wn, m0, n0, k_begin, k_end;
  __device__ __forceinline__ tc_cta(int K, int k_per) {
    tid = static_cast<int>(threadIdx.x);
    lane = tid & 31;
    const int warp = tid >> 5;
    wm = (warp >> 1) * 32;
    wn = (warp & 1) * 32;
    m0 = static_cast<int>(blockIdx.y) * k_tc_bm;
    n0 = static_cast<int>(blockIdx.x) * k_tc_bn;
    k_begin = static_cast<int>(blockIdx.z) * k_per;
    k_end = K - k_begin > k_per ? k_begin + k_per : K;
  }
};

//! The warp's accumulators, zeroed.
__device__ __forceinline__ void tc_zero(float (&acc)[2][4][4]) {
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;
}

//! The warp's 32 x 32 outputs (rows wm.., columns wn.. of the CTA's tile) += one staged step:
//! A's tile at `as` and B's at `bs` (tc_tile layouts), k_tc_bk deep.
template <class Op>
__device__ __forceinline__ void tc_tile_mma(float (&acc)[2][4][4], const typename Op::elem* as,
                                            const typename Op::elem* bs, int lane, int wm, int wn) {
  using TA = tc_tile<Op::layout::a_kmajor>;
  using TB = tc_tile<Op::layout::b_kmajor>;
  using M16 = mma16<typename Op::elem>;
  namespace L = mma_layout;
#pragma unroll
  for (int kk = 0; kk < k_tc_bk / 16; ++kk) {
    unsigned af[2][4];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if constexpr (Op::layout::a_kmajor)
        ldmatrix_x4_trans(af[i], as + (kk * 16 + L::at_ld_row(lane)) * TA::ld + wm + i * 16 + L::at_ld_col(lane));
      else
        ldmatrix_x4(af[i], as + (wm + i * 16 + L::a_ld_row(lane)) * TA::ld + kk * 16 + L::a_ld_col(lane));
    }
#pragma unroll
    for (int np = 0; np < 2; ++np) {  // pairs of n-tiles: columns wn + [16 np, 16 np + 16)
      unsigned bf[4];
      if constexpr (Op::layout::b_kmajor)
        ldmatrix_x4_trans(bf, bs + (kk * 16 + L::bv_ld_row(lane)) * TB::ld + wn + np * 16 + L::bv_ld_col(lane));
      else
        ldmatrix_x4(bf, bs + (wn + np * 16 + L::bk_ld_row(lane)) * TB::ld + kk * 16 + L::bk_ld_col(lane));
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        M16::run(acc[i][2 * np], af[i], bf[0], bf[1]);
        M16::run(acc[i][2 * np + 1], af[i], bf[2], bf[3]);
      }
    }
  }
}

//! The warp's 32 x 32 sums (first row r0, first column c0) to op.store, or with `partial` to
//! partial[blockIdx.z][M][N]; outputs outside [0, M) x [0, N) dropped.
template <class Op>
__device__ __forceinline__ void tc_store_tile(const Op& op, const float (&acc)[2][4][4], int r0, int c0, int lane,
                                              float* partial) {
  namespace L = mma_layout;
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = r0 + i * 16 + L::acc_row(lane, e), c = c0 + j * 8 + L::acc_col(lane, e);
        if (r >= op.M || c >= op.N) continue;
        if (partial)
          partial[(static_cast<std::int64_t>(blockIdx.z) * op.M + r) * op.N + c] = acc[i][j][e];
        else
          op.store(r, c, acc[i][j][e]);
      }
}

template <class Op>
__global__ void __launch_bounds__(k_tc_threads) gather_gemm_mma(const Op op, const int k_per, float* partial) {
  using T = typename Op::elem;
  using TA = tc_tile<Op::layout::a_kmajor>;
  using TB = tc_tile<Op::layout::b_kmajor>;
  GM_DYNAMIC_SMEM(smem);  // gather_gemm_mma_smem<Op>() bytes: A's tile, then B's
  uint4* const a_smem = reinterpret_cast<uint4*>(smem);
  uint4* const b_smem = a_smem + TA::words;
  T* const as = reinterpret_cast<T*>(a_smem);
  T* const bs = reinterpret_cast<T*>(b_smem);

  const tc_cta c(op.K, k_per);
  const int tid = c.tid, lane = c.lane, wm = c.wm, wn = c.wn, m0 = c.m0, n0 = c.n0, k_begin = c.k_begin,
            k_end = c.k_end;

  uint4 ra[TA::per_thread], rb[TB::per_thread];
  // the operands' chunks of step k0 into registers
  auto fetch = [&](int k0) {
#pragma unroll
    for (int j = 0; j < TA::per_thread; ++j) {
      const int i = tid + j * k_tc_threads, r = i / TA::chunks_per_row, c = (i % TA::chunks_per_row) * 8;
      ra[j] = Op::layout::a_kmajor ? op.a8(m0 + c, k0 + r, k_end) : op.a8(m0 + r, k0 + c, k_end);
    }
#pragma unroll
    for (int j = 0; j < TB::per_thread; ++j) {
      const int i = tid + j * k_tc_threads, r = i / TB::chunks_per_row, c = (i % TB::chunks_per_row) * 8;
      rb[j] = Op::layout::b_kmajor ? op.b8(k0 + r, n0 + c, k_end) : op.b8(k0 + c, n0 + r, k_end);
    }
  };

  float acc[2][4][4];
  tc_zero(acc);

  if (k_begin < k_end) fetch(k_begin);
  for (int k0 = k_begin; k0 < k_end; k0 += k_tc_bk) {
#pragma unroll
    for (int j = 0; j < TA::per_thread; ++j) {
      const int i = tid + j * k_tc_threads;
      a_smem[(i / TA::chunks_per_row) * (TA::ld / 8) + i % TA::chunks_per_row] = ra[j];
    }
#pragma unroll
    for (int j = 0; j < TB::per_thread; ++j) {
      const int i = tid + j * k_tc_threads;
      b_smem[(i / TB::chunks_per_row) * (TB::ld / 8) + i % TB::chunks_per_row] = rb[j];
    }
    __syncthreads();
    if (k0 + k_tc_bk < k_end) fetch(k0 + k_tc_bk);  // in flight while the tensor cores run
    tc_tile_mma<Op>(acc, as, bs, lane, wm, wn);
    __syncthreads();
  }

  tc_store_tile(op, acc, m0 + wm, n0 + wn, lane, partial);
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
