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
//!    that meets the bound. Never costlier than `paper`
//!    (for <= `paper_dp_max_windows` = 256 windows), exact over all G for <= 16 windows.
//!  - `per_window`: one window per group, G = max w_i. `single`: one group, G = sum w_i.
//! `planner_options::group_size` fixes G for `paper` and `fast` (capped at sum w_i).
//! Cost models: see cost_model.hpp (nondecreasing in G and in the number of groups).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "config.hpp"
#include "cost_model.hpp"
#include "knapsack.hpp"
#include "plan.hpp"
#include "status.hpp"
#include "view.hpp"

namespace greenmim {

struct planner_options {
  strategy strat = strategy::fast;
  index_t group_size = 0;           //!< > 0 fixes G (paper and fast only); 0 sweeps G
  bool table_dp = false;            //!< paper: use the literal table DP instead of the bitset form
  index_t exact_max_windows = 16;   //!< fast: exact bin packing per G up to this many windows
  index_t paper_dp_max_windows = 256;  //!< fast: also run the paper's DP per G up to this many windows
};

//! Largest window size and largest total the planner accepts (a sweep is O(sum w)).
constexpr std::int64_t max_window_size = std::int64_t{1} << 20;
constexpr std::int64_t max_total_size = std::int64_t{1} << 28;

namespace detail {

//! A packing of items (positions into the planner's item list) into groups.
struct packing {
  std::vector<index_t> offsets{0};
  std::vector<index_t> members;
  std::vector<index_t> fills;
  index_t count() const { return static_cast<index_t>(fills.size()); }
  void clear() {
    offsets.assign(1, 0);
    members.clear();
    fills.clear();
  }
  void close_group(index_t fill) {
    fills.push_back(fill);
    offsets.push_back(static_cast<index_t>(members.size()));
  }
};

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace detail

//! Reusable planner: keeps its scratch memory between calls, so planning every training step
//! allocates nothing once warm. Not thread-safe; use one per thread.
template <class CostModel = flops_cost>
class planner {
 public:
  explicit planner(CostModel cost = CostModel{}) : cost_(cost) {}
  const CostModel& cost_model() const { return cost_; }

