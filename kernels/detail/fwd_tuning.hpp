//! \file fwd_tuning.hpp
//! Private: how many heads one CTA of the one-pass tensor-core forward handles
//! (attention_fwd_mma.cuh: `attention_fwd_mma` for one, `attention_fwd_mma_heads` for several),
//! as host arithmetic tested on the host, and the forward entry point with that choice explicit.
#pragma once

#include <cstdint>

#include <greenmim/kernels.h>

namespace greenmim {
namespace detail {
namespace cuda {

//! Resident CTAs per SM of the one-head kernel at head_dim 32 (its registers allow 8 of its
//! 128-thread CTAs; docs/perf/kernel-journal.md).
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

//! Launch choices of the forward that gm_attention_fwd makes itself.
struct fwd_tuning {
  //! Heads per CTA of the one-pass tensor-core forward: 0 = fwd_mma_heads_per_cta's choice; else
  //! that many, capped at the heads and at what fits in shared memory (1 = the one-head kernel).
  int heads_per_cta = 0;
};

//! gm_attention_fwd with explicit launch choices (gm_attention_fwd is this with fwd_tuning{}):
//! what tests and benchmarks use to compare the choices, with no process-wide state.
cudaError_t attention_fwd(const gm_attention_fwd_args* args, const fwd_tuning& tuning, cudaStream_t stream);

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
