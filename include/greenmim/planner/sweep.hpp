//! \file planner/sweep.hpp
//! The `fast` strategy's sweep over group sizes G in [max w, min(S, cap)]: a best-first search ordered by
//! each G's lower bound (bounds.hpp), packing each G it visits (pack_one_g.hpp) and stopping as
//! soon as the least remaining bound reaches the best cost found. Also the plan's lower bounds:
//! the a-priori one (least bound over all G; reported by every other strategy) and the
//! a-posteriori one `fast` reports. Part of planner.hpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <type_traits>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "bounds.hpp"
#include "histogram.hpp"
#include "options.hpp"
#include "pack_one_g.hpp"

namespace greenmim {
namespace detail {

//! Whether a cost model has the form n * per_group(G) (see cost_model.hpp).
template <class C, class = void>
struct has_per_group : std::false_type {};
template <class C>
struct has_per_group<C, std::void_t<decltype(std::declval<const C&>().per_group(index_t{}))>> : std::true_type {};

//! The sweep over G. Keeps its memory between plans; one per planner.
template <class CostModel>
class fast_sweep {
 public:
  explicit fast_sweep(CostModel cost = CostModel{}) : cost_(cost) {}

  //! Sweeps every G for the items of `h` and leaves the least-cost packing (smallest G on ties)
  //! in `best`. `dual_feasible`: use the Fekete-Schepers bounds too (bounds.hpp).
  //! Returns the a-posteriori lower bound on any plan's cost.
  double run(size_histogram& h, const planner_options& opt, bool dual_feasible, group_size_packer& pk,
             work_meter& meter, chosen_packing& best) {
    h_ = &h;
    fs_ = dual_feasible;
    meter_ = &meter;
    const bool lazy = h.n_items() > opt.paper_dp_max_windows;
    best.holds_windows = false;
    build_candidates(opt.max_group_size);
    const size_t first = least_candidate();
    double lower_bound = cands_[first].lb;
    unproven_lb_ = std::numeric_limits<double>::infinity();
    best.cost = std::numeric_limits<double>::infinity();
    best.g = 0;
    exact_counts_.clear();
    best_lazy_ = lazy_none;
    // The most promising candidate first, outside the heap: its cost usually rules out nearly
    // every other candidate, and only the survivors (bound below the incumbent) are heaped.
    // The visiting order is the heap's order either way.
    const candidate c0 = cands_[first];
    cands_[first] = cands_.back();
    cands_.pop_back();
    candidate next;
    if (visit(c0, opt, lazy, pk, best, next)) cands_.push_back(next);
    cands_.erase(std::remove_if(cands_.begin(), cands_.end(), [&](const candidate& c) { return c.lb >= best.cost; }),
                 cands_.end());
    std::make_heap(cands_.begin(), cands_.end(), worse);
    while (!cands_.empty()) {
      std::pop_heap(cands_.begin(), cands_.end(), worse);
      candidate c = cands_.back();
      cands_.pop_back();
      if (c.lb >= best.cost) break;  // every remaining candidate is at least as costly
      if (opt.work_budget > 0 && meter.used >= opt.work_budget) {  // out of budget: c has the least bound left
        meter.exhausted = true;
        unproven_lb_ = std::min(unproven_lb_, c.lb);
        break;
      }
      if (c.kind == cand_gen) {  // list the next range; the generator goes back with its new bound
        candidate r;
        if (next_range(c, r) && r.lb < best.cost) {
          cands_.push_back(r);
          std::push_heap(cands_.begin(), cands_.end(), worse);
        }
        if (c.lb < best.cost) {
          cands_.push_back(c);
          std::push_heap(cands_.begin(), cands_.end(), worse);
        }
        continue;
      }
      meter.charge(fs_ ? 8 * h.n_items() : 4 * static_cast<std::int64_t>(h.distinct.size()));
      if (refine(c)) {  // its bound rose: back into the heap, in its new place
        if (c.lb < best.cost) {
          cands_.push_back(c);
          std::push_heap(cands_.begin(), cands_.end(), worse);
        }
        continue;
      }
      if (visit(c, opt, lazy, pk, best, next)) {
        cands_.push_back(next);
        std::push_heap(cands_.begin(), cands_.end(), worse);
      }
    }
    best.holds_windows = form_counted(h, best_lazy_, best.g, hd_best_, pk, best.groups);
    best_lazy_ = lazy_none;
    // A posteriori bound: every G was packed optimally (proven), packed with only its bound
    // proven (unproven_lb_), or never packed because its bound reached the best cost. So no plan
    // costs less than min(best cost, unproven_lb_); this is at least the a-priori bound, and
    // equals the best cost (gap 0) when every packed G was proven.
    return std::max(lower_bound, std::min(best.cost, unproven_lb_));
  }

