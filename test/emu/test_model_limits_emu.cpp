//! \file test_model_limits_emu.cpp
//! kernel_limits.hpp states the CUDA attention's limits on the host (cuda_max_window, cuda_max_group,
//! cuda_mma_max_group: the planner cap of fast_path_max_group)
//! so the CLI and a trainer can say which path runs a stage without the CUDA headers: they must
//! be kernels.h's GM_MAX_WINDOW and GM_SIMT_MAX_GROUP, and the kernels must refuse just beyond.
#include <doctest/doctest.h>

#include "cuda_emu.hpp"

#include <greenmim/kernels.h>
#include <greenmim/kernel_limits.hpp>

static_assert(greenmim::cuda_max_window == GM_MAX_WINDOW, "models.hpp: cuda_max_window != GM_MAX_WINDOW");
static_assert(greenmim::cuda_max_group == GM_SIMT_MAX_GROUP, "models.hpp: cuda_max_group != GM_SIMT_MAX_GROUP");
static_assert(greenmim::cuda_mma_max_group == GM_MMA_MAX_GROUP, "models.hpp: cuda_mma_max_group != GM_MMA_MAX_GROUP");

TEST_CASE("models.hpp's CUDA limits are kernels.h's") {
  CHECK(greenmim::cuda_attention_refusal(GM_MAX_WINDOW, GM_SIMT_MAX_GROUP, 32).empty());
  CHECK(!greenmim::cuda_attention_refusal(GM_MAX_WINDOW + 1, 1, 32).empty());
  CHECK(!greenmim::cuda_attention_refusal(1, GM_SIMT_MAX_GROUP + 1, 32).empty());
}
