//! \file planner/options.hpp
//! What a caller can ask of the planner (`planner_options`) and the input limits it accepts.
//! Part of planner.hpp; docs/planner.md explains every option.
#pragma once

#include <cstdint>

#include "../config.hpp"
#include "../plan.hpp"

namespace greenmim {

struct planner_options {
  strategy strat = strategy::fast;
  index_t group_size = 0;           //!< > 0 fixes G (paper and fast only); 0 sweeps G
  //! > 0: paper and fast sweep only G <= max_group_size (a kernel's fast-path limit, e.g. the
  //! tensor-core attention's 256); a window larger than it is refused (size_exceeds_group), and
  //! the plan's lower bound is over plans with such G. 0: no limit.
  index_t max_group_size = 0;
  bool table_dp = false;            //!< paper: use the literal table DP instead of the bitset form
  // The three tuning knobs below and work_budget treat a negative value as 0 (off / no limit for
  // work_budget); unlike G, no value of them can make a plan invalid, so none is refused.
  index_t exact_max_windows = 16;   //!< fast: exact bin packing per G up to this many windows
  index_t paper_dp_max_windows = 256;  //!< fast: also run the paper's DP per G up to this many windows
  std::int64_t search_budget = 20000;  //!< fast, <= paper_dp_max_windows windows: DFS steps (bins
                                       //!< examined) per search for a packing with fewer groups,
                                       //!< when the packers miss the bound; 0 turns it off
  //! fast: work allowed per plan, in units of about a nanosecond (a 64-bit word of a DP bitset,
  //! 32 per item of a best-fit pass). Real window sizes never come near it (a Swin-B stage-1
  //! plan spends ~10^4, a 256-sample per-sample batch ~10^6); sizes in the tens of thousands
  //! would otherwise take minutes. When it runs out, the DP packers are skipped and the sweep
  //! stops: the plan is still valid, its lower bound still holds (the gap says how good it is),
  //! and plan::budget_exhausted is set. 0: no limit.
  std::int64_t work_budget = std::int64_t{1} << 30;
};

//! Largest window size and largest total the planner accepts (a sweep is O(sum w)).
constexpr std::int64_t max_window_size = std::int64_t{1} << 20;
constexpr std::int64_t max_total_size = std::int64_t{1} << 28;

namespace detail {

//! Work accounting for planner_options::work_budget: `charge` counts work that always runs;
//! `afford` charges `units` and returns true, or returns false (charging nothing, and noting
//! that the budget bound) when they would exceed it.
struct work_meter {
  std::int64_t used = 0;
  bool exhausted = false;
  void reset() {
    used = 0;
    exhausted = false;
  }
  void charge(std::int64_t units) { used += units; }
  bool afford(std::int64_t units, const planner_options& opt) {
    if (opt.work_budget > 0 && used + units > opt.work_budget) {
      exhausted = true;
      return false;
    }
    used += units;
    return true;
  }
};

}  // namespace detail
}  // namespace greenmim
