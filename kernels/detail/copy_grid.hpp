//! \file copy_grid.hpp
//! Private: the launch shape of partition.cu's row copy (gather / scatter), host-only arithmetic
//! with no CUDA calls, so that the host tests check it for any shape and device size.
#pragma once

#include <cstdint>

namespace greenmim {
namespace detail {
namespace cuda {

constexpr int k_copy_threads = 256;  //!< threads per CTA
constexpr int k_resident_ctas = 4;   //!< CTAs per SM that __launch_bounds__ guarantees (<= 64 registers)
constexpr int k_copy_vectors = 8;    //!< loads in flight per thread and pass

//! Launch shape of `copy_rows<V, k>`: teams of 2^tpr_log2 lanes per row, k chunks of the row per
//! lane and pass, `spt` samples per thread and pass (k * spt <= k_copy_vectors), grid gx x gy.
struct copy_grid {
  int k = 1;
  int tpr_log2 = 0;
  int spt = 1;
  std::int64_t gx = 0, gy = 0;
};

//! `dst_rows` destination rows per sample of `chunks` vector chunks each, `batch` samples, on a
//! device with `sm_count` SMs. One wave holds sm_count * k_resident_ctas CTAs. Chooses the fewest
//! samples per thread for which the whole grid fits one wave (the most CTAs, spread over the most
//! SMs, while every load of the problem can be in flight at once); when even k_copy_vectors / k
//! samples per thread do not fit, every thread runs several passes of that many samples, with gy
//! chosen so that the passes are balanced (no last wave of a few CTAs). gy <= 65535 (the kernel
//! strides over the samples, so any batch is covered). O(k_copy_vectors).
inline copy_grid plan_copy_grid(std::int64_t dst_rows, std::int64_t chunks, std::int64_t batch, int sm_count) {
  copy_grid g;
  while ((std::int64_t{1} << g.tpr_log2) < chunks && g.tpr_log2 < 5) ++g.tpr_log2;
  const std::int64_t tpr = std::int64_t{1} << g.tpr_log2;
  const std::int64_t per_lane = (chunks + tpr - 1) / tpr;
  while (g.k < per_lane && g.k < k_copy_vectors) g.k *= 2;
  const int s_max = k_copy_vectors / g.k;
  g.gx = ((dst_rows << g.tpr_log2) + k_copy_threads - 1) / k_copy_threads;
  if (g.gx < 1) g.gx = 1;
  if (batch < 1) batch = 1;
  const std::int64_t capacity = static_cast<std::int64_t>(sm_count > 0 ? sm_count : 1) * k_resident_ctas;
  g.spt = s_max;
  for (int s = 1; s <= s_max; ++s)
    if (g.gx * ((batch + s - 1) / s) <= capacity) {
      g.spt = s;
      break;
    }
  const std::int64_t slices = (batch + g.spt - 1) / g.spt;
  g.gy = slices;
  if (g.gx * slices > capacity) {
    const std::int64_t gy_max = capacity / g.gx > 1 ? capacity / g.gx : 1;
    const std::int64_t passes = (slices + gy_max - 1) / gy_max;
    g.gy = (slices + passes - 1) / passes;
  }
  if (g.gy > 65535) g.gy = 65535;
  return g;
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