  //! A-priori lower bound on any plan's cost for the items of `h`: min over G in [maxw, gmax] of
  //! cost(G, bins_lower_bound(G)), gmax = min(S, max_group) (max_group 0: S). Needs maxw <= gmax.
  double a_priori_bound(size_histogram& h, bool dual_feasible, index_t max_group = 0) {
    h_ = &h;
    fs_ = dual_feasible;
    build_candidates(max_group);
    return cands_[least_candidate()].lb;
  }

 private:
  //! A sweep candidate: one G (`cheap`: bound from ceil(S/G), refined to L2 when it matters;
  //! `exact`), a range [g, last] of G with one group-count bound (`exact`), or the generator of
  //! the ranges not yet listed (`gen`: g = least G among them, bins = next k, lb = bound on all).
  enum : std::uint8_t { cand_cheap, cand_exact, cand_gen };
  struct candidate {
    double lb;
    index_t g;
    index_t last;  // last G of the range this candidate walks (== g for a single G)
    index_t bins;  // group-count lower bound on the whole range (gen: the next k)
    std::uint8_t kind;
  };
  static bool worse(const candidate& a, const candidate& b) {  // min-heap order on (lb, g)
    return a.lb > b.lb || (a.lb == b.lb && a.g > b.g);
  }

  //! Replaces a candidate's ceil(S/G) bound by the L2 bound. Returns true when the bound rose.
  bool refine(candidate& c) const {
    if (c.kind != cand_cheap) return false;
    c.kind = cand_exact;
    const index_t b = bins_lower_bound(*h_, c.g, fs_);
    if (b == c.bins) return false;
    c.bins = b;
    c.lb = cost_(c.g, b);
    return true;
  }
  //! ceil(S/k): S/k in double, truncated, then corrected by one multiplication (exact for
  //! S < 2^53; unlike integer divisions these pipeline).
  std::int64_t ceil_s_over(std::int64_t k) const {
    const std::int64_t total = h_->total;
    auto c = static_cast<std::int64_t>(static_cast<double>(total) / static_cast<double>(k));
    c += c * k < total;
    return c;
  }
  //! Bound on cost(G', k') over every range not yet listed (G' >= g, k' = ceil(S/G')): for a cost
  //! n * per_group(G) with per_group(G)/G nondecreasing, k' * per_group(G') >= S * per_group(g)/g.
  //! Shaded by 1e-12 so rounding never lifts it above a range's own bound.
  double gen_bound(index_t g) const {
    if constexpr (has_per_group<CostModel>::value)
      return static_cast<double>(h_->total) * static_cast<double>(cost_.per_group(g)) / static_cast<double>(g) *
             (1.0 - 1e-12);
    else
      return 0.0;
  }
  //! Lists the generator's next nonempty range into `r` (false when none is left) and advances
  //! the generator; an exhausted generator gets an infinite bound.
  bool next_range(candidate& gen, candidate& r) const {
    for (std::int64_t k = gen.bins; k >= 1; --k) {
      const std::int64_t lo = std::max(split_, ceil_s_over(k));
      if (lo > gmax_) break;  // lo only grows as k falls: no range is left under the cap
      const std::int64_t hi = k > 1 ? std::min(ceil_s_over(k - 1) - 1, gmax_) : gmax_;
      if (lo > hi) continue;
      r = {cost_(static_cast<index_t>(lo), static_cast<index_t>(k)), static_cast<index_t>(lo), static_cast<index_t>(hi),
           static_cast<index_t>(k), cand_exact};
      gen.bins = static_cast<index_t>(k - 1);
      if (k > 1) {
        gen.g = static_cast<index_t>(hi + 1);
        gen.lb = gen_bound(gen.g);
      } else {
        gen.lb = std::numeric_limits<double>::infinity();
      }
      return true;
    }
    gen.bins = 0;
    gen.lb = std::numeric_limits<double>::infinity();
    return false;
  }
  //! Index in `cands_` of the least candidate, exact: its bound is the least over all G (the
  //! plan's lower bound). A single G is refined, and the generator lists ranges, only while its
  //! bound beats the least so far.
  size_t least_candidate() {
    constexpr size_t none = ~size_t{0};
    size_t best = none, gen = none;
    auto beats = [&](const candidate& c) { return best == none || worse(cands_[best], c); };
    for (size_t i = 0; i < cands_.size(); ++i) {
      if (cands_[i].kind == cand_gen) gen = i;
      else if (cands_[i].kind == cand_exact && beats(cands_[i])) best = i;
    }
    if (gen != none) {
      candidate r;
      while (cands_[gen].bins >= 1 && beats(cands_[gen])) {
        if (!next_range(cands_[gen], r)) break;
        cands_.push_back(r);
        if (beats(r)) best = cands_.size() - 1;
      }
    }
    for (size_t i = 0; i < cands_.size(); ++i) {
      if (cands_[i].kind != cand_cheap || !beats(cands_[i])) continue;
      refine(cands_[i]);
      if (beats(cands_[i])) best = i;
    }
    return best;
  }

