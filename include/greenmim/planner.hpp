//! \file planner.hpp
//! Optimal Grouping (the paper's Section 3.3, Algorithm 1) and our faster, never-worse planner.
//!
//! Input: window sizes w_i (visible tokens per window; zero-size windows are dropped first, the
//! rest keep their order). Output: a `plan` (plan.hpp): a group size G and a partition of the
//! non-empty windows into groups of at most G tokens, its cost under a cost model, and a lower
//! bound on the cost of any plan. Strategies:
//!  - `paper`: Algorithm 1 exactly: G from max w_i to sum w_i, the appendix DP repeated on the
//!    remaining windows in input order, least cost, the first (smallest) G on ties.
//!  - `fast` (default): a best-first sweep over G ordered by a lower bound, pruned as soon as
//!    the bound reaches the incumbent; per G the best of several packers (subset-sum DP on the
//!    size histogram, largest sizes first; best-fit decreasing on the histogram; the paper's DP in
//!    input order; and exact search when there are <= 16 windows), stopping at the first packer
//!    that meets the bound, then a bounded search for one group fewer that improves the packing
//!    or proves it optimal. Never costlier than `paper` (for <= `paper_dp_max_windows` = 256
//!    windows), exact over all G for <= 16 windows. Its `lower_bound` is a-posteriori: equal to
//!    the cost (gap 0) when every G it packed was proven optimal.
//!  - `per_window`: one window per group, G = max w_i. `single`: one group, G = sum w_i.
//! `planner_options::group_size` fixes G for `paper` and `fast` (capped at sum w_i);
//! `planner_options::max_group_size` limits their sweep to G <= it (a kernel's fast-path limit).
//! Cost models: see cost_model.hpp (nondecreasing in G and in the number of groups).
//!
//! This header is what users include; it is the facade (`planner`, `make_plan`) over parts that
//! each read on their own (docs/planner.md, "Where the code is"):
//!   planner/options.hpp       planner_options, input limits, the work meter
//!   planner/histogram.hpp     the items sorted by size and their size histogram; `packing`
//!   planner/bounds.hpp        group-count lower bounds per G (Martello-Toth L2, Fekete-Schepers)
//!   planner/pack_knapsack.hpp     packer: the paper's repeated subset-sum DP (GroupPartition)
//!   planner/pack_best_fit.hpp     packer: best-fit decreasing on the histogram (and its count)
//!   planner/pack_histogram_dp.hpp packer: subset-sum DP on the histogram, patterns applied in bulk
//!   planner/pack_exact.hpp        packer: exact DFS with a step budget, exact multiset DP
//!   planner/pack_one_g.hpp    `fast` at one G: the packers in order, stopped at the bound
//!   planner/sweep.hpp         `fast` over all G: best-first sweep, a-priori/a-posteriori bounds
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "config.hpp"
#include "cost_model.hpp"
#include "plan.hpp"
#include "planner/bounds.hpp"
#include "planner/histogram.hpp"
#include "planner/options.hpp"
#include "planner/pack_knapsack.hpp"
#include "planner/pack_one_g.hpp"
#include "planner/sweep.hpp"
#include "status.hpp"
#include "view.hpp"

namespace greenmim {

//! Reusable planner: keeps its scratch memory between calls, so planning every training step
//! allocates nothing once warm. Not thread-safe; use one per thread.
template <class CostModel = flops_cost>
class planner {
 public:
  explicit planner(CostModel cost = CostModel{}) : cost_(cost), sweep_(cost) {}
  const CostModel& cost_model() const { return cost_; }

  //! Plans `sizes` (w_i >= 0, at least one > 0) with `opt`. On failure `out` is left unchanged.
  //! Errors: empty_input (no window or all empty), invalid_argument (negative size, G < 0,
  //! unknown strategy, paper sweep too large, group_size or max_group_size < 0 or set for
  //! another strategy than paper / fast, group_size > max_group_size), size_exceeds_group
  //! (w_i > fixed G or > max_group_size), overflow (w_i > 2^20 or sum > 2^28).
  status run(span<const index_t> sizes, const planner_options& opt, plan& out) {
    if (status s = prepare(sizes, opt); s != status::success) return s;
    meter_.reset();
    status s = status::success;
    switch (opt.strat) {
      case strategy::paper: s = run_paper(opt); break;
      case strategy::fast: run_fast(opt); break;
      case strategy::per_window: run_per_window(); break;
      case strategy::single: run_single(); break;
      default: return status::invalid_argument;
    }
    if (s != status::success) return s;
    emit(opt.strat, out);
    return status::success;
  }

