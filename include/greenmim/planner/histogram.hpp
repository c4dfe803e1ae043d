//! \file planner/histogram.hpp
//! The planner's input, prepared once per plan: the non-empty windows as items sorted by
//! decreasing size (stable in window index) and the histogram of their sizes, with prefix counts
//! and sums that every bound and packer reads in O(1). Also `packing`, the groups a packer forms.
//! Part of planner.hpp; no planning happens here.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "../config.hpp"
#include "../status.hpp"
#include "options.hpp"

namespace greenmim {
namespace detail {

//! A packing of items (positions into `size_histogram::items`) into groups, in CSR form.
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

//! One non-empty window: its index in the caller's sizes and its size.
struct item {
  index_t window;
  index_t size;
  item() {}  // no zeroing: the counting sort writes every slot it keeps
  item(index_t w, index_t s) : window(w), size(s) {}
};

//! The sizes of one plan's windows. After `build`: `items` in decreasing-size order, stable in
//! window index (the items of size w occupy [n - cnt_le(w), n - cnt_le(w-1))); `distinct` the
//! distinct sizes, increasing; `total` = S = sum of sizes; `maxw` = largest size. Keeps its
//! memory between plans.
class size_histogram {
 public:
  std::vector<item> items;
  std::vector<index_t> distinct;
  std::int64_t total = 0;
  index_t maxw = 0;

  //! Forgets the previous input (called before validation, so a failed plan leaves no stale sizes).
  void reset() {
    items.clear();
    have_input_order_ = false;
    total = 0;
    maxw = 0;
  }

  std::int64_t n_items() const { return static_cast<std::int64_t>(items.size()); }
  //! Number of items of size <= x, and their total size.
  std::int64_t cnt_le(std::int64_t x) const { return x < 0 ? 0 : cnt_le_[static_cast<size_t>(std::min<std::int64_t>(x, maxw))]; }
  std::int64_t sum_le(std::int64_t x) const { return x < 0 ? 0 : sum_le_[static_cast<size_t>(std::min<std::int64_t>(x, maxw))]; }
  //! Number of items of size exactly v.
  std::int64_t count(std::int64_t v) const { return cnt_le(v) - cnt_le(v - 1); }

  //! Validates the sizes, builds the size histogram (cnt_le, sum_le, distinct, total, maxw)
  //! and the items in decreasing-size order, stable in window index (the order the DP on
  //! decreasing sizes and BFD use), by a counting sort: sizes are small integers, so O(n + max w).
  //! The input is cut into four contiguous parts walked in lockstep, each with its own counters,
  //! so runs of equal sizes do not serialize on one counter (store-to-load forwarding).
  //! Errors: invalid_argument (a negative size), overflow (w > 2^20 or sum > 2^28), empty_input
  //! (every size 0).
  status build(const index_t* s, std::int64_t n_all) {
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
    distinct.clear();
    cnt_le_[0] = 0;  // zero-size windows are not items
    sum_le_[0] = 0;
    for (size_t v = 1; v < w1; ++v) {
      const std::int64_t c = std::int64_t{h[v]} + h[cap + v] + h[2 * cap + v] + h[3 * cap + v];
      if (c) distinct.push_back(static_cast<index_t>(v));
      sum_le_[v] = sum_le_[v - 1] + c * static_cast<std::int64_t>(v);
      cnt_le_[v] = cnt_le_[v - 1] + c;
    }
    if (sum_le_[w1 - 1] > max_total_size) return status::overflow;
    total = sum_le_[w1 - 1];
    maxw = hi;
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
    items.resize(static_cast<size_t>(n_all));
    item* it = items.data();
    index_t *n0 = nx, *n1 = nx + w1, *n2 = nx + 2 * w1, *n3 = nx + 3 * w1;
    for (std::int64_t i = 0; i < q; ++i) {
      const index_t w0 = s[i], w1v = s[q + i], w2 = s[2 * q + i], w3 = s[3 * q + i];
      it[n0[w0]++] = item(static_cast<index_t>(i), w0);
      it[n1[w1v]++] = item(static_cast<index_t>(q + i), w1v);
      it[n2[w2]++] = item(static_cast<index_t>(2 * q + i), w2);
      it[n3[w3]++] = item(static_cast<index_t>(3 * q + i), w3);
    }
    for (std::int64_t i = 4 * q; i < n_all; ++i) it[n3[s[i]]++] = item(static_cast<index_t>(i), s[i]);
    items.resize(static_cast<size_t>(n));
    return status::success;
  }

  //! Item positions in window order (the paper's input order), built on demand.
  const std::vector<index_t>& input_order() {
    if (!have_input_order_) {
      // windows are distinct, so a counting pass over window indices orders them
      index_t top = 0;
      for (const item& it : items) top = std::max(top, it.window);
      order_tmp_.assign(static_cast<size_t>(top) + 1, -1);
      for (index_t p = 0; p < static_cast<index_t>(items.size()); ++p) order_tmp_[items[p].window] = p;
      input_order_.clear();
      for (index_t p : order_tmp_)
        if (p >= 0) input_order_.push_back(p);
      have_input_order_ = true;
    }
    return input_order_;
  }
  //! Item positions in decreasing-size order: 0, 1, ..., n-1.
  const std::vector<index_t>& size_order() {
    if (size_order_.size() != items.size()) {
      size_order_.resize(items.size());
      std::iota(size_order_.begin(), size_order_.end(), 0);
    }
    return size_order_;
  }

 private:
  //! Histogram capacity for sizes up to `hi`: the least power of two above it, at least 64.
  static size_t hist_cap_for(index_t hi) {
    size_t c = 64;
    while (c <= static_cast<size_t>(hi)) c *= 2;
    return c;
  }

  std::vector<std::int64_t> cnt_le_, sum_le_;
  std::vector<std::int32_t> hist4_;
  std::vector<index_t> next4_, input_order_, size_order_, order_tmp_;
  size_t hist_cap_ = 0;
  bool have_input_order_ = false;
};

}  // namespace detail
}  // namespace greenmim