  //! One step of the sweep: packs c.g unless a known exact count rules it out, keeps the best
  //! plan, and returns true with `next` = the rest of c's range when there is one.
  bool visit(const candidate& c, const planner_options& opt, bool lazy, group_size_packer& pk, chosen_packing& best,
             candidate& next) {
    // The exact group count is nonincreasing in G: a G'' >= G solved exactly bounds G too.
    index_t bins = c.bins;
    // exact minimum counts are nonincreasing in G: the nearest solved G'' >= G has the largest
    const auto solved = exact_counts_.lower_bound(c.g);
    if (solved != exact_counts_.end()) bins = std::max(bins, solved->second);
    if (bins <= c.bins || cost_(c.g, bins) < best.cost) {
      if (pk.pack(*h_, c.g, opt, bins, lazy, *meter_))
        exact_counts_.emplace(c.g, pk.count);
      else  // not proven optimal at this G: only the bound holds for it
        unproven_lb_ = std::min(unproven_lb_, cost_(c.g, bins));
      const double cost = cost_(c.g, pk.count);
      if (cost < best.cost || (cost == best.cost && c.g < best.g)) {
        best.cost = cost;
        best.g = c.g;
        best_lazy_ = pk.lazy;
        std::swap(best.groups, pk.cur);
        if (pk.lazy == lazy_hdp) std::swap(hd_best_, pk.hd_cur);
      }
    }
    if (c.g >= c.last) return false;
    // the rest of the range keeps the range's own (weaker) bound
    next = {cost_(c.g + 1, c.bins), c.g + 1, c.last, c.bins, cand_exact};
    return true;
  }

  //! Candidates of the sweep, into `cands_`: every G in [maxw, 2*maxw) on its own (bound
  //! ceil(S/G), refined to L2 when it matters), and above that one range per k = ceil(S/G)
  //! (bound cost(G, k), nondecreasing in G within the range, so the range's first G carries its
  //! least bound); all clipped to G <= gmax_ = min(S, max_group) (max_group 0: S).
  void build_candidates(index_t max_group) {
    const std::int64_t S = h_->total;
    const index_t maxw = h_->maxw;
    gmax_ = max_group > 0 ? std::min<std::int64_t>(S, max_group) : S;
    split_ = std::min<std::int64_t>(2 * static_cast<std::int64_t>(maxw), gmax_ + 1);
    const std::int64_t kmax = split_ > gmax_ ? 0 : ceil_s_over(split_);
    constexpr bool lazy_ranges = has_per_group<CostModel>::value;
    // sized once and written in place (no push_back of temporaries)
    cands_.resize(static_cast<size_t>(split_ - maxw + (lazy_ranges ? 1 : kmax)));
    candidate* out = cands_.data();
    size_t n = 0;
    for (std::int64_t g = maxw; g < split_; ++g) {  // L2 bounds come later, where they matter
      candidate& c = out[n++];
      c.bins = static_cast<index_t>(ceil_s_over(g));
      c.g = c.last = static_cast<index_t>(g);
      c.lb = cost_(c.g, c.bins);
      c.kind = cand_cheap;
    }
    // one range per k = ceil(S/G): G in [max(split, ceil(S/k)), ceil(S/(k-1)) - 1], skipped when
    // empty; listed on demand by a generator when the cost model allows a bound on the unlisted
    if (kmax > 0) {
      candidate gen{gen_bound(static_cast<index_t>(split_)), static_cast<index_t>(split_), 0,
                    static_cast<index_t>(kmax), cand_gen};
      if (lazy_ranges) {
        out[n++] = gen;
      } else {
        candidate r;
        while (next_range(gen, r)) out[n++] = r;
      }
    }
    cands_.resize(n);
  }

  CostModel cost_;
  size_histogram* h_ = nullptr;        // the input of the current run (set by run / a_priori_bound)
  bool fs_ = true;                     // add the Fekete-Schepers bounds (small inputs)
  work_meter* meter_ = nullptr;        // the current run's work accounting
  std::vector<candidate> cands_;
  std::int64_t split_ = 0;  // first G covered by ranges (2 * max w, or gmax_ + 1)
  std::int64_t gmax_ = 0;   // largest G swept: S, or the caller's max_group_size
  std::map<index_t, index_t> exact_counts_;  // G -> exact minimum number of groups at G
  hd_patterns hd_best_;                      // the best G's histogram-DP patterns (lazy_hdp)
  lazy_packer best_lazy_ = lazy_none;
  double unproven_lb_ = 0;  // least bound over the G packed without a proof of optimality
};

}  // namespace detail
}  // namespace greenmim
