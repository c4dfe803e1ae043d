//! \file planner/pack_one_g.hpp
//! The `fast` strategy at one group size G: the best of the packers (pack_*.hpp), tried
//! cheapest first and stopped as soon as one meets the group-count lower bound, within the work
//! budget. Large inputs (more than paper_dp_max_windows windows) are only counted here; the
//! sweep forms the winner's groups once (`finish`). Part of planner.hpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "../config.hpp"
#include "histogram.hpp"
#include "options.hpp"
#include "pack_best_fit.hpp"
#include "pack_exact.hpp"
#include "pack_histogram_dp.hpp"
#include "pack_knapsack.hpp"

namespace greenmim {
namespace detail {

//! Which packer's groups are still to be formed (large inputs are only counted during the sweep).
enum lazy_packer { lazy_none, lazy_bfd, lazy_hdp };

//! A plan in the making: its groups (item positions, or window indices when `holds_windows`),
//! group size and cost. The facade (planner.hpp) turns it into a `plan`.
struct chosen_packing {
  packing groups;
  index_t g = 0;
  double cost = 0;
  bool holds_windows = false;  // groups.members are window indices (not item positions)
};

//! Packs at one G: `pack` leaves the best packing in `cur` (its count in `count`), or, when
//! `lazy`, only the count and in `lazy` the packer to run again (`hd_cur` keeps the histogram
//! DP's patterns). Holds every packer's scratch, kept between calls.
struct group_size_packer {
  packing cur, alt;
  hd_patterns hd_cur;
  index_t count = 0;
  lazy_packer lazy = lazy_none;
  knapsack_scratch ks;
  best_fit_scratch bf;
  histogram_dp_scratch hs;
  exact_scratch ex;

  //! Best packing at capacity g among the packers, into `cur` (count in `count`); for large
  //! inputs (`lazy_only`) only counted (`lazy` names the packer to materialize later: the sweep
  //! needs counts, only the winner needs groups). Stops as soon as a packer meets `lbb`, a lower
  //! bound on the count. Returns true when the count is provably the minimum for g.
  bool pack(size_histogram& h, index_t g, const planner_options& opt, index_t lbb, bool lazy_only,
            work_meter& meter) {
    const std::int64_t words = static_cast<std::int64_t>(g) / 64 + 1;  // one DP bitset row
    const std::int64_t n = h.n_items(), d = static_cast<std::int64_t>(h.distinct.size());
    // best fit scans the fill levels once per distinct size: O(n + d * g)
    const std::int64_t bfd_work = 32 * n + (d + 1) * static_cast<std::int64_t>(g) / 4;
    if (lazy_only) {  // thousands of windows: histogram packers only, O(d * g) per pass
      meter.charge(bfd_work);
      count = bfd_count(h, g, bf);
      lazy = lazy_bfd;
      if (count <= lbb) return true;
      // a pass is at most one phase per group, each over the active sizes' rows
      if (!meter.afford(static_cast<std::int64_t>(count) * d * words, opt)) return false;
      const index_t hc = histogram_dp(h, g, hs, hd_cur);
      if (hc < count) {
        count = hc;
        lazy = lazy_hdp;
      }
      return count <= lbb;
    }
    lazy = lazy_none;
    auto take_alt = [&] {
      if (alt.count() < count) {
        std::swap(cur, alt);
        count = cur.count();
      }
    };
    meter.charge(bfd_work);
    best_fit_decreasing(h, g, bf, alt);
    // the paper's DP on decreasing sizes (a knapsack over the remaining items per group) first,
    // best fit on a tie; best fit alone when the DP is beyond the budget
    if (meter.afford(static_cast<std::int64_t>(alt.count()) * n * words, opt)) {
      repeated_knapsack<false>(h, h.size_order(), g, ks, cur);
      count = cur.count();
      if (count <= lbb) return true;
      take_alt();
    } else {
      std::swap(cur, alt);
      count = cur.count();
    }
    if (count <= lbb) return true;
    if (h.n_items() <= opt.exact_max_windows && exact_states(h) <= (std::int64_t{1} << 16)) {
      // exact search dominates every other packer, the paper's DP included
      for (index_t k = lbb; k < count; ++k) {
        const int r = fits_in(h, g, k, ex, alt, opt.search_budget);
        if (r == 1) { take_alt(); return true; }
        if (r < 0) {  // search budget exhausted: the multiset DP decides, in bounded time
          exact_packing(h, g, ex, alt);
          take_alt();
          return true;
        }
      }
      return true;  // no k below the heuristic count fits: it is optimal
    }
    if (meter.afford(static_cast<std::int64_t>(count) * d * words, opt)) {
      histogram_dp(h, g, hs, hd_cur);
      materialize<false>(h, hd_cur, hs, alt);
      take_alt();
    }
    if (count <= lbb) return true;
    if (h.n_items() <= opt.paper_dp_max_windows && meter.afford(static_cast<std::int64_t>(count) * n * words, opt)) {
      repeated_knapsack<false>(h, h.input_order(), g, ks, alt);
      take_alt();
      // a bounded search for one group fewer: finds a better packing, or proves this one optimal
      while (count > lbb && opt.search_budget > 0) {
        const int r = fits_in(h, g, count - 1, ex, alt, opt.search_budget);
        if (r != 1) return r == 0;
        take_alt();
      }
    }
    return count <= lbb;
  }
};

//! Forms the groups of a packing that was only counted at capacity g (`which` from
//! group_size_packer::lazy; `pats` the histogram DP's patterns when `which == lazy_hdp`) into
//! `out`. Returns true when `out` now holds window indices (the histogram DP writes them directly).
inline bool form_counted(const size_histogram& h, lazy_packer which, index_t g, const hd_patterns& pats,
                         group_size_packer& pk, packing& out) {
  bool windows = false;
  if (which == lazy_hdp) {
    materialize<true>(h, pats, pk.hs, out);
    windows = true;
  }
  if (which == lazy_bfd) best_fit_decreasing(h, g, pk.bf, out);
  return windows;
}

}  // namespace detail
}  // namespace greenmim
