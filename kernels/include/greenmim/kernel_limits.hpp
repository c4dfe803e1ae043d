//! \file kernel_limits.hpp
//! What the CUDA attention kernels accept, for host code that plans for them without the CUDA
//! headers (the CLI's "cuda" note, the planner cap of the Python package): the macros of
//! kernel_limits.h as constants, the planner cap that keeps a stage on the tensor-core kernels,
//! and the kernels' refusal of a stage in words. The CPU reference (reference/attention.hpp) has
//! none of these limits.
#pragma once

#include <cstdint>
#include <string>

#include <greenmim/config.hpp>
#include <greenmim/kernel_limits.h>

namespace greenmim {

//! Largest window p, group size G (CUDA cores), and group size of the tensor-core kernels
//! (GM_ALGO_MMA, fp16/bf16: the fast path; above it, up to cuda_max_group, the CUDA-core kernels).
constexpr index_t cuda_max_window = GM_MAX_WINDOW;
constexpr index_t cuda_max_group = GM_SIMT_MAX_GROUP;
constexpr index_t cuda_mma_max_group = GM_MMA_MAX_GROUP;

//! The planner cap (planner_options::max_group_size) that keeps a stage of window `window` on
//! the tensor-core path: cuda_mma_max_group when a full p x p window fits under it (windows up
//! to 16), else 0 (no cap: such windows need G > 256 anyway). The planner's own optimum may lie
//! above the largest window (e.g. G = 65 for windows of 49, or 272 for windows of 256); the cap
//! trades that (small) saving for the fast kernels.
inline index_t fast_path_max_group(index_t window) {
  return window > 0 && static_cast<std::int64_t>(window) * window <= cuda_mma_max_group ? cuda_mma_max_group : 0;
}

//! Why the CUDA attention (gm_attention_fwd/bwd) would refuse a stage that runs window `window`
//! (the effective one, after Swin's small-stage rule), groups of `group_size` tokens and heads of
//! `head_dim`; empty when it accepts them. O(1).
inline std::string cuda_attention_refusal(index_t window, index_t group_size, index_t head_dim) {
  std::string why;
  auto add = [&why](const std::string& s) { why += (why.empty() ? "" : "; ") + s; };
  if (window > cuda_max_window)
    add("window " + std::to_string(window) + " > GM_MAX_WINDOW " + std::to_string(cuda_max_window));
  if (group_size > cuda_max_group)
    add("group size " + std::to_string(group_size) + " > GM_SIMT_MAX_GROUP " + std::to_string(cuda_max_group));
  if (head_dim != 32 && head_dim != 64) add("head_dim " + std::to_string(head_dim) + " is not 32 or 64");
  return why;
}

}  // namespace greenmim
