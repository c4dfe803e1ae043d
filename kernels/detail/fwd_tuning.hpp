//! \file fwd_tuning.hpp
//! Private: how many heads one CTA of the tensor-core forward handles (attention_mma.cuh:
//! `attention_fwd_mma` for one, `attention_fwd_mma_heads` for several), as host-only arithmetic
//! tested on the host, plus a hook for tests and benchmarks.
#pragma once

#include <cstdint>

namespace greenmim {
namespace detail {
namespace cuda {

//! Resident CTAs per SM of the one-head kernel (63 registers x 128 threads: ncu on the H100 run,
//! "Block Limit Registers 8").
constexpr int k_fwd_mma_ctas_per_sm = 8;

//! Heads per CTA: the most of {4, 2} (at most `heads`, and whose shared memory fits: `fits4`,
//! `fits2`) for which the grid (groups x ceil(heads / c) x batch CTAs) still holds two full waves
//! of the one-head kernel's residency on `sm_count` SMs; else 1. Sharing the head-independent work
//! costs nothing where the grid stays that large; below it, fewer and longer CTAs would leave SMs
//! idle or hide latency worse. (A first-principles rule, not yet tuned on a device.)
inline int fwd_mma_heads_per_cta(std::int64_t groups, std::int64_t heads, std::int64_t batch, int sm_count, bool fits4,
                                 bool fits2) {
  const std::int64_t two_waves = 2 * static_cast<std::int64_t>(sm_count > 0 ? sm_count : 1) * k_fwd_mma_ctas_per_sm;
  const int cands[2] = {4, 2};
  const bool fits[2] = {fits4, fits2};
  for (int i = 0; i < 2; ++i) {
    const int c = cands[i];
    if (c > heads || !fits[i]) continue;
    if (groups * ((heads + c - 1) / c) * batch >= two_waves) return c;
  }
  return 1;
}

//! Test and benchmark hook: when > 0, the heads per CTA to use instead of the choice above
//! (capped at the number of heads and at what fits in shared memory; 1 = the one-head kernel).
//! Process-wide and not synchronized: set it only while no forward is being launched.
int& fwd_mma_heads_override();

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