  //! Plans `sizes` (w_i >= 0, at least one > 0) with `opt`. On failure `out` is left unchanged.
  //! Errors: empty_input (no window or all empty), invalid_argument (negative size, G < 0,
  //! unknown strategy, paper sweep too large), size_exceeds_group (w_i > fixed G), overflow
  //! (w_i > 2^20 or sum > 2^28).
  status run(span<const index_t> sizes, const planner_options& opt, plan& out) {
    if (status s = prepare(sizes, opt); s != status::success) return s;
    status s = status::success;
    switch (opt.strat) {
      case strategy::paper: s = run_paper(opt); break;
      case strategy::fast: s = run_fast(opt); break;
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
  index_t group_count_bound(index_t g) const { return bins_lower_bound(g); }

 private:
  struct item {
    index_t window;  // index into the caller's sizes
    index_t size;
  };

  // ---- set-up ---------------------------------------------------------------------------------
  status prepare(span<const index_t> sizes, const planner_options& opt) {
    items_.clear();
    total_ = 0;
    maxw_ = 0;
    if (sizes.size() == 0) return status::empty_input;
    if (sizes.size() > std::numeric_limits<index_t>::max()) return status::overflow;
    if (opt.group_size < 0) return status::invalid_argument;
    for (std::int64_t i = 0; i < sizes.size(); ++i) {
      const index_t w = sizes[i];
      if (w < 0) return status::invalid_argument;
      if (w > max_window_size) return status::overflow;
      if (w == 0) continue;
      items_.push_back({static_cast<index_t>(i), w});
      total_ += w;
      maxw_ = std::max(maxw_, w);
    }
    if (items_.empty()) return status::empty_input;
    if (total_ > max_total_size) return status::overflow;
    if (opt.group_size > 0 && opt.strat != strategy::paper && opt.strat != strategy::fast)
      return status::invalid_argument;
    if (opt.group_size > 0 && opt.group_size < maxw_) return status::size_exceeds_group;
    build_histogram();
    return status::success;
  }

  void build_histogram() {
    cnt_le_.assign(static_cast<size_t>(maxw_) + 1, 0);
    sum_le_.assign(static_cast<size_t>(maxw_) + 1, 0);
    for (const item& it : items_) {
      ++cnt_le_[it.size];
      sum_le_[it.size] += it.size;
    }
    distinct_.clear();
    for (index_t v = 1; v <= maxw_; ++v)
      if (cnt_le_[v]) distinct_.push_back(v);
    for (index_t v = 1; v <= maxw_; ++v) {
      cnt_le_[v] += cnt_le_[v - 1];
      sum_le_[v] += sum_le_[v - 1];
    }
    sort_next_.assign(cnt_le_.size(), 0);
    // decreasing-size order (stable in window index): the order the DP-on-decreasing and BFD use
    // counting sort: sizes are small integers, so this is O(n + max w)
    by_size_.resize(items_.size());
    const std::int64_t n = n_items();
    for (index_t i = 0; i < static_cast<index_t>(n); ++i) {
      const index_t w = items_[i].size;
      // items of size w occupy [n - cnt_le(w), n - cnt_le(w - 1)) in decreasing order
      by_size_[static_cast<size_t>(n - cnt_le(w) + fill_pos(w))] = i;
    }
  }

  index_t fill_pos(index_t w) {
    if (sort_next_.size() != cnt_le_.size()) sort_next_.assign(cnt_le_.size(), 0);
    return sort_next_[w]++;
  }
  std::int64_t n_items() const { return static_cast<std::int64_t>(items_.size()); }
  std::int64_t cnt_le(std::int64_t x) const { return x < 0 ? 0 : cnt_le_[static_cast<size_t>(std::min<std::int64_t>(x, maxw_))]; }
  std::int64_t sum_le(std::int64_t x) const { return x < 0 ? 0 : sum_le_[static_cast<size_t>(std::min<std::int64_t>(x, maxw_))]; }

  // ---- bounds ---------------------------------------------------------------------------------
  //! Martello-Toth L2 bound on the number of bins of capacity g (g >= maxw).
  index_t bins_lower_bound(index_t g) const {
    const std::int64_t l1 = detail::ceil_div(total_, g);
    if (2 * static_cast<std::int64_t>(maxw_) <= g) return static_cast<index_t>(l1);
    const std::int64_t n = n_items(), half = g / 2;
    std::int64_t best = l1;
    auto eval = [&](std::int64_t k) {
      const std::int64_t j1 = n - cnt_le(g - k);
      const std::int64_t j2 = cnt_le(g - k) - cnt_le(half);
      const std::int64_t s2 = sum_le(g - k) - sum_le(half);
      const std::int64_t s3 = sum_le(half) - sum_le(k - 1);
      const std::int64_t rest = s3 - (j2 * g - s2);
      const std::int64_t l = j1 + j2 + (rest > 0 ? detail::ceil_div(rest, g) : 0);
      best = std::max(best, l);
    };
    eval(0);
    for (index_t v : distinct_) {
      if (v > half) break;
      eval(v);
    }
    return static_cast<index_t>(best);
  }

  // ---- packers --------------------------------------------------------------------------------
  //! The paper's GroupPartition: repeat the knapsack on the remaining items (in `order`) until
  //! all are placed. Each round places >= 1 item because every item fits (g >= maxw).
  template <bool Table>
  void repeated_knapsack(const std::vector<index_t>& order, index_t g, detail::packing& out) {
    out.clear();
    remaining_.assign(order.begin(), order.end());
    while (!remaining_.empty()) {
      phi_.resize(remaining_.size());
      for (size_t i = 0; i < remaining_.size(); ++i) phi_[i] = items_[remaining_[i]].size;
      std::int64_t fill;
      if (Table)
        fill = knapsack_table(span<const index_t>(phi_), g, chosen_, table_);
      else
        fill = knapsack_bitset(span<const index_t>(phi_), g, chosen_, rows_);
      size_t keep = 0, c = 0;
      for (size_t i = 0; i < remaining_.size(); ++i) {
        if (c < chosen_.size() && static_cast<size_t>(chosen_[c]) == i) {
          out.members.push_back(remaining_[i]);
          ++c;
        } else {
          remaining_[keep++] = remaining_[i];
        }
      }
      remaining_.resize(keep);
      out.close_group(static_cast<index_t>(fill));
    }
  }

  //! Best-fit decreasing on the size histogram: identical items go, as many as fit, into the
  //! fullest bin that still takes one; bins are kept in buckets by fill level. O(n + d*G).
  void best_fit_decreasing(index_t g, detail::packing& out) {
    out.clear();
    bucket_head_.assign(static_cast<size_t>(g) + 1, -1);  // per fill level: a linked stack of bins
    bin_next_.clear();
    bin_items_.clear();  // per bin: linked list of items through item_next_
    bin_fill_.clear();
    item_next_.assign(items_.size(), -1);
    size_t pos = 0;
    const size_t n = by_size_.size();
    while (pos < n) {
      const index_t w = items_[by_size_[pos]].size;
      size_t end = pos;
      while (end < n && items_[by_size_[end]].size == w) ++end;
      for (std::int64_t f = g - w; f >= 1 && pos < end; --f) {
        while (bucket_head_[f] >= 0 && pos < end) {
          const index_t b = bucket_head_[f];
          bucket_head_[f] = bin_next_[b];
          std::int64_t fill = f;
          while (fill + w <= g && pos < end) push_item(b, by_size_[pos++]), fill += w;
          move_bin(b, static_cast<index_t>(fill));
        }
      }
      while (pos < end) {  // open new bins
        const index_t b = static_cast<index_t>(bin_fill_.size());
        bin_fill_.push_back(0);
        bin_next_.push_back(-1);
        bin_items_.push_back(-1);
        std::int64_t fill = 0;
        while (fill + w <= g && pos < end) push_item(b, by_size_[pos++]), fill += w;
        move_bin(b, static_cast<index_t>(fill));
      }
    }
    for (size_t b = 0; b < bin_fill_.size(); ++b) {
      for (index_t it = bin_items_[b]; it >= 0; it = item_next_[it]) out.members.push_back(it);
      out.close_group(bin_fill_[b]);
    }
  }
  void push_item(index_t b, index_t it) {
    item_next_[it] = bin_items_[b];
    bin_items_[b] = it;
  }
  void move_bin(index_t b, index_t fill) {
    bin_fill_[b] = fill;
    bin_next_[b] = bucket_head_[fill];
    bucket_head_[fill] = b;
  }

  //! Subset-sum DP on the size histogram ("DP on decreasing sizes" for large n): each group is
  //! the largest fill <= g reachable with the remaining counts, reconstructed preferring larger
  //! sizes, and each pattern found is applied as many times as the counts allow. O(phases * d * g).
  //! Returns the number of groups; materializes them into `out` when it is not null.
  index_t histogram_dp(index_t g, detail::packing* out) {
    const size_t m = distinct_.size();
    const size_t cols = static_cast<size_t>(g) + 1;
    hd_cnt_.resize(m);
    hd_take_.resize(m);
    hd_next_.assign(m, 0);
    std::int64_t left = 0;
    for (size_t j = 0; j < m; ++j) {  // j = 0 is the largest size
      const index_t v = distinct_[m - 1 - j];
      hd_cnt_[j] = static_cast<index_t>(cnt_le(v) - cnt_le(v - 1));
      left += hd_cnt_[j];
    }
    hd_reach_.assign((m + 1) * cols, 0);
    hd_used_.resize(cols);
    if (out) out->clear();
    index_t groups = 0;
    const std::int64_t n = n_items();
    while (left > 0) {
      std::uint8_t* r0 = hd_reach_.data();
      std::fill(r0, r0 + cols, 0);
      r0[0] = 1;
      for (size_t j = 0; j < m; ++j) {
        const index_t v = distinct_[m - 1 - j], c = hd_cnt_[j];
        const std::uint8_t* prev = r0 + j * cols;
        std::uint8_t* cur = r0 + (j + 1) * cols;
        for (size_t x = 0; x < cols; ++x) {
          if (prev[x]) {
            cur[x] = 1;
            hd_used_[x] = 0;
          } else if (x >= static_cast<size_t>(v) && cur[x - v] && hd_used_[x - v] < c) {
            cur[x] = 1;
            hd_used_[x] = hd_used_[x - v] + 1;
          } else {
            cur[x] = 0;
          }
        }
      }
      std::int64_t res = static_cast<std::int64_t>(cols) - 1;
      while (!r0[m * cols + static_cast<size_t>(res)]) --res;
      const index_t fill = static_cast<index_t>(res);
      std::int64_t reps = std::numeric_limits<std::int64_t>::max();
      for (size_t j = m; j-- > 0;) {  // smallest size first: take the fewest copies possible
        const index_t v = distinct_[m - 1 - j];
        index_t t = 0;
        while (!r0[j * cols + static_cast<size_t>(res - static_cast<std::int64_t>(t) * v)]) ++t;
        hd_take_[j] = t;
        res -= static_cast<std::int64_t>(t) * v;
        if (t) reps = std::min<std::int64_t>(reps, hd_cnt_[j] / t);
      }
      for (std::int64_t r = 0; r < reps; ++r) {
        if (out) {
          for (size_t j = 0; j < m; ++j) {
            const index_t v = distinct_[m - 1 - j];
            for (index_t t = 0; t < hd_take_[j]; ++t)
              out->members.push_back(by_size_[static_cast<size_t>(n - cnt_le(v) + hd_next_[j]++)]);
          }
          out->close_group(fill);
        }
      }
      for (size_t j = 0; j < m; ++j) {
        hd_cnt_[j] -= static_cast<index_t>(reps * hd_take_[j]);
        left -= reps * hd_take_[j];
      }
      groups += static_cast<index_t>(reps);
    }
    return groups;
  }

  //! Exact minimum number of bins by a DP over the multiset of sizes (lexicographically least
  //! (bins, last fill) over all insertion orders). States: prod(count_v + 1) <= 2^n.
  void exact_packing(index_t g, detail::packing& out) {
    out.clear();
    const size_t m = distinct_.size();
    ex_radix_.resize(m);
    ex_cnt_.resize(m);
    std::int64_t states = 1;
    for (size_t j = 0; j < m; ++j) {
      ex_radix_[j] = static_cast<index_t>(states);
      ex_cnt_[j] = static_cast<index_t>(cnt_le(distinct_[j]) - cnt_le(distinct_[j] - 1));
      states *= ex_cnt_[j] + 1;
    }
    ex_bins_.assign(static_cast<size_t>(states), 0);
    ex_fill_.assign(static_cast<size_t>(states), 0);
    ex_choice_.assign(static_cast<size_t>(states), 0);
    ex_digit_.assign(m, 0);
    ex_bins_[0] = 1;
    for (std::int64_t s = 1; s < states; ++s) {
      for (size_t j = 0; j < m; ++j) {  // odometer increment of the mixed-radix digits
        if (++ex_digit_[j] <= ex_cnt_[j]) break;
        ex_digit_[j] = 0;
      }
      index_t bb = std::numeric_limits<index_t>::max(), bf = 0, bc = 0;
      for (size_t j = 0; j < m; ++j) {
        if (!ex_digit_[j]) continue;
        const std::int64_t p = s - ex_radix_[j];
        const index_t w = distinct_[j];
        index_t b = ex_bins_[p], f = ex_fill_[p];
        if (f + w <= g) f += w; else { ++b; f = w; }
        if (b < bb || (b == bb && f < bf)) { bb = b; bf = f; bc = static_cast<index_t>(j); }
      }
      ex_bins_[s] = bb;
      ex_fill_[s] = bf;
      ex_choice_[s] = bc;
    }
    // walk back the choices, then replay them forward to form the bins
    ex_seq_.clear();
    for (std::int64_t s = states - 1; s > 0; s -= ex_radix_[ex_choice_[s]]) ex_seq_.push_back(ex_choice_[s]);
    std::reverse(ex_seq_.begin(), ex_seq_.end());
    // items of each distinct size, in window order
    ex_next_.assign(m, 0);
    // by_size_ is decreasing; the items of size distinct_[j] occupy by_size_[n - cnt_le(v) ..]
    const std::int64_t n = n_items();
    std::int64_t fill = 0;
    for (index_t j : ex_seq_) {
      const index_t w = distinct_[j];
      const index_t it = by_size_[static_cast<size_t>(n - cnt_le(w) + ex_next_[j]++)];
      if (fill + w > g) {
        out.close_group(static_cast<index_t>(fill));
        fill = 0;
      }
      out.members.push_back(it);
      fill += w;
    }
    out.close_group(static_cast<index_t>(fill));
  }

  //! Depth-first search: can the items be packed into k groups of capacity g? Items in
  //! decreasing order; for each item one group per distinct fill value is tried (groups with
  //! equal fills are interchangeable for the items still to place), and equal items are placed in
  //! nondecreasing group order; both rules keep the search complete.
  //! Returns 1 (packing in `out`), 0 (proved impossible), or -1 (node budget exhausted).
  int fits_in(index_t g, index_t k, detail::packing& out) {
    const size_t n = by_size_.size();
    if (static_cast<std::int64_t>(k) * g < total_) return 0;
    dfs_fill_.assign(static_cast<size_t>(k), 0);
    dfs_bin_.assign(n, -1);
    std::int64_t budget = 4000;
    size_t i = 0;
    while (i < n) {
      const index_t w = items_[by_size_[i]].size;
      // an item equal to its predecessor goes to the same or a later group (swapping two equal
      // items changes nothing)
      const index_t start = (i > 0 && items_[by_size_[i - 1]].size == w) ? dfs_bin_[i - 1] : 0;
      index_t b = dfs_bin_[i] >= 0 ? dfs_bin_[i] + 1 : start;
      if (dfs_bin_[i] >= 0) dfs_fill_[dfs_bin_[i]] -= w;  // undo the previous try
      for (; b < k; ++b) {
        if (dfs_fill_[b] + w > g) continue;
        bool seen = false;
        for (index_t b2 = start; b2 < b && !seen; ++b2) seen = dfs_fill_[b2] == dfs_fill_[b];
        if (!seen) break;
      }
      if (--budget < 0) return -1;
      if (b < k) {
        dfs_bin_[i] = b;
        dfs_fill_[b] += w;
        ++i;
      } else {
        dfs_bin_[i] = -1;
        if (i == 0) return 0;
        --i;
      }
    }
    out.clear();
    for (index_t b = 0; b < k; ++b) {
      if (dfs_fill_[b] == 0) continue;
      for (size_t j = 0; j < n; ++j)
        if (dfs_bin_[j] == b) out.members.push_back(by_size_[j]);
      out.close_group(dfs_fill_[b]);
    }
    return 1;
  }

  //! Number of multiset states of the exact DP (to decide whether it is affordable).
  std::int64_t exact_states() const {
    std::int64_t states = 1;
    for (index_t v : distinct_) states *= (cnt_le(v) - cnt_le(v - 1)) + 1;
    return states;
  }

  // ---- strategies -----------------------------------------------------------------------------
  status run_paper(const planner_options& opt) {
    identity_.resize(items_.size());
    std::iota(identity_.begin(), identity_.end(), 0);
    auto pack = [&](index_t g, detail::packing& p) {
      if (opt.table_dp) repeated_knapsack<true>(identity_, g, p);
      else repeated_knapsack<false>(identity_, g, p);
    };
    if (opt.group_size > 0) {
      best_g_ = static_cast<index_t>(std::min<std::int64_t>(opt.group_size, total_));
      pack(best_g_, best_);
      best_cost_ = cost_(best_g_, best_.count());
      return status::success;
    }
    // Work guard: the sweep is O((S - max w) * n * S / 64) with bitsets, O(... * S) with the table.
    const double sweep = static_cast<double>(total_ - maxw_ + 1) * static_cast<double>(n_items()) *
                         (opt.table_dp ? static_cast<double>(total_) : static_cast<double>(total_) / 64.0 + 1.0);
    if (sweep > 4e10) return status::invalid_argument;
    best_cost_ = std::numeric_limits<double>::infinity();
    for (std::int64_t g = maxw_; g <= total_; ++g) {
      pack(static_cast<index_t>(g), cur_);
      const double c = cost_(static_cast<index_t>(g), cur_.count());
      if (c < best_cost_) {  // strict: the first (smallest) G wins ties
        best_cost_ = c;
        best_g_ = static_cast<index_t>(g);
        std::swap(best_, cur_);
      }
    }
    return status::success;
  }

  //! Best packing at capacity g among our packers; `cur_` receives it. Stops early once a packer
  //! meets the bin lower bound.
  //! Best packing at capacity g among our packers, into `cur_` (count in `cur_count_`). Large
  //! inputs (`lazy`) are only counted here (`cur_lazy_` names the packer to materialize later:
  //! the sweep needs counts, only the winner needs groups). Stops as soon as a packer meets
  //! `lbb`. Returns true when the count is provably the minimum for g.
  bool pack_fast(index_t g, const planner_options& opt, index_t lbb, bool lazy) {
    if (lazy) {  // thousands of windows: histogram packers only, O(d * g) per pass
      cur_count_ = bfd_count(g);
      cur_lazy_ = lazy_bfd;
      if (cur_count_ <= lbb) return true;
      const index_t h = histogram_dp(g, nullptr);
      if (h < cur_count_) {
        cur_count_ = h;
        cur_lazy_ = lazy_hdp;
      }
      return cur_count_ <= lbb;
    }
    cur_lazy_ = lazy_none;
    repeated_knapsack<false>(by_size_, g, cur_);  // the paper's DP on decreasing sizes
    cur_count_ = cur_.count();
    if (cur_count_ <= lbb) return true;
    auto take_alt = [&] {
      if (alt_.count() < cur_count_) {
        std::swap(cur_, alt_);
        cur_count_ = cur_.count();
      }
    };
    best_fit_decreasing(g, alt_);
    take_alt();
    if (cur_count_ <= lbb) return true;
    if (n_items() <= opt.exact_max_windows && exact_states() <= (std::int64_t{1} << 16)) {
      // exact search dominates every other packer, the paper's DP included
      for (index_t k = lbb; k < cur_count_; ++k) {
        const int r = fits_in(g, k, alt_);
        if (r == 1) { take_alt(); return true; }
        if (r < 0) {  // search budget exhausted: the multiset DP decides, in bounded time
          exact_packing(g, alt_);
          take_alt();
          return true;
        }
      }
      return true;  // no k below the heuristic count fits: it is optimal
    }
    histogram_dp(g, &alt_);
    take_alt();
    if (cur_count_ <= lbb) return true;
    if (n_items() <= opt.paper_dp_max_windows) {
      identity_.resize(items_.size());
      std::iota(identity_.begin(), identity_.end(), 0);
      repeated_knapsack<false>(identity_, g, alt_);
      take_alt();
    }
    return cur_count_ <= lbb;
  }

  //! Group count of `best_fit_decreasing` without forming the groups: bins are counted per fill
  //! level. O(d * g).
  index_t bfd_count(index_t g) {
    bc_.assign(static_cast<size_t>(g) + 1, 0);
    std::int64_t bins = 0;
    for (size_t j = distinct_.size(); j-- > 0;) {  // decreasing sizes
      const index_t w = distinct_[j];
      std::int64_t c = cnt_le(w) - cnt_le(w - 1);
      for (std::int64_t f = g - w; f >= 1 && c > 0; --f) {
        if (!bc_[f]) continue;
        const std::int64_t q = (g - f) / w;  // copies a bin at fill f takes
        const std::int64_t full = std::min<std::int64_t>(bc_[f], c / q);
        bc_[f] -= full;
        bc_[f + q * w] += full;
        c -= full * q;
        if (c > 0 && c < q && bc_[f] > 0) {  // the last, partly filled bin
          --bc_[f];
          ++bc_[f + c * w];
          c = 0;
        }
      }
      if (c > 0) {  // new bins
        const std::int64_t q = g / w;
        const std::int64_t full = c / q;
        bc_[q * w] += full;
        bins += full;
        c -= full * q;
        if (c > 0) {
          ++bc_[c * w];
          ++bins;
        }
      }
    }
    return static_cast<index_t>(bins);
  }

  struct candidate {
    double lb;
    index_t g;
    index_t last;  // last G of the range this candidate walks (== g for a single G)
    index_t bins;  // group-count lower bound on the whole range
  };

  status run_fast(const planner_options& opt) {
    if (opt.group_size > 0) {
      best_g_ = static_cast<index_t>(std::min<std::int64_t>(opt.group_size, total_));
      pack_fast(best_g_, opt, bins_lower_bound(best_g_), false);
      std::swap(best_, cur_);
      best_cost_ = cost_(best_g_, best_.count());
      return status::success;
    }
    build_candidates();
    auto worse = [](const candidate& a, const candidate& b) {  // min-heap on (lb, g)
      return a.lb > b.lb || (a.lb == b.lb && a.g > b.g);
    };
    lower_bound_ = std::numeric_limits<double>::infinity();
    for (const candidate& c : cands_) lower_bound_ = std::min(lower_bound_, c.lb);
    std::make_heap(cands_.begin(), cands_.end(), worse);
    best_cost_ = std::numeric_limits<double>::infinity();
    best_g_ = 0;
    exact_counts_.clear();
    best_lazy_ = lazy_none;
    const bool lazy = n_items() > opt.paper_dp_max_windows;
    while (!cands_.empty()) {
      std::pop_heap(cands_.begin(), cands_.end(), worse);
      const candidate c = cands_.back();
      cands_.pop_back();
      if (c.lb >= best_cost_) break;  // every remaining candidate is at least as costly
      // The exact group count is nonincreasing in G: a G'' >= G solved exactly bounds G too.
      index_t bins = c.bins;
      for (const auto& e : exact_counts_)
        if (e.first >= c.g) bins = std::max(bins, e.second);
      if (bins > c.bins) {
        const double lb = cost_(c.g, bins);
        if (lb >= best_cost_) {
          if (c.g < c.last) {  // the rest of the range keeps its own (weaker) bound
            cands_.push_back({cost_(c.g + 1, c.bins), c.g + 1, c.last, c.bins});
            std::push_heap(cands_.begin(), cands_.end(), worse);
          }
          continue;
        }
      }
      if (pack_fast(c.g, opt, bins, lazy)) exact_counts_.emplace_back(c.g, cur_count_);
      const double cost = cost_(c.g, cur_count_);
      if (cost < best_cost_ || (cost == best_cost_ && c.g < best_g_)) {
        best_cost_ = cost;
        best_g_ = c.g;
        best_lazy_ = cur_lazy_;
        std::swap(best_, cur_);
      }
      if (c.g < c.last) {  // next G of the range
        const index_t g2 = c.g + 1;
        cands_.push_back({cost_(g2, c.bins), g2, c.last, c.bins});
        std::push_heap(cands_.begin(), cands_.end(), worse);
      }
    }
    if (best_lazy_ == lazy_hdp) histogram_dp(best_g_, &best_);
    if (best_lazy_ == lazy_bfd) best_fit_decreasing(best_g_, best_);
    have_lower_bound_ = true;
    return status::success;
  }

  void run_per_window() {
    best_.clear();
    for (index_t i = 0; i < static_cast<index_t>(items_.size()); ++i) {
      best_.members.push_back(i);
      best_.close_group(items_[i].size);
    }
    best_g_ = maxw_;
    best_cost_ = cost_(best_g_, best_.count());
  }

  void run_single() {
    best_.clear();
    for (index_t i = 0; i < static_cast<index_t>(items_.size()); ++i) best_.members.push_back(i);
    best_.close_group(static_cast<index_t>(total_));
    best_g_ = static_cast<index_t>(total_);
    best_cost_ = cost_(best_g_, 1);
  }

  //! Candidates of the sweep, into `cands_`: every G in [maxw, 2*maxw) on its own (L2 bound),
  //! and above that one range per k = ceil(S/G) (bound cost(G, k), nondecreasing in G within the
  //! range, so the range's first G carries its least bound).
  void build_candidates() {
    cands_.clear();
    const std::int64_t S = total_;
    const std::int64_t split = std::min<std::int64_t>(2 * static_cast<std::int64_t>(maxw_), S + 1);
    for (std::int64_t g = maxw_; g < split; ++g) {
      const index_t b = bins_lower_bound(static_cast<index_t>(g));
      cands_.push_back({cost_(static_cast<index_t>(g), b), static_cast<index_t>(g), static_cast<index_t>(g), b});
    }
    for (std::int64_t lo = split; lo <= S;) {
      const std::int64_t k = detail::ceil_div(S, lo);
      const std::int64_t hi = k > 1 ? detail::ceil_div(S, k - 1) - 1 : S;  // last G with ceil(S/G) == k
      cands_.push_back({cost_(static_cast<index_t>(lo), static_cast<index_t>(k)), static_cast<index_t>(lo),
                        static_cast<index_t>(std::min(hi, S)), static_cast<index_t>(k)});
      lo = std::min(hi, S) + 1;
    }
  }

  //! Lower bound on any plan's cost: min over G in [maxw, S] of cost(G, bins bound(G)).
  double global_lower_bound() {
    if (have_lower_bound_) return lower_bound_;
    build_candidates();
    double lb = std::numeric_limits<double>::infinity();
    for (const candidate& c : cands_) lb = std::min(lb, c.lb);
    return lb;
  }

  void emit(strategy st, plan& out) {
    out.strat = st;
    out.group_size = best_g_;
    out.group_offsets.assign(best_.offsets.begin(), best_.offsets.end());
    out.windows.resize(best_.members.size());
    for (size_t i = 0; i < best_.members.size(); ++i) out.windows[i] = items_[best_.members[i]].window;
    out.fills.assign(best_.fills.begin(), best_.fills.end());
    out.cost = best_cost_;
    out.lower_bound = global_lower_bound();
    have_lower_bound_ = false;
  }

  CostModel cost_;
  std::vector<item> items_;
  std::int64_t total_ = 0;
  index_t maxw_ = 0;
  std::vector<std::int64_t> cnt_le_, sum_le_;
  std::vector<index_t> distinct_, by_size_, identity_, sort_next_;
  // knapsack scratch
  std::vector<index_t> remaining_, phi_, chosen_, table_;
  std::vector<std::uint64_t> rows_;
  // BFD scratch
  std::vector<index_t> bucket_head_, bin_next_, bin_items_, bin_fill_, item_next_;
  // exact DP scratch
  std::vector<index_t> ex_radix_, ex_cnt_, ex_digit_, ex_next_, ex_seq_;
  std::vector<index_t> ex_bins_, ex_fill_, ex_choice_;
  std::vector<index_t> dfs_fill_, dfs_bin_;
  std::vector<index_t> hd_cnt_, hd_take_, hd_next_, hd_used_;
  std::vector<std::uint8_t> hd_reach_;
  // sweep state
  std::vector<candidate> cands_;
  std::vector<std::pair<index_t, index_t>> exact_counts_;  // (G, exact minimum groups at G)
  detail::packing best_, cur_, alt_;
  index_t best_g_ = 0, cur_count_ = 0;
  enum lazy_packer { lazy_none, lazy_bfd, lazy_hdp };
  lazy_packer cur_lazy_ = lazy_none, best_lazy_ = lazy_none;
  std::vector<std::int64_t> bc_;
  double best_cost_ = 0;
  double lower_bound_ = 0;
  bool have_lower_bound_ = false;
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