  //! Lower bound on the number of groups of capacity G for the current items (Martello-Toth L2,
  //! which is >= ceil(sum/G)). Valid after a successful `run`.
  index_t group_count_bound(index_t g) const { return detail::bins_lower_bound(hist_, g, fs_bounds_); }

 private:
  // ---- set-up ---------------------------------------------------------------------------------
  status prepare(span<const index_t> sizes, const planner_options& opt) {
    hist_.reset();
    best_.holds_windows = false;
    max_group_ = opt.max_group_size;
    fs_bounds_ = sizes.size() <= opt.paper_dp_max_windows;
    if (sizes.size() == 0) return status::empty_input;
    if (sizes.size() > std::numeric_limits<index_t>::max()) return status::overflow;
    if (opt.group_size < 0 || opt.max_group_size < 0) return status::invalid_argument;
    if (status st = hist_.build(sizes.data(), sizes.size()); st != status::success) return st;
    if ((opt.group_size > 0 || opt.max_group_size > 0) && opt.strat != strategy::paper && opt.strat != strategy::fast)
      return status::invalid_argument;
    if (opt.group_size > 0 && opt.max_group_size > 0 && opt.group_size > opt.max_group_size)
      return status::invalid_argument;
    if (opt.group_size > 0 && opt.group_size < hist_.maxw) return status::size_exceeds_group;
    if (opt.max_group_size > 0 && opt.max_group_size < hist_.maxw) return status::size_exceeds_group;
    return status::success;
  }

  // ---- strategies -----------------------------------------------------------------------------
  //! Algorithm 1: every G from max w to S, the paper's packer in input order, least cost, the
  //! first (smallest) G on ties.
  status run_paper(const planner_options& opt) {
    const std::vector<index_t>& order = hist_.input_order();
    auto pack = [&](index_t g, detail::packing& p) {
      if (opt.table_dp) detail::repeated_knapsack<true>(hist_, order, g, pk_.ks, p);
      else detail::repeated_knapsack<false>(hist_, order, g, pk_.ks, p);
    };
    const std::int64_t total = hist_.total;
    if (opt.group_size > 0) {
      best_.g = static_cast<index_t>(std::min<std::int64_t>(opt.group_size, total));
      pack(best_.g, best_.groups);
      best_.cost = cost_(best_.g, best_.groups.count());
      return status::success;
    }
    const std::int64_t gmax = opt.max_group_size > 0 ? std::min<std::int64_t>(opt.max_group_size, total) : total;
    // Work guard: the sweep is O((S - max w) * n * S / 64) with bitsets, O(... * S) with the table.
    const double sweep = static_cast<double>(gmax - hist_.maxw + 1) * static_cast<double>(hist_.n_items()) *
                         (opt.table_dp ? static_cast<double>(total) : static_cast<double>(total) / 64.0 + 1.0);
    if (sweep > 4e10) return status::invalid_argument;
    best_.cost = std::numeric_limits<double>::infinity();
    detail::packing& cur = pk_.cur;
    for (std::int64_t g = hist_.maxw; g <= gmax; ++g) {
      pack(static_cast<index_t>(g), cur);
      const double c = cost_(static_cast<index_t>(g), cur.count());
      if (c < best_.cost) {  // strict: the first (smallest) G wins ties
        best_.cost = c;
        best_.g = static_cast<index_t>(g);
        std::swap(best_.groups, cur);
      }
    }
    return status::success;
  }

