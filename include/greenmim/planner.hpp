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
//! `planner_options::group_size` fixes G for `paper` and `fast` (capped at sum w_i).
//! Cost models: see cost_model.hpp (nondecreasing in G and in the number of groups).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <type_traits>
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

//! Whether a cost model has the form n * per_group(G) (see cost_model.hpp).
template <class C, class = void>
struct has_per_group : std::false_type {};
template <class C>
struct has_per_group<C, std::void_t<decltype(std::declval<const C&>().per_group(index_t{}))>> : std::true_type {};

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
    work_ = 0;
    budget_hit_ = false;
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
    item() {}  // no zeroing: the counting sort writes every slot it keeps
    item(index_t w, index_t s) : window(w), size(s) {}
  };

  // ---- set-up ---------------------------------------------------------------------------------
  status prepare(span<const index_t> sizes, const planner_options& opt) {
    items_.clear();
    have_input_order_ = false;
    best_holds_windows_ = false;
    fs_bounds_ = sizes.size() <= opt.paper_dp_max_windows;
    total_ = 0;
    maxw_ = 0;
    if (sizes.size() == 0) return status::empty_input;
    if (sizes.size() > std::numeric_limits<index_t>::max()) return status::overflow;
    if (opt.group_size < 0) return status::invalid_argument;
    if (status st = build_histogram(sizes.data(), sizes.size()); st != status::success) return st;
    if (opt.group_size > 0 && opt.strat != strategy::paper && opt.strat != strategy::fast)
      return status::invalid_argument;
    if (opt.group_size > 0 && opt.group_size < maxw_) return status::size_exceeds_group;
    return status::success;
  }

  //! Validates the sizes, builds the size histogram (cnt_le_, sum_le_, distinct_, total_, maxw_)
  //! and the items in decreasing-size order, stable in window index (the order the DP on
  //! decreasing sizes and BFD use), by a counting sort: sizes are small integers, so O(n + max w).
  //! The items of size w occupy [n - cnt_le(w), n - cnt_le(w-1)). The input is cut into four
  //! contiguous parts walked in lockstep, each with its own counters, so runs of equal sizes do
  //! not serialize on one counter (store-to-load forwarding).
  status build_histogram(const index_t* s, std::int64_t n_all) {
    // fast path: every size below a power-of-two cap (a size >= cap, or a negative one, shows up
    // in the OR of the sizes); otherwise find the range exactly, validate, and grow the cap
    if (hist_cap_ < 64) hist_cap_ = 64;
    const std::int64_t q = n_all / 4;  // parts [k*q, (k+1)*q) for k < 3; the last also takes the tail
    for (;;) {
      const size_t cap = hist_cap_;
      hist4_.assign(4 * cap, 0);
      std::int32_t* h = hist4_.data();
      std::uint32_t any = 0;
      for (std::int64_t i = 0; i < q; ++i) {
        const auto u0 = static_cast<std::uint32_t>(s[i]), u1 = static_cast<std::uint32_t>(s[q + i]);
        const auto u2 = static_cast<std::uint32_t>(s[2 * q + i]), u3 = static_cast<std::uint32_t>(s[3 * q + i]);
        if ((u0 | u1 | u2 | u3) >= cap) { any = ~0u; break; }
        ++h[u0];
        ++h[cap + u1];
        ++h[2 * cap + u2];
        ++h[3 * cap + u3];
      }
      for (std::int64_t i = 4 * q; i < n_all && any < cap; ++i) {
        const auto u = static_cast<std::uint32_t>(s[i]);
        any |= u;
        if (u < cap) ++h[3 * cap + u];
      }
      if (any < cap) break;
      index_t lo = 0, hi = 0;
      for (std::int64_t i = 0; i < n_all; ++i) {
        lo = std::min(lo, s[i]);
        hi = std::max(hi, s[i]);
      }
      if (lo < 0) return status::invalid_argument;
      if (hi > max_window_size) return status::overflow;
      hist_cap_ = hist_cap_for(hi);
    }
    const size_t cap = hist_cap_;
    const std::int32_t* h = hist4_.data();
    index_t hi = 0;
    for (size_t v = cap; v-- > 1;)
      if (h[v] + h[cap + v] + h[2 * cap + v] + h[3 * cap + v]) { hi = static_cast<index_t>(v); break; }
    if (hi == 0) return status::empty_input;
    // let the cap follow the sizes down too, with hysteresis (a huge window once should not make
    // every later plan clear a huge histogram)
    if (hist_cap_for(hi) * 8 <= hist_cap_) hist_cap_ = hist_cap_for(hi);
    const size_t w1 = static_cast<size_t>(hi) + 1;
    cnt_le_.resize(w1);
    sum_le_.resize(w1);
    distinct_.clear();
    cnt_le_[0] = 0;  // zero-size windows are not items
    sum_le_[0] = 0;
    for (size_t v = 1; v < w1; ++v) {
      const std::int64_t c = std::int64_t{h[v]} + h[cap + v] + h[2 * cap + v] + h[3 * cap + v];
      if (c) distinct_.push_back(static_cast<index_t>(v));
      sum_le_[v] = sum_le_[v - 1] + c * static_cast<std::int64_t>(v);
      cnt_le_[v] = cnt_le_[v - 1] + c;
    }
    if (sum_le_[w1 - 1] > max_total_size) return status::overflow;
    total_ = sum_le_[w1 - 1];
    maxw_ = hi;
    // placement: part k's first item of size v goes after all larger items and after the items of
    // size v in parts < k; empty windows go to [n, n_all) and are dropped after
    const std::int64_t n = cnt_le_[w1 - 1];
    next4_.resize(4 * w1);
    index_t* nx = next4_.data();
    for (size_t v = 0; v < w1; ++v) {
      std::int64_t at = v ? n - cnt_le_[v] : n;
      for (size_t k = 0; k < 4; ++k) {
        nx[k * w1 + v] = static_cast<index_t>(at);
        at += h[k * cap + v];
      }
    }
    items_.resize(static_cast<size_t>(n_all));
    item* it = items_.data();
    index_t *n0 = nx, *n1 = nx + w1, *n2 = nx + 2 * w1, *n3 = nx + 3 * w1;
    for (std::int64_t i = 0; i < q; ++i) {
      const index_t w0 = s[i], w1v = s[q + i], w2 = s[2 * q + i], w3 = s[3 * q + i];
      it[n0[w0]++] = item(static_cast<index_t>(i), w0);
      it[n1[w1v]++] = item(static_cast<index_t>(q + i), w1v);
      it[n2[w2]++] = item(static_cast<index_t>(2 * q + i), w2);
      it[n3[w3]++] = item(static_cast<index_t>(3 * q + i), w3);
    }
    for (std::int64_t i = 4 * q; i < n_all; ++i) it[n3[s[i]]++] = item(static_cast<index_t>(i), s[i]);
    items_.resize(static_cast<size_t>(n));
    return status::success;
  }

  //! Histogram capacity for sizes up to `hi`: the least power of two above it, at least 64.
  static size_t hist_cap_for(index_t hi) {
    size_t c = 64;
    while (c <= static_cast<size_t>(hi)) c *= 2;
    return c;
  }

  //! Item positions in window order (the paper's input order), built on demand.
  const std::vector<index_t>& input_order() {
    if (!have_input_order_) {
      // windows are distinct, so a counting pass over window indices orders them
      index_t top = 0;
      for (const item& it : items_) top = std::max(top, it.window);
      order_tmp_.assign(static_cast<size_t>(top) + 1, -1);
      for (index_t p = 0; p < static_cast<index_t>(items_.size()); ++p) order_tmp_[items_[p].window] = p;
      input_order_.clear();
      for (index_t p : order_tmp_)
        if (p >= 0) input_order_.push_back(p);
      have_input_order_ = true;
    }
    return input_order_;
  }
  //! Item positions in decreasing-size order: 0, 1, ..., n-1.
  const std::vector<index_t>& size_order() {
    if (size_order_.size() != items_.size()) {
      size_order_.resize(items_.size());
      std::iota(size_order_.begin(), size_order_.end(), 0);
    }
    return size_order_;
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
    // L2 = max over k of j1 + j2 + ceil(max(rest, 0) / g) = ceil(max over k of X_k / g) with
    // X_k = (j1 + j2) * g + max(rest, 0): one division instead of one per k
    std::int64_t best = 0;
    auto eval = [&](std::int64_t k) {
      const std::int64_t j1 = n - cnt_le(g - k);
      const std::int64_t j2 = cnt_le(g - k) - cnt_le(half);
      const std::int64_t s2 = sum_le(g - k) - sum_le(half);
      const std::int64_t s3 = sum_le(half) - sum_le(k - 1);
      const std::int64_t rest = s3 - (j2 * g - s2);
      best = std::max(best, (j1 + j2) * g + std::max<std::int64_t>(rest, 0));
    };
    eval(0);
    for (index_t v : distinct_) {
      if (v > half) break;
      eval(v);
    }
    std::int64_t lb = std::max(l1, detail::ceil_div(best, g));
    // Fekete-Schepers dual feasible functions u^(k), k = 1..10: an item w counts w/g when g
    // divides (k+1)w, else floor((k+1)w/g)/k; no group holds more than 1, so
    // ceil(sum of the counts) groups are needed. Exact in integers: ceil((A*k + B*g) / (g*k)).
    // Skipped for large batches, whose gaps are already tiny and whose time is tighter.
    for (std::int64_t k = 1; k <= (fs_bounds_ ? 10 : 0); ++k) {
      std::int64_t A = 0, B = 0;
      for (index_t v : distinct_) {
        const std::int64_t c = cnt_le(v) - cnt_le(v - 1), t = (k + 1) * v;
        if (t % g == 0) A += c * v;
        else B += c * (t / g);
      }
      lb = std::max(lb, detail::ceil_div(A * k + B * g, g * k));
    }
    return static_cast<index_t>(lb);
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
    const size_t n = items_.size();
    while (pos < n) {
      const index_t w = items_[pos].size;
      size_t end = pos;
      while (end < n && items_[end].size == w) ++end;
      for (std::int64_t f = g - w; f >= 1 && pos < end; --f) {
        while (bucket_head_[f] >= 0 && pos < end) {
          const index_t b = bucket_head_[f];
          bucket_head_[f] = bin_next_[b];
          std::int64_t fill = f;
          while (fill + w <= g && pos < end) push_item(b, static_cast<index_t>(pos++)), fill += w;
          move_bin(b, static_cast<index_t>(fill));
        }
      }
      while (pos < end) {  // open new bins
        const index_t b = static_cast<index_t>(bin_fill_.size());
        bin_fill_.push_back(0);
        bin_next_.push_back(-1);
        bin_items_.push_back(-1);
        std::int64_t fill = 0;
        while (fill + w <= g && pos < end) push_item(b, static_cast<index_t>(pos++)), fill += w;
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

  //! Calls shift(t * v) for the binary split t = 1, 2, 4, ..., remainder of 0..t_max copies of
  //! size v: or-ing a reachable set with itself shifted by each makes every count 0..t_max reachable.
  template <class Shift>
  static void binary_split(std::int64_t t_max, std::int64_t v, Shift shift) {
    for (std::int64_t k = 1; t_max > 0; k <<= 1) {
      const std::int64_t take = std::min(k, t_max);
      t_max -= take;
      shift(take * v);
    }
  }

  //! Patterns found by `histogram_dp`: pattern p forms `reps` identical groups, each taking
  //! `takes[begin, end)` = (size rank j, copies) items; ranks count from the largest size.
  struct hd_patterns {
    struct pattern {
      index_t fill;
      index_t reps;
      index_t begin, end;
    };
    std::vector<pattern> pats;
    std::vector<std::pair<index_t, index_t>> takes;
    index_t groups = 0;
    void clear() {
      pats.clear();
      takes.clear();
      groups = 0;
    }
  };

  //! Subset-sum DP on the size histogram ("DP on decreasing sizes" for large n): each group is
  //! the largest fill <= g reachable with the remaining counts, reconstructed preferring larger
  //! sizes, and each pattern found is applied as many times as the counts allow. Reachable fills
  //! are bitsets (one word for g < 64); a size with count c is added by log2(c) shift-ors
  //! (binary splitting of 0..c copies). O(phases * d * log(g) * g / 64). Returns the number of
  //! groups; the patterns go to `res` (`materialize` turns them into groups).
  index_t histogram_dp(index_t g, hd_patterns& res) {
    using word = std::uint64_t;
    res.clear();
    const size_t m = distinct_.size();
    const size_t W = static_cast<size_t>(g) / 64 + 1;
    const word top_mask = (g % 64 == 63) ? ~word{0} : ((word{1} << (g % 64 + 1)) - 1);
    // active size ranks (count > 0), largest size first; rank j = 0 is the largest size
    hd_cnt_.resize(m);
    hd_active_.resize(m);
    std::int64_t left = 0;
    for (size_t j = 0; j < m; ++j) {
      const index_t v = distinct_[m - 1 - j];
      hd_cnt_[j] = static_cast<index_t>(cnt_le(v) - cnt_le(v - 1));
      hd_active_[j] = static_cast<index_t>(j);
      left += hd_cnt_[j];
    }
    size_t act = m;
    hd_reach_.resize((m + 1) * W);
    auto test = [](const word* r, std::int64_t x) { return (r[x >> 6] >> (x & 63)) & 1u; };
    while (left > 0) {
      // row a + 1 = fills reachable with the first a + 1 active sizes (row 0 = {0})
      word* r0 = hd_reach_.data();
      if (W == 1) {  // g < 64: one word per row
        word r = 1;
        r0[0] = r;
        for (size_t a = 0; a < act; ++a) {
          const index_t j = hd_active_[a];
          const std::int64_t v = distinct_[m - 1 - static_cast<size_t>(j)];
          binary_split(std::min<std::int64_t>(hd_cnt_[j], g / v), v, [&](std::int64_t sh) { r |= r << sh; });
          r0[a + 1] = r;
        }
      } else {
        std::fill(r0, r0 + W, word{0});
        r0[0] = 1;
        for (size_t a = 0; a < act; ++a) {
          const index_t j = hd_active_[a];
          const std::int64_t v = distinct_[m - 1 - static_cast<size_t>(j)];
          word* cur = r0 + (a + 1) * W;
          std::copy(r0 + a * W, r0 + (a + 1) * W, cur);
          binary_split(std::min<std::int64_t>(hd_cnt_[j], g / v), v, [&](std::int64_t sh) {
            const size_t ws = static_cast<size_t>(sh >> 6);
            const unsigned bs = static_cast<unsigned>(sh & 63);
            for (size_t i = W; i-- > ws;) {  // descending: in place (no-op when ws >= W)
              word x = cur[i - ws] << bs;
              if (bs && i > ws) x |= cur[i - ws - 1] >> (64 - bs);
              cur[i] |= x;
            }
          });
        }
      }
      const word* last = r0 + act * W;
      std::int64_t fill = -1;
      for (size_t i = W; i-- > 0 && fill < 0;) {
        const word x = i + 1 == W ? last[i] & top_mask : last[i];
        if (x) fill = static_cast<std::int64_t>(i) * 64 + 63 - detail::clz64(x);
      }
      // reconstruct, smallest size first (take the fewest copies possible), so larger sizes fill
      std::int64_t rest = fill;
      std::int64_t reps = std::numeric_limits<std::int64_t>::max();
      const index_t begin = static_cast<index_t>(res.takes.size());
      for (size_t a = act; a-- > 0;) {
        const index_t j = hd_active_[a];
        const std::int64_t v = distinct_[m - 1 - static_cast<size_t>(j)];
        index_t t = 0;
        while (!test(r0 + a * W, rest - static_cast<std::int64_t>(t) * v)) ++t;
        if (t) {
          res.takes.emplace_back(j, t);
          rest -= static_cast<std::int64_t>(t) * v;
          reps = std::min<std::int64_t>(reps, hd_cnt_[j] / t);
        }
      }
      bool emptied = false;
      for (size_t q = begin; q < res.takes.size(); ++q) {
        const index_t j = res.takes[q].first;
        hd_cnt_[j] -= static_cast<index_t>(reps * res.takes[q].second);
        left -= reps * res.takes[q].second;
        emptied |= hd_cnt_[j] == 0;
      }
      if (emptied) {  // drop exhausted sizes, keeping the order
        size_t k = 0;
        for (size_t a = 0; a < act; ++a)
          if (hd_cnt_[hd_active_[a]] > 0) hd_active_[k++] = hd_active_[a];
        act = k;
      }
      res.pats.push_back({static_cast<index_t>(fill), static_cast<index_t>(reps), begin,
                          static_cast<index_t>(res.takes.size())});
      res.groups += static_cast<index_t>(reps);
    }
    return res.groups;
  }

  //! The groups of `res` (from `histogram_dp` on the current items), into `out`: item positions,
  //! or window indices (the caller's numbering) when `Windows`.
  template <bool Windows>
  void materialize(const hd_patterns& res, detail::packing& out) {
    const size_t m = distinct_.size();
    const std::int64_t n = n_items();
    hd_next_.resize(m);
    for (size_t j = 0; j < m; ++j) hd_next_[j] = static_cast<index_t>(n - cnt_le(distinct_[m - 1 - j]));
    out.members.resize(static_cast<size_t>(n));
    out.fills.resize(static_cast<size_t>(res.groups));
    out.offsets.resize(static_cast<size_t>(res.groups) + 1);
    index_t* mem = out.members.data();
    index_t* nxt = hd_next_.data();
    const item* items = items_.data();
    size_t base = 0, grp = 0;
    out.offsets[0] = 0;
    // pattern by pattern, column by column: the groups of one pattern have the same layout, so
    // each (size, copies) column is a strided copy with no loop-carried memory dependency
    for (const auto& p : res.pats) {
      size_t len = 0;
      for (index_t q = p.begin; q < p.end; ++q) len += static_cast<size_t>(res.takes[q].second);
      size_t off = 0;
      for (index_t q = p.begin; q < p.end; ++q) {
        const index_t j = res.takes[q].first, t = res.takes[q].second;
        const index_t src = nxt[j];
        index_t* dst = mem + base + off;
        if (t == 1) {
          for (index_t r = 0; r < p.reps; ++r) dst[static_cast<size_t>(r) * len] = Windows ? items[src + r].window : src + r;
        } else {
          for (index_t r = 0; r < p.reps; ++r)
            for (index_t c = 0; c < t; ++c) {
              const index_t at = src + r * t + c;
              dst[static_cast<size_t>(r) * len + static_cast<size_t>(c)] = Windows ? items[at].window : at;
            }
        }
        nxt[j] = src + p.reps * t;
        off += static_cast<size_t>(t);
      }
      for (index_t r = 0; r < p.reps; ++r) {
        out.fills[grp] = p.fill;
        base += len;
        out.offsets[++grp] = static_cast<index_t>(base);
      }
    }
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
    // the items of size distinct_[j] occupy [n - cnt_le(v), ...)
    const std::int64_t n = n_items();
    std::int64_t fill = 0;
    for (index_t j : ex_seq_) {
      const index_t w = distinct_[j];
      const index_t it = static_cast<index_t>(n - cnt_le(w) + ex_next_[j]++);
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
  //! Returns 1 (packing in `out`), 0 (proved impossible), or -1 (budget of `budget` steps, one per bin examined, exhausted).
  int fits_in(index_t g, index_t k, detail::packing& out, std::int64_t budget) {
    const size_t n = items_.size();
    if (static_cast<std::int64_t>(k) * g < total_) return 0;
    dfs_fill_.assign(static_cast<size_t>(k), 0);
    dfs_bin_.assign(n, -1);
    size_t i = 0;
    while (i < n) {
      const index_t w = items_[i].size;
      // an item equal to its predecessor goes to the same or a later group (swapping two equal
      // items changes nothing)
      const index_t start = (i > 0 && items_[i - 1].size == w) ? dfs_bin_[i - 1] : 0;
      index_t b = dfs_bin_[i] >= 0 ? dfs_bin_[i] + 1 : start;
      if (dfs_bin_[i] >= 0) dfs_fill_[dfs_bin_[i]] -= w;  // undo the previous try
      for (; b < k; ++b) {
        --budget;
        if (dfs_fill_[b] + w > g) continue;
        bool seen = false;
        index_t b2 = start;
        for (; b2 < b && !seen; ++b2) seen = dfs_fill_[b2] == dfs_fill_[b];
        budget -= b2 - start;
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
        if (dfs_bin_[j] == b) out.members.push_back(static_cast<index_t>(j));
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
    const std::vector<index_t>& order = input_order();
    auto pack = [&](index_t g, detail::packing& p) {
      if (opt.table_dp) repeated_knapsack<true>(order, g, p);
      else repeated_knapsack<false>(order, g, p);
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
    const std::int64_t words = static_cast<std::int64_t>(g) / 64 + 1;  // one DP bitset row
    const std::int64_t n = n_items(), d = static_cast<std::int64_t>(distinct_.size());
    // best fit scans the fill levels once per distinct size: O(n + d * g)
    const std::int64_t bfd_work = 32 * n + (d + 1) * static_cast<std::int64_t>(g) / 4;
    if (lazy) {  // thousands of windows: histogram packers only, O(d * g) per pass
      charge(bfd_work);
      cur_count_ = bfd_count(g);
      cur_lazy_ = lazy_bfd;
      if (cur_count_ <= lbb) return true;
      // a pass is at most one phase per group, each over the active sizes' rows
      if (!afford(static_cast<std::int64_t>(cur_count_) * d * words, opt)) return false;
      const index_t h = histogram_dp(g, hd_cur_);
      if (h < cur_count_) {
        cur_count_ = h;
        cur_lazy_ = lazy_hdp;
      }
      return cur_count_ <= lbb;
    }
    cur_lazy_ = lazy_none;
    auto take_alt = [&] {
      if (alt_.count() < cur_count_) {
        std::swap(cur_, alt_);
        cur_count_ = cur_.count();
      }
    };
    charge(bfd_work);
    best_fit_decreasing(g, alt_);
    // the paper's DP on decreasing sizes (a knapsack over the remaining items per group) first,
    // best fit on a tie; best fit alone when the DP is beyond the budget
    if (afford(static_cast<std::int64_t>(alt_.count()) * n * words, opt)) {
      repeated_knapsack<false>(size_order(), g, cur_);
      cur_count_ = cur_.count();
      if (cur_count_ <= lbb) return true;
      take_alt();
    } else {
      std::swap(cur_, alt_);
      cur_count_ = cur_.count();
    }
    if (cur_count_ <= lbb) return true;
    if (n_items() <= opt.exact_max_windows && exact_states() <= (std::int64_t{1} << 16)) {
      // exact search dominates every other packer, the paper's DP included
      for (index_t k = lbb; k < cur_count_; ++k) {
        const int r = fits_in(g, k, alt_, opt.search_budget);
        if (r == 1) { take_alt(); return true; }
        if (r < 0) {  // search budget exhausted: the multiset DP decides, in bounded time
          exact_packing(g, alt_);
          take_alt();
          return true;
        }
      }
      return true;  // no k below the heuristic count fits: it is optimal
    }
    if (afford(static_cast<std::int64_t>(cur_count_) * d * words, opt)) {
      histogram_dp(g, hd_cur_);
      materialize<false>(hd_cur_, alt_);
      take_alt();
    }
    if (cur_count_ <= lbb) return true;
    if (n_items() <= opt.paper_dp_max_windows && afford(static_cast<std::int64_t>(cur_count_) * n * words, opt)) {
      repeated_knapsack<false>(input_order(), g, alt_);
      take_alt();
      // a bounded search for one group fewer: finds a better packing, or proves this one optimal
      while (cur_count_ > lbb && opt.search_budget > 0) {
        const int r = fits_in(g, cur_count_ - 1, alt_, opt.search_budget);
        if (r != 1) return r == 0;
        take_alt();
      }
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
  //! Work accounting (planner_options::work_budget): `afford` charges `units` and returns true,
  //! or returns false (charging nothing) when they would exceed the budget.
  void charge(std::int64_t units) { work_ += units; }
  bool afford(std::int64_t units, const planner_options& opt) {
    if (opt.work_budget > 0 && work_ + units > opt.work_budget) {
      budget_hit_ = true;
      return false;
    }
    work_ += units;
    return true;
  }

  bool refine(candidate& c) const {
    if (c.kind != cand_cheap) return false;
    c.kind = cand_exact;
    const index_t b = bins_lower_bound(c.g);
    if (b == c.bins) return false;
    c.bins = b;
    c.lb = cost_(c.g, b);
    return true;
  }
  //! ceil(S/k): S/k in double, truncated, then corrected by one multiplication (exact for
  //! S < 2^53; unlike integer divisions these pipeline).
  std::int64_t ceil_s_over(std::int64_t k) const {
    auto c = static_cast<std::int64_t>(static_cast<double>(total_) / static_cast<double>(k));
    c += c * k < total_;
    return c;
  }
  //! Bound on cost(G', k') over every range not yet listed (G' >= g, k' = ceil(S/G')): for a cost
  //! n * per_group(G) with per_group(G)/G nondecreasing, k' * per_group(G') >= S * per_group(g)/g.
  //! Shaded by 1e-12 so rounding never lifts it above a range's own bound.
  double gen_bound(index_t g) const {
    if constexpr (detail::has_per_group<CostModel>::value)
      return static_cast<double>(total_) * static_cast<double>(cost_.per_group(g)) / static_cast<double>(g) *
             (1.0 - 1e-12);
    else
      return 0.0;
  }
  //! Lists the generator's next nonempty range into `r` (false when none is left) and advances
  //! the generator; an exhausted generator gets an infinite bound.
  bool next_range(candidate& gen, candidate& r) const {
    for (std::int64_t k = gen.bins; k >= 1; --k) {
      const std::int64_t lo = std::max(split_, ceil_s_over(k));
      const std::int64_t hi = k > 1 ? ceil_s_over(k - 1) - 1 : total_;
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
  bool visit(const candidate& c, const planner_options& opt, bool lazy, candidate& next) {
    // The exact group count is nonincreasing in G: a G'' >= G solved exactly bounds G too.
    index_t bins = c.bins;
    // exact minimum counts are nonincreasing in G: the nearest solved G'' >= G has the largest
    const auto solved = exact_counts_.lower_bound(c.g);
    if (solved != exact_counts_.end()) bins = std::max(bins, solved->second);
    if (bins <= c.bins || cost_(c.g, bins) < best_cost_) {
      if (pack_fast(c.g, opt, bins, lazy))
        exact_counts_.emplace(c.g, cur_count_);
      else  // not proven optimal at this G: only the bound holds for it
        unproven_lb_ = std::min(unproven_lb_, cost_(c.g, bins));
      const double cost = cost_(c.g, cur_count_);
      if (cost < best_cost_ || (cost == best_cost_ && c.g < best_g_)) {
        best_cost_ = cost;
        best_g_ = c.g;
        best_lazy_ = cur_lazy_;
        std::swap(best_, cur_);
        if (cur_lazy_ == lazy_hdp) std::swap(hd_best_, hd_cur_);
      }
    }
    if (c.g >= c.last) return false;
    // the rest of the range keeps the range's own (weaker) bound
    next = {cost_(c.g + 1, c.bins), c.g + 1, c.last, c.bins, cand_exact};
    return true;
  }

  status run_fast(const planner_options& opt) {
    const bool lazy = n_items() > opt.paper_dp_max_windows;
    best_holds_windows_ = false;
    if (opt.group_size > 0) {
      best_g_ = static_cast<index_t>(std::min<std::int64_t>(opt.group_size, total_));
      pack_fast(best_g_, opt, bins_lower_bound(best_g_), lazy);
      std::swap(best_, cur_);
      std::swap(hd_best_, hd_cur_);
      best_lazy_ = cur_lazy_;
      finish_lazy();
      best_cost_ = cost_(best_g_, best_.count());
      return status::success;
    }
    build_candidates();
    const size_t first = least_candidate();
    lower_bound_ = cands_[first].lb;
    unproven_lb_ = std::numeric_limits<double>::infinity();
    best_cost_ = std::numeric_limits<double>::infinity();
    best_g_ = 0;
    exact_counts_.clear();
    best_lazy_ = lazy_none;
    // The most promising candidate first, outside the heap: its cost usually rules out nearly
    // every other candidate, and only the survivors (bound below the incumbent) are heaped.
    // The visiting order is the heap's order either way.
    const candidate c0 = cands_[first];
    cands_[first] = cands_.back();
    cands_.pop_back();
    candidate next;
    if (visit(c0, opt, lazy, next)) cands_.push_back(next);
    cands_.erase(std::remove_if(cands_.begin(), cands_.end(), [&](const candidate& c) { return c.lb >= best_cost_; }),
                 cands_.end());
    std::make_heap(cands_.begin(), cands_.end(), worse);
    while (!cands_.empty()) {
      std::pop_heap(cands_.begin(), cands_.end(), worse);
      candidate c = cands_.back();
      cands_.pop_back();
      if (c.lb >= best_cost_) break;  // every remaining candidate is at least as costly
      if (opt.work_budget > 0 && work_ >= opt.work_budget) {  // out of budget: c has the least bound left
        budget_hit_ = true;
        unproven_lb_ = std::min(unproven_lb_, c.lb);
        break;
      }
      if (c.kind == cand_gen) {  // list the next range; the generator goes back with its new bound
        candidate r;
        if (next_range(c, r) && r.lb < best_cost_) {
          cands_.push_back(r);
          std::push_heap(cands_.begin(), cands_.end(), worse);
        }
        if (c.lb < best_cost_) {
          cands_.push_back(c);
          std::push_heap(cands_.begin(), cands_.end(), worse);
        }
        continue;
      }
      charge(fs_bounds_ ? 8 * n_items() : 4 * static_cast<std::int64_t>(distinct_.size()));
      if (refine(c)) {  // its bound rose: back into the heap, in its new place
        if (c.lb < best_cost_) {
          cands_.push_back(c);
          std::push_heap(cands_.begin(), cands_.end(), worse);
        }
        continue;
      }
      if (visit(c, opt, lazy, next)) {
        cands_.push_back(next);
        std::push_heap(cands_.begin(), cands_.end(), worse);
      }
    }
    finish_lazy();
    // A posteriori bound: every G was packed optimally (proven), packed with only its bound
    // proven (unproven_lb_), or never packed because its bound reached the best cost. So no plan
    // costs less than min(best cost, unproven_lb_); this is at least the a-priori bound, and
    // equals the best cost (gap 0) when every packed G was proven.
    lower_bound_ = std::max(lower_bound_, std::min(best_cost_, unproven_lb_));
    have_lower_bound_ = true;
    return status::success;
  }

  //! Forms the groups of a plan that was only counted (large inputs): see pack_fast.
  void finish_lazy() {
    if (best_lazy_ == lazy_hdp) {
      materialize<true>(hd_best_, best_);
      best_holds_windows_ = true;
    }
    if (best_lazy_ == lazy_bfd) best_fit_decreasing(best_g_, best_);
    best_lazy_ = lazy_none;
  }

  void run_per_window() {
    best_.clear();
    for (index_t i : input_order()) {
      best_.members.push_back(i);
      best_.close_group(items_[i].size);
    }
    best_g_ = maxw_;
    best_cost_ = cost_(best_g_, best_.count());
  }

  void run_single() {
    best_.clear();
    const std::vector<index_t>& order = input_order();
    best_.members.assign(order.begin(), order.end());
    best_.close_group(static_cast<index_t>(total_));
    best_g_ = static_cast<index_t>(total_);
    best_cost_ = cost_(best_g_, 1);
  }

  //! Candidates of the sweep, into `cands_`: every G in [maxw, 2*maxw) on its own (bound
  //! ceil(S/G), refined to L2 when it matters), and above that one range per k = ceil(S/G) (bound cost(G, k), nondecreasing in G within the
  //! range, so the range's first G carries its least bound).
  void build_candidates() {
    const std::int64_t S = total_;
    split_ = std::min<std::int64_t>(2 * static_cast<std::int64_t>(maxw_), S + 1);
    const std::int64_t kmax = split_ > S ? 0 : ceil_s_over(split_);
    constexpr bool lazy_ranges = detail::has_per_group<CostModel>::value;
    // sized once and written in place (no push_back of temporaries)
    cands_.resize(static_cast<size_t>(split_ - maxw_ + (lazy_ranges ? 1 : kmax)));
    candidate* out = cands_.data();
    size_t n = 0;
    for (std::int64_t g = maxw_; g < split_; ++g) {  // L2 bounds come later, where they matter
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



  //! Lower bound on any plan's cost: min over G in [maxw, S] of cost(G, bins bound(G)).
  double global_lower_bound() {
    if (have_lower_bound_) return lower_bound_;
    build_candidates();
    return cands_[least_candidate()].lb;
  }

  void emit(strategy st, plan& out) {
    out.strat = st;
    out.group_size = best_g_;
    // swap, not copy: the plan's old buffers become scratch, so a reused plan allocates nothing
    std::swap(out.group_offsets, best_.offsets);
    std::swap(out.fills, best_.fills);
    if (best_holds_windows_) {
      std::swap(out.windows, best_.members);
    } else {
      out.windows.resize(best_.members.size());
      const index_t* mem = best_.members.data();
      index_t* win = out.windows.data();
      const item* items = items_.data();
      for (size_t i = 0, e = best_.members.size(); i < e; ++i) win[i] = items[mem[i]].window;
    }
    best_holds_windows_ = false;
    out.cost = best_cost_;
    out.lower_bound = global_lower_bound();
    out.budget_exhausted = budget_hit_;
    have_lower_bound_ = false;
  }

  CostModel cost_;
  std::vector<item> items_;
  std::int64_t total_ = 0;
  index_t maxw_ = 0;
  std::vector<std::int64_t> cnt_le_, sum_le_;
  std::vector<index_t> distinct_, sort_next_, input_order_, size_order_, order_tmp_;
  std::vector<std::int32_t> hist4_;
  std::vector<index_t> next4_;
  size_t hist_cap_ = 0;
  bool have_input_order_ = false;
  bool best_holds_windows_ = false;  // best_.members are window indices (not item positions)
  bool fs_bounds_ = true;            // add the Fekete-Schepers bounds to L2 (small inputs)
  // knapsack scratch
  std::vector<index_t> remaining_, phi_, chosen_, table_;
  std::vector<std::uint64_t> rows_;
  // BFD scratch
  std::vector<index_t> bucket_head_, bin_next_, bin_items_, bin_fill_, item_next_;
  // exact DP scratch
  std::vector<index_t> ex_radix_, ex_cnt_, ex_digit_, ex_next_, ex_seq_;
  std::vector<index_t> ex_bins_, ex_fill_, ex_choice_;
  std::vector<index_t> dfs_fill_, dfs_bin_;
  std::vector<index_t> hd_cnt_, hd_next_, hd_active_;
  std::vector<std::uint64_t> hd_reach_;
  hd_patterns hd_cur_, hd_best_;
  // sweep state
  std::vector<candidate> cands_;
  std::int64_t split_ = 0;  // first G covered by ranges (2 * max w, or S + 1)
  std::map<index_t, index_t> exact_counts_;  // G -> exact minimum number of groups at G
  std::int64_t work_ = 0;                   // work spent by this plan (see planner_options::work_budget)
  bool budget_hit_ = false;
  detail::packing best_, cur_, alt_;
  index_t best_g_ = 0, cur_count_ = 0;
  enum lazy_packer { lazy_none, lazy_bfd, lazy_hdp };
  lazy_packer cur_lazy_ = lazy_none, best_lazy_ = lazy_none;
  std::vector<std::int64_t> bc_;
  double best_cost_ = 0;
  double lower_bound_ = 0;
  double unproven_lb_ = 0;  // least bound over the G packed without a proof of optimality
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
