//! \file mma_layout.hpp
//! Private: the lane -> matrix-coordinate maps of the tensor-core kernels,
//! as host/device constexpr functions so that a host test (test/gpu/test_mma_layout.cpp) can
//! drive an emulation of ldmatrix / mma.sync (written from the PTX ISA fragment tables) with
//! exactly the addressing the kernel uses.
//!
//! mma.sync.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"):
//! lane = 4 * group + tig. Accumulator element e in 0..3 of a lane sits at row group + 8*(e >= 2),
//! column 2*tig + (e & 1) of the 16x8 tile. ldmatrix.x4: lanes 8i..8i+7 give the row addresses
//! of matrix i (8 rows of 8 16-bit elements); register i of every lane receives matrix i.
#pragma once

#include <greenmim/config.hpp>

namespace greenmim {
namespace detail {
namespace cuda {
namespace mma_layout {

GREENMIM_HOST_DEVICE constexpr int group(int lane) { return lane >> 2; }
GREENMIM_HOST_DEVICE constexpr int tig(int lane) { return lane & 3; }

//! Row / column of accumulator element e (0..3) of `lane` inside its 16x8 tile.
GREENMIM_HOST_DEVICE constexpr int acc_row(int lane, int e) { return group(lane) + (e >= 2 ? 8 : 0); }
GREENMIM_HOST_DEVICE constexpr int acc_col(int lane, int e) { return 2 * tig(lane) + (e & 1); }

//! A operand (16 x 16, row-major in smem, rows = queries, columns = head dims): the row and
//! column offset whose address `lane` passes to ldmatrix.x4, so that the four registers are
//! a0..a3 = (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
GREENMIM_HOST_DEVICE constexpr int a_ld_row(int lane) { return lane & 15; }
GREENMIM_HOST_DEVICE constexpr int a_ld_col(int lane) { return (lane >> 4) * 8; }

//! B operand of S = Q K^T from K rows (n-major: rows = keys, columns = head dims), two key
//! n-tiles per ldmatrix.x4: registers = b0, b1 of keys 0-7, then b0, b1 of keys 8-15.
GREENMIM_HOST_DEVICE constexpr int bk_ld_row(int lane) { return (lane & 7) + ((lane >> 4) << 3); }
GREENMIM_HOST_DEVICE constexpr int bk_ld_col(int lane) { return ((lane >> 3) & 1) * 8; }

//! B operand of O = P V from V rows (k-major: rows = keys, columns = head dims) with
//! ldmatrix.x4.trans, two head-dim n-tiles per call: registers = b0, b1 of dims 0-7, then b0, b1
//! of dims 8-15.
GREENMIM_HOST_DEVICE constexpr int bv_ld_row(int lane) { return lane & 15; }
GREENMIM_HOST_DEVICE constexpr int bv_ld_col(int lane) { return (lane >> 4) * 8; }

//! A operand (16 x 16, rows m, columns k) read with ldmatrix.x4.TRANS from a matrix stored
//! k-major (smem rows = k, columns = m): registers a0..a3 = (m 0-7, k 0-7), (m 8-15, k 0-7),
//! (m 0-7, k 8-15), (m 8-15, k 8-15). The backward's P^T and dS^T from [query][key] tiles. The
//! addresses are those of bk_ld (what differs is .trans).
GREENMIM_HOST_DEVICE constexpr int at_ld_row(int lane) { return bk_ld_row(lane); }
GREENMIM_HOST_DEVICE constexpr int at_ld_col(int lane) { return bk_ld_col(lane); }

//! The accumulators of two adjacent 16x8 tiles (keys [16c, 16c+8) and [16c+8, 16c+16)) are the
//! A fragment of the 16x16 tile of keys [16c, 16c+16): pack(lo, hi) puts `lo` in the low half.
template <class Pack>
GREENMIM_HOST_DEVICE void acc_to_a(const float (&lo)[4], const float (&hi)[4], unsigned (&a)[4], Pack pack) {
  a[0] = pack(lo[0], lo[1]);
  a[1] = pack(lo[2], lo[3]);
  a[2] = pack(hi[0], hi[1]);
  a[3] = pack(hi[2], hi[3]);
}

}  // namespace mma_layout
}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
