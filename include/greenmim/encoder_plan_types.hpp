//! \file encoder_plan_types.hpp
//! The layout of an encoder plan (encoder_plan.hpp builds it, twins_plan.hpp reuses its
//! partitions): the encoder's geometry and planning options, and the plan as ranges of one int32
//! arena, per stage and per window shift.
#pragma once

#include <cstdint>
#include <vector>

#include "config.hpp"
#include "planner.hpp"

namespace greenmim {

//! A square encoder: stage s has a `(grid >> s)` square token grid, `embed_dim << s` channels
//! (the cost model's C) and windows of `window` tokens (Swin's small-stage rule applies).
struct encoder_geometry {
  index_t grid = 56;       //!< stage-1 token grid side (image / patch)
  index_t window = 7;      //!< window side in tokens
  index_t num_stages = 4;
  index_t embed_dim = 128; //!< channels of stage 1
};

struct encoder_plan_options {
  strategy strat = strategy::fast;
  index_t group_size = 0;      //!< > 0 fixes G at every stage (fast and paper only)
  //! Fixes G at each stage to its window's area p*p (capped at the stage's token count, as any
  //! fixed G; fast and paper only): plans of different masks then differ in their number of
  //! groups alone (what torch.compile's dynamic shapes need).
  bool window_area_groups = false;
  index_t max_group_size = 0;  //!< > 0 caps G at every stage; 0: see stage_cap
  //! When set (and neither group_size nor max_group_size is, with fast or paper): the cap of a
  //! stage whose effective window is `w` (e.g. a kernel's fast-path limit); 0 means none.
  index_t (*stage_cap)(index_t w) = nullptr;
};

//! An array of the arena: entries [offset, offset + size).
struct arena_range {
  std::int64_t offset = 0;
  std::int64_t size = 0;
};

struct encoder_partition {
  index_t group_size = 0, num_groups = 0, num_windows = 0;
  index_t window = 0, shift = 0;  //!< after Swin's small-stage rule
  bool budget_exhausted = false;
  double cost = 0, lower_bound = 0, plan_us = 0;
  //! [n_g*G] gather, slot_window, slot_coord; [N] scatter (partition_types.hpp's layout)
  arena_range gather, scatter, slot_window, slot_coord;
};

struct encoder_stage {
  index_t height = 0, width = 0, num_tokens = 0;  //!< num_tokens: the token axis (per sample if shared)
  //! Plain and shifted windows; a stage without a shift (one window) has part[1] == part[0].
  encoder_partition part[2];
  arena_range position;    //!< [N] flat position of each token: h*W + w (shared), b*H*W + h*W + w
  arena_range merge;       //!< [4 * N_next] patch-merging gather (merging.hpp), empty at the last stage
  arena_range cu_seqlens;  //!< [M+1] per-sample token offsets, empty with a shared mask
  arena_range unit_rank;   //!< last stage only, [M*H*W]: rank among the visible (>= 0) or -1 - rank among the masked
};

struct encoder_plan {
  index_t num_masks = 0;
  bool per_sample = false;
  std::vector<encoder_stage> stages;
  std::vector<index_t> arena;
};

}  // namespace greenmim
