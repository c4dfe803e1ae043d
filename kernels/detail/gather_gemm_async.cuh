//! \file gather_gemm_async.cuh
//! Private: gather_gemm_mma's product (same tiles, warps, k order and sums, bit for bit) with its
//! operands copied straight to shared memory by cp.async in a k_tc_stages-deep ring, for the
//! operators whose 16-byte chunks are whole and aligned: A rows gathered through a table, B
//! dense, both row-major along k (tc_layout<false, false>). The block conv's forward uses it
//! when C_in is a multiple of 8 and x is 16-byte aligned (block_conv.cu).
//!
//! Why: the register-staged kernel holds one step in flight and stops at two barriers a step; its
//! gathered A waits on two dependent loads (the table, then x). Here:
//! - k_tc_stages - 1 steps are in flight while the tensor cores run on the oldest;
//! - one barrier a step (the ring's slot written at step s was last read at step s - 1);
//! - the table entries of step s + k_tc_stages are loaded one step before their copies are issued,
//!   so the dependent load is hidden behind a step of MMAs as well.
//!
//! The operator provides, besides gather_gemm_mma's interface:
//! - `index_t a_token(int m, int k) const`: the table lookup of A's chunk (m, k .. k+8), or
//!   pad_index when the chunk is all zeros (m < M, k < k_end asked only);
//! - `const T* a_ptr(index_t token, int m, int k) const`: that chunk's 8 elements, 16-byte aligned;
//! - `const T* b_ptr(int k, int n) const`: B[k .. k+8)[n], 16-byte aligned (n < N, k < k_end);
//! and guarantees that no chunk straddles k_end (K and k_per multiples of 8).
#pragma once

#include "gather_gemm_mma.cuh"

namespace greenmim {
namespace detail {
namespace cuda {

constexpr int k_tc_stages = 3;

//! Dynamic shared memory of gather_gemm_async<Op>: k_tc_stages of gather_gemm_mma's (~30 KB).
template <class Op>
constexpr std::size_t gather_gemm_async_smem() {
  return k_tc_stages * gather_gemm_mma_smem<Op>();
}

template <class Op>
__global__ void __launch_bounds__(k_tc_threads) gather_gemm_async(const Op op, const int k_per, float* partial) {
  static_assert(!Op::layout::a_kmajor && !Op::layout::b_kmajor, "gather_gemm_async: A and B row-major along k");
  using T = typename Op::elem;
  using TA = tc_tile<false>;
  using TB = tc_tile<false>;
  constexpr int S = k_tc_stages, stage_words = TA::words + TB::words;
  GM_DYNAMIC_SMEM(smem);  // gather_gemm_async_smem<Op>() bytes: per stage, A's tile then B's
  uint4* const ring = reinterpret_cast<uint4*>(smem);

  const tc_cta c(op.K, k_per);
  const int tid = c.tid, lane = c.lane, wm = c.wm, wn = c.wn, m0 = c.m0, n0 = c.n0, k_begin = c.k_begin,
            k_end = c.k_end;
  const int steps = k_begin < k_end ? (k_end - k_begin + k_tc_bk - 1) / k_tc_bk : 0;

  // This thread's chunks: A's j-th at row i / chunks_per_row, column (i % chunks_per_row) * 8 of
  // the tile (i = tid + j * threads), B's likewise (rows are n).
  index_t tok[TA::per_thread];  // A's table entries for the next step to be issued
  auto lookup = [&](int s) {
#pragma unroll
    for (int j = 0; j < TA::per_thread; ++j) {
      const int i = tid + j * k_tc_threads, m = m0 + i / TA::chunks_per_row;
      const int k = k_begin + s * k_tc_bk + (i % TA::chunks_per_row) * 8;
      tok[j] = s < steps && m < op.M && k < k_end ? op.a_token(m, k) : pad_index;
    }
  };
  auto issue = [&](int s) {
    if (s < steps) {
      uint4* const sa = ring + (s % S) * stage_words;
      uint4* const sb = sa + TA::words;
#pragma unroll
      for (int j = 0; j < TA::per_thread; ++j) {
        const int i = tid + j * k_tc_threads, r = i / TA::chunks_per_row, c = (i % TA::chunks_per_row) * 8;
        uint4* const dst = sa + r * (TA::ld / 8) + c / 8;
        if (tok[j] != pad_index) cp_async16(dst, op.a_ptr(tok[j], m0 + r, k_begin + s * k_tc_bk + c));
        else *dst = zero_chunk();
      }
#pragma unroll
      for (int j = 0; j < TB::per_thread; ++j) {
        const int i = tid + j * k_tc_threads, r = i / TB::chunks_per_row, c = (i % TB::chunks_per_row) * 8;
        const int n = n0 + r, k = k_begin + s * k_tc_bk + c;
        uint4* const dst = sb + r * (TB::ld / 8) + c / 8;
        if (n < op.N && k < k_end) cp_async16(dst, op.b_ptr(k, n));
        else *dst = zero_chunk();
      }
    }
    cp_async_commit();  // empty past the last step: the group count stays one per step
  };

  float acc[2][4][4];
  tc_zero(acc);

#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    lookup(s);
    issue(s);
  }
  lookup(S - 1);
  for (int s = 0; s < steps; ++s) {
    cp_async_wait<S - 2>();  // this thread's copies of step s have landed ...
    __syncthreads();         // ... everyone's; and step s - 1's slot is no longer read
    issue(s + S - 1);        // into step s - 1's slot
    lookup(s + S);           // its loads complete behind this step's MMAs
    const uint4* const sa = ring + (s % S) * stage_words;
    tc_tile_mma<Op>(acc, reinterpret_cast<const T*>(sa), reinterpret_cast<const T*>(sa + TA::words), lane, wm, wn);
  }
  cp_async_wait<0>();

  tc_store_tile(op, acc, m0 + wm, n0 + wn, lane, partial);
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
