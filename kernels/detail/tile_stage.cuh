//! \file tile_stage.cuh
//! Private: what the attention kernels stage in shared memory and write back: the group's slot
//! ids and coordinates, the head's bias column, 16-bit row tiles read through `gather`, and
//! accumulator blocks written to the token rows with 16-byte stores.
#pragma once

#include <climits>
#include <cstdint>

#include "attention_params.hpp"
#include "device_common.cuh"
#include "mma_layout.hpp"
#include "mma_ptx.cuh"

namespace greenmim {
namespace detail {
namespace cuda {

//! Slot ids and coordinates of the group starting at slot `base` into win[0, n), crd[0, n)
//! (n >= G; slots from G on are padding). A slot is real iff its window id is >= 0 and its token
//! lies in [0, N); anything else is padding (pad_index, coordinate 0). `on_slot(i, w, t)` sees
//! each slot's id and token (t meaningful only where w >= 0). Threads stride by Threads.
template <int Threads, class OnSlot>
__device__ __forceinline__ void stage_slots(const partition_view& part, std::int64_t base, int n, index_t* win,
                                            index_t* crd, OnSlot on_slot) {
  const int G = part.group_size;
  for (int i = threadIdx.x; i < n; i += Threads) {
    index_t w = pad_index, c = 0, t = pad_index;
    if (i < G) {
      t = part.gather[base + i];
      const index_t sw = part.slot_window[base + i];
      w = (sw >= 0 && t >= 0 && t < part.num_tokens) ? sw : pad_index;
      c = part.slot_coord != nullptr ? part.slot_coord[base + i] : 0;
    }
    win[i] = w;
    crd[i] = c;
    on_slot(i, w, t);
  }
}
template <int Threads>
__device__ __forceinline__ void stage_slots(const partition_view& part, std::int64_t base, int n, index_t* win,
                                            index_t* crd) {
  stage_slots<Threads>(part, base, n, win, crd, [](int, index_t, index_t) {});
}

//! The bias column of head h into bias_s (nothing without a table).
template <int Threads>
__device__ __forceinline__ void stage_bias_column(const table2f& bias, int h, float* bias_s) {
  if (bias.data != nullptr)
    for (int r = threadIdx.x; r < bias.rows; r += Threads) bias_s[r] = __ldg(bias.data + r * bias.s0 + h * bias.s1);
}

//! [lo, hi) = the smallest slot range holding every slot of window `w` (any slot layout; the
//! builders make it exactly the window's run). Empty (INT_MAX, INT_MIN) for padding.
__device__ __forceinline__ void window_range(const index_t* win, int G, index_t w, int& lo, int& hi) {
  lo = INT_MAX;
  hi = INT_MIN;
  if (w < 0) return;
  for (int x = 0; x < G; ++x)
    if (attends(w, win[x])) {
      lo = lo < x ? lo : x;
      hi = x + 1;
    }
}

//! Prologue of a tiled tensor-core CTA: slot ids and coordinates of the whole group (padding up to
//! MaxG), the head's bias column, and range = the union of the window ranges of the tile's rows
//! [t0, t0 + Rows) (empty: INT_MAX, INT_MIN), the slots the tile's rows attend. Ends with a barrier.
template <int Threads, int Rows, int MaxG>
__device__ __forceinline__ void stage_group_range(const partition_view& part, const table2f& bias, std::int64_t base,
                                                  int t0, int h, index_t* win, index_t* crd, float* bias_s,
                                                  int* range) {
  const int G = part.group_size;
  stage_slots<Threads>(part, base, MaxG, win, crd);
  stage_bias_column<Threads>(bias, h, bias_s);
  if (threadIdx.x == 0) {
    range[0] = INT_MAX;
    range[1] = INT_MIN;
  }
  __syncthreads();
  if (threadIdx.x < Rows) {
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

//! Stages the Rows rows [t0, t0 + Rows) of a 16-bit [B, N, heads, D] tensor into `dst` (row
//! stride LDS) with 16-byte loads through `gather`; rows from `hi` on and padding are zero.
//! Returns whether every staged real row is finite.
template <class T, int D, int Rows, int Threads, int LDS>
__device__ __forceinline__ bool stage_rows16(T* dst, const rows4<const T>& src, const index_t* gather,
                                             const index_t* win, int t0, int hi, int b, int h) {
  constexpr int CH = D * 2 / 16;
  bool finite = true;
#pragma unroll
  for (int it = 0; it < Rows * CH / Threads; ++it) {
    const int idx = threadIdx.x + it * Threads;
    const int r = idx / CH, c = idx % CH, x = t0 + r;
    uint4 u = make_uint4(0, 0, 0, 0);
    if (x < hi && win[x] >= 0) {
      u = __ldg(reinterpret_cast<const uint4*>(src.row(b, gather[x], h)) + c);
      finite = finite && mma16<T>::finite8(u);
    }
    *reinterpret_cast<uint4*>(dst + r * LDS + c * 8) = u;
  }
  return finite;
}

//! Packs a warp's 16 x (8 DT) fp32 accumulator block (rows r0 + acc_row) into 16-bit rows of
//! `dst` (row stride ld), row a multiplied by mul_a and row b by mul_b.
template <class T, int DT>
__device__ __forceinline__ void stage_acc(T* dst, int ld, int r0, int lane, const float (&acc)[DT][4], float mul_a,
                                          float mul_b) {
  namespace L = mma_layout;
  const int ra = r0 + L::acc_row(lane, 0), rb = r0 + L::acc_row(lane, 2);
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) {
    const int c = dt * 8 + L::acc_col(lane, 0);
    *reinterpret_cast<unsigned*>(dst + ra * ld + c) = mma16<T>::pack(acc[dt][0] * mul_a, acc[dt][1] * mul_a);
    *reinterpret_cast<unsigned*>(dst + rb * ld + c) = mma16<T>::pack(acc[dt][2] * mul_b, acc[dt][3] * mul_b);
  }
}
template <class T, int DT>
__device__ __forceinline__ void stage_acc(T* dst, int ld, int r0, int lane, const float (&acc)[DT][4], float mul) {
  stage_acc<T, DT>(dst, ld, r0, lane, acc, mul, mul);
}

//! Writes the 16 staged rows [r0, r0 + 16) of `src` (row stride ld) to the token rows of the real
//! slots of `out` with 16-byte stores (one warp); padding rows are never written.
template <class T, int D>
__device__ __forceinline__ void write_rows(const rows4<T>& out, const T* src, int ld, int r0, int lane,
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

//! Stages the Q, K, V rows of a one-pass group (rows [0, Rows), 16-byte loads, all three in one
//! loop); row r < G of token t = gather[r] is loaded where real(r, t), else (and from G on) it is a
//! zero row. Returns whether every staged V row is finite.
template <class T, int D, int Rows, int Threads, int LDS, class Real>
__device__ __forceinline__ bool stage_qkv(T* qs, T* ks, T* vs, const fwd_params<T>& p, const index_t* gather, int G,
                                          Real real, int b, int h) {
  constexpr int CH = D * 2 / 16;
  bool finite = true;
#pragma unroll
  for (int it = 0; it < Rows * CH / Threads; ++it) {
    const int idx = threadIdx.x + it * Threads;
    const int r = idx / CH, c = idx % CH;
    uint4 uq = make_uint4(0, 0, 0, 0), uk = uq, uv = uq;
    if (r < G) {
      const index_t t = gather[r];
      if (real(r, t)) {
        uq = __ldg(reinterpret_cast<const uint4*>(p.q.row(b, t, h)) + c);
        uk = __ldg(reinterpret_cast<const uint4*>(p.k.row(b, t, h)) + c);
        uv = __ldg(reinterpret_cast<const uint4*>(p.v.row(b, t, h)) + c);
        finite = finite && mma16<T>::finite8(uv);
      }
    }
    *reinterpret_cast<uint4*>(qs + r * LDS + c * 8) = uq;
    *reinterpret_cast<uint4*>(ks + r * LDS + c * 8) = uk;
    *reinterpret_cast<uint4*>(vs + r * LDS + c * 8) = uv;
  }
  return finite;
}

//! Forward epilogue of one warp: O / l (row sums la, lb, already summed over the quad) staged
//! through the warp's own Q rows [r0, r0 + 16), lse = m + log(l) of the lane's two rows when
//! requested (real slots only: `row_windows(wa, wb)` gives their windows, called only there, so a
//! kernel may read them late from shared memory), then the rows of real slots written with
//! 16-byte stores. `win` and `gather` start at the tile's first slot.
template <class T, int D, int LDS, class RowWindows>
__device__ __forceinline__ void write_fwd_rows(const fwd_params<T>& p, T* qs, const float (&o)[D / 8][4], float ma,
                                               float mb, float la, float lb, RowWindows row_windows,
                                               const index_t* win, const index_t* gather, int r0, int lane, int b,
                                               int h) {
  namespace L = mma_layout;
  const float ia = 1.f / la, ib = 1.f / lb;
  __syncwarp();  // every lane is done reading this warp's Q rows
  stage_acc<T, D / 8>(qs, LDS, r0, lane, o, ia, ib);
  if (L::tig(lane) == 0 && p.lse.data != nullptr) {
    index_t wa, wb;
    row_windows(wa, wb);
    if (wa >= 0) *p.lse.at(b, gather[r0 + L::acc_row(lane, 0)], h) = ma + logf(la);
    if (wb >= 0) *p.lse.at(b, gather[r0 + L::acc_row(lane, 2)], h) = mb + logf(lb);
  }
  __syncwarp();
  write_rows<T, D>(p.o, qs, LDS, r0, lane, win, gather, b, h);
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
