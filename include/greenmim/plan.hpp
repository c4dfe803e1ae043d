//! \file plan.hpp
//! The result of planning: a group size G and a partition of the non-empty windows into groups
//! of at most G tokens each. Produced by `make_plan` (planner.hpp), consumed by the index
//! builders (partition.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include "config.hpp"
#include "status.hpp"
#include "view.hpp"

namespace greenmim {

//! How a plan was made.
enum class strategy : int {
  fast = 0,    //!< ours (default): never costlier than `paper`, exact for <= 16 windows
  paper,       //!< Algorithm 1 of the paper, decision for decision
  per_window,  //!< one window per group, G = max w_i (no DP)
  single,      //!< one group holding every window, G = sum w_i (no DP)
};

inline const char* strategy_name(strategy s) {
  switch (s) {
    case strategy::fast: return "fast";
    case strategy::paper: return "paper";
    case strategy::per_window: return "per-window";
    case strategy::single: return "single";
  }
  return "unknown";
}

//! A grouping plan. Windows are referred to by their index in the planner's input `sizes`;
//! zero-size windows belong to no group.
struct plan {
  strategy strat = strategy::fast;
  index_t group_size = 0;                //!< G: every group is padded to G slots
  std::vector<index_t> group_offsets{0}; //!< CSR offsets into `windows`, size num_groups()+1
  std::vector<index_t> windows;          //!< window indices, group by group
  std::vector<index_t> fills;            //!< real tokens per group (<= G)
  double cost = 0;                       //!< cost-model value of this plan
  double lower_bound = 0;                //!< lower bound on the cost of ANY plan for these sizes
  bool budget_exhausted = false;         //!< fast: planner_options::work_budget ran out (see there)

  index_t num_groups() const { return static_cast<index_t>(fills.size()); }
  //! Window indices of group `g`.
  span<const index_t> group(index_t g) const {
    return span<const index_t>(windows.data() + group_offsets[g], group_offsets[g + 1] - group_offsets[g]);
  }
  //! Relative optimality gap (cost - lower_bound) / lower_bound (0 when the bound is 0).
  double gap() const { return lower_bound > 0 ? (cost - lower_bound) / lower_bound : 0.0; }
  void clear() {
    group_size = 0;
    group_offsets.assign(1, 0);
    windows.clear();
    fills.clear();
    cost = lower_bound = 0;
    budget_exhausted = false;
  }
};

//! Checks that `p` is a valid plan for `sizes`: every non-empty window in exactly one group, no
//! empty window in a group, each group's fill equal to the sum of its windows and <= G.
//! O(n + windows). Returns `not_covered`, `size_exceeds_group` or `out_of_range` on failure.
inline status validate_plan(span<const index_t> sizes, const plan& p) {
  const index_t ng = p.num_groups();
  if (p.group_size <= 0 && ng > 0) return status::invalid_argument;
  if (static_cast<index_t>(p.group_offsets.size()) != ng + 1 || p.group_offsets[0] != 0 ||
      p.group_offsets[ng] != static_cast<index_t>(p.windows.size()))
    return status::not_covered;
  std::vector<std::uint8_t> seen(static_cast<size_t>(sizes.size()), 0);
  for (index_t g = 0; g < ng; ++g) {
    if (p.group_offsets[g + 1] < p.group_offsets[g]) return status::not_covered;
    std::int64_t fill = 0;
    for (index_t w : p.group(g)) {
      if (w < 0 || w >= sizes.size()) return status::out_of_range;
      if (seen[w] || sizes[w] <= 0) return status::not_covered;
      seen[w] = 1;
      fill += sizes[w];
    }
    if (fill != p.fills[g]) return status::not_covered;
    if (fill > p.group_size) return status::size_exceeds_group;
  }
  for (std::int64_t i = 0; i < sizes.size(); ++i)
    if (sizes[i] > 0 && !seen[i]) return status::not_covered;
  return status::success;
}

}  // namespace greenmim