  //! Ours: the sweep (planner/sweep.hpp), or the packers at one fixed G (planner/pack_one_g.hpp).
  void run_fast(const planner_options& opt) {
    const bool lazy = hist_.n_items() > opt.paper_dp_max_windows;
    best_.holds_windows = false;
    if (opt.group_size > 0) {
      best_.g = static_cast<index_t>(std::min<std::int64_t>(opt.group_size, hist_.total));
      pk_.pack(hist_, best_.g, opt, detail::bins_lower_bound(hist_, best_.g, fs_bounds_), lazy, meter_);
      std::swap(best_.groups, pk_.cur);
      best_.holds_windows = detail::form_counted(hist_, pk_.lazy, best_.g, pk_.hd_cur, pk_, best_.groups);
      best_.cost = cost_(best_.g, best_.groups.count());
      return;
    }
    lower_bound_ = sweep_.run(hist_, opt, fs_bounds_, pk_, meter_, best_);
    have_lower_bound_ = true;
  }

  //! One window per group, G = max w.
  void run_per_window() {
    detail::packing& best = best_.groups;
    best.clear();
    for (index_t i : hist_.input_order()) {
      best.members.push_back(i);
      best.close_group(hist_.items[i].size);
    }
    best_.g = hist_.maxw;
    best_.cost = cost_(best_.g, best.count());
  }

  //! One group holding every window, G = S.
  void run_single() {
    detail::packing& best = best_.groups;
    best.clear();
    const std::vector<index_t>& order = hist_.input_order();
    best.members.assign(order.begin(), order.end());
    best.close_group(static_cast<index_t>(hist_.total));
    best_.g = static_cast<index_t>(hist_.total);
    best_.cost = cost_(best_.g, 1);
  }

  // ---- result ---------------------------------------------------------------------------------
  //! Lower bound on any plan's cost: `fast`'s a-posteriori bound, else the a-priori one
  //! (min over G in [maxw, S], or up to max_group_size when one is set, of cost(G, bins bound(G))).
  double global_lower_bound() {
    if (have_lower_bound_) return lower_bound_;
    return sweep_.a_priori_bound(hist_, fs_bounds_, max_group_);
  }

  void emit(strategy st, plan& out) {
    out.strat = st;
    out.group_size = best_.g;
    detail::packing& best = best_.groups;
    // swap, not copy: the plan's old buffers become scratch, so a reused plan allocates nothing
    std::swap(out.group_offsets, best.offsets);
    std::swap(out.fills, best.fills);
    if (best_.holds_windows) {
      std::swap(out.windows, best.members);
    } else {
      out.windows.resize(best.members.size());
      const index_t* mem = best.members.data();
      index_t* win = out.windows.data();
      const detail::item* items = hist_.items.data();
      for (size_t i = 0, e = best.members.size(); i < e; ++i) win[i] = items[mem[i]].window;
    }
    best_.holds_windows = false;
    out.cost = best_.cost;
    out.lower_bound = global_lower_bound();
    out.budget_exhausted = meter_.exhausted;
    have_lower_bound_ = false;
  }

  CostModel cost_;
  detail::size_histogram hist_;        // the current input
  detail::group_size_packer pk_;       // packers and their scratch
  detail::fast_sweep<CostModel> sweep_;
  detail::work_meter meter_;           // planner_options::work_budget
  detail::chosen_packing best_;        // the plan being made
  bool fs_bounds_ = true;              // add the Fekete-Schepers bounds to L2 (small inputs)
  double lower_bound_ = 0;             // fast's a-posteriori bound (when have_lower_bound_)
  bool have_lower_bound_ = false;
  index_t max_group_ = 0;              // planner_options::max_group_size of the current run
};

//! One-shot planning (allocates scratch; reuse a `planner` to plan every step without allocating).
template <class CostModel = flops_cost>
status make_plan(span<const index_t> sizes, const planner_options& opt, const CostModel& cost, plan& out) {
  planner<CostModel> p(cost);
  return p.run(sizes, opt, out);
}

//! Convenience overload with the default FLOPs cost model for `channels` channels.
inline status make_plan(span<const index_t> sizes, const planner_options& opt, index_t channels, plan& out) {
  return make_plan(sizes, opt, flops_cost{channels}, out);
}

}  // namespace greenmim
