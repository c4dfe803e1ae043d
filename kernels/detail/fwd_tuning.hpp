//! \file fwd_tuning.hpp
//! Private: how many heads one CTA of the one-pass tensor-core forward handles
//! (attention_fwd_mma.cuh: `attention_fwd_mma` for one, `attention_fwd_mma_heads` for several),
//! and the forward entry point with that choice explicit.
#pragma once

#include <greenmim/kernels.h>

namespace greenmim {
namespace detail {
namespace cuda {

//! The automatic choice is one head per CTA. The rule it replaces (several heads wherever the grid
//! kept two waves of the one-head kernel) was measured on an H200 (docs/perf/NVIDIA_H200_2026-11-25,
//! docs/perf/NVIDIA_H200_2026-11-26): two heads per CTA were 17-20% slower than one at Swin-B
//! stage 1 (batch 128, bf16, head_dim 32) and 8% slower at stage 3, at the same occupancy; no
//! shape measured favoured several heads. The several-heads kernel stays reachable through
//! `fwd_tuning::heads_per_cta` for benchmarks (greenmim_gpu_bench's "2 heads/CTA" row) and tests.

//! Launch choices of the forward that gm_attention_fwd makes itself.
struct fwd_tuning {
  //! Heads per CTA of the one-pass tensor-core forward: 0 = the automatic choice (one); else that
  //! many, capped at the heads and at what fits in shared memory (1 = the one-head kernel).
  int heads_per_cta = 0;
};

//! gm_attention_fwd with explicit launch choices (gm_attention_fwd is this with fwd_tuning{}):
//! what tests and benchmarks use to compare the choices, with no process-wide state.
cudaError_t attention_fwd(const gm_attention_fwd_args* args, const fwd_tuning& tuning, cudaStream_t stream);

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
