//! \file cost_model.hpp
//! Cost models for grouped window attention. A cost model is any callable
//! `double operator()(index_t group_size, index_t num_groups) const` that is nondecreasing in
//! both arguments (bigger or more groups never cost less); the planner's lower bounds and pruning
//! rely on that. The default is the paper's FLOPs formula (Eq. 6).
//!
//! Optional: a model whose cost is `num_groups * per_group(group_size)` with per_group(G) / G
//! nondecreasing in G (cost per padded slot never falls as groups grow) may expose
//! `per_group(index_t)`. The planner then bounds every large G at once (S * per_group(G) / G) and
//! lists those candidates only on demand, so a sweep no longer grows with sum(w) / max(w). Both
//! models below qualify.
#pragma once

#include "config.hpp"

namespace greenmim {

//! The paper's cost `n_g * (4*G*C^2 + 2*G^2*C)`: FLOPs of one multi-head attention module
//! (projections + attention) over n_g groups of G tokens with C channels. Evaluated in double:
//! exact for results below 2^53 and never overflows.
struct flops_cost {
  index_t channels = 128;  //!< C

  GREENMIM_HOST_DEVICE constexpr double per_group(index_t group_size) const {
    const double g = group_size, c = channels;
    return 4.0 * g * c * c + 2.0 * g * g * c;
  }
  GREENMIM_HOST_DEVICE constexpr double operator()(index_t group_size, index_t num_groups) const {
    return static_cast<double>(num_groups) * per_group(group_size);
  }
};

//! Counts padded slots only (`n_g * G`): the memory-traffic view of a plan.
struct slots_cost {
  GREENMIM_HOST_DEVICE constexpr double per_group(index_t group_size) const { return group_size; }
  GREENMIM_HOST_DEVICE constexpr double operator()(index_t group_size, index_t num_groups) const {
    return static_cast<double>(num_groups) * group_size;
  }
};

}  // namespace greenmim
