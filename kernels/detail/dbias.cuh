//! \file dbias.cuh
//! Private: the deterministic gradient of the relative-position bias table. No float atomics: the
//! tensor-core backward sums its fp32 dS tile into per-warp private table rows in shared memory
//! (for one key, the lanes of a warp that attend it lie in one window with distinct coordinates,
//! hence distinct buckets: one step's read-modify-writes touch distinct addresses, __syncwarp
//! orders the steps), then the warps' rows in warp order into the CTA's partial in the
//! workspace; `dbias_reduce` (attention_bwd.cu) sums the partials of all CTAs in a fixed order. Bitwise identical
//! run to run.
#pragma once

#include <cstdint>

#include "attention_params.hpp"
#include "device_common.cuh"
#include "mask.cuh"

namespace greenmim {
namespace detail {
namespace cuda {

//! Adds dS of the query slot of row i (window wi, coordinate ci) against the keys [j0, j1) of a
//! staged fp32 tile (row stride LDF; key j is the slot of win[j], crd[j]) into the warp's table
//! row `mine`, one key per step.
template <int LDF>
__device__ __forceinline__ void dbias_add_row(float* mine, const float* dsf, int i, index_t wi, index_t ci,
                                              const index_t* win, const index_t* crd, int j0, int j1, int window,
                                              int rows) {
  for (int j = j0; j < j1; ++j) {
    if (attends(wi, win[j])) {
      const int r = pair_bucket(ci, crd[j], window, rows);
      if (r >= 0) mine[r] += dsf[i * LDF + j];
    }
    __syncwarp();  // orders this step's read-modify-writes before the next step's
  }
}

//! The CTA's partial: the 4 warps' table rows summed in warp order.
template <int Threads>
__device__ __forceinline__ void dbias_write_partial(float* out, const float* wbuf, int rows) {
  for (int r = threadIdx.x; r < rows; r += Threads)
    out[r] = ((wbuf[r] + wbuf[rows + r]) + wbuf[2 * rows + r]) + wbuf[3 * rows + r];
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
