//! \file planner/pack_exact.hpp
//! Packer 4, exact: `fits_in` (a depth-first search "do k groups suffice?", with a step budget)
//! and `exact_packing` (a DP over the multiset of sizes that always finds the minimum, for small
//! multisets). `fast` uses both for <= 16 windows, and `fits_in` for a bounded search for one
//! group fewer for <= 256 windows. Part of planner.hpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "../config.hpp"
#include "histogram.hpp"

namespace greenmim {
namespace detail {

//! Scratch of the exact packers, kept between calls.
struct exact_scratch {
  std::vector<index_t> radix, cnt, digit, next, seq;  // exact_packing
  std::vector<index_t> bins, fill, choice;            // exact_packing: per multiset state
  std::vector<index_t> dfs_fill, dfs_bin;             // fits_in
};

//! Number of multiset states of `exact_packing`: prod over sizes of (count + 1) (to decide
//! whether it is affordable).
inline std::int64_t exact_states(const size_histogram& h) {
  std::int64_t states = 1;
  for (index_t v : h.distinct) states *= (h.cnt_le(v) - h.cnt_le(v - 1)) + 1;
  return states;
}

//! Exact minimum number of bins of capacity g >= maxw by a DP over the multiset of sizes
//! (lexicographically least (bins, last fill) over all insertion orders), into `out`.
//! O(states * d) with states = exact_states(h) <= 2^n.
inline void exact_packing(const size_histogram& h, index_t g, exact_scratch& ex, packing& out) {
  out.clear();
  const std::vector<index_t>& distinct = h.distinct;
  const size_t m = distinct.size();
  ex.radix.resize(m);
  ex.cnt.resize(m);
  std::int64_t states = 1;
  for (size_t j = 0; j < m; ++j) {
    ex.radix[j] = static_cast<index_t>(states);
    ex.cnt[j] = static_cast<index_t>(h.cnt_le(distinct[j]) - h.cnt_le(distinct[j] - 1));
    states *= ex.cnt[j] + 1;
  }
  ex.bins.assign(static_cast<size_t>(states), 0);
  ex.fill.assign(static_cast<size_t>(states), 0);
  ex.choice.assign(static_cast<size_t>(states), 0);
  ex.digit.assign(m, 0);
  ex.bins[0] = 1;
  for (std::int64_t s = 1; s < states; ++s) {
    for (size_t j = 0; j < m; ++j) {  // odometer increment of the mixed-radix digits
      if (++ex.digit[j] <= ex.cnt[j]) break;
      ex.digit[j] = 0;
    }
    index_t bb = std::numeric_limits<index_t>::max(), bf = 0, bc = 0;
    for (size_t j = 0; j < m; ++j) {
      if (!ex.digit[j]) continue;
      const std::int64_t p = s - ex.radix[j];
      const index_t w = distinct[j];
      index_t b = ex.bins[p], f = ex.fill[p];
      if (f + w <= g) f += w; else { ++b; f = w; }
      if (b < bb || (b == bb && f < bf)) { bb = b; bf = f; bc = static_cast<index_t>(j); }
    }
    ex.bins[s] = bb;
    ex.fill[s] = bf;
    ex.choice[s] = bc;
  }
  // walk back the choices, then replay them forward to form the bins
  ex.seq.clear();
  for (std::int64_t s = states - 1; s > 0; s -= ex.radix[ex.choice[s]]) ex.seq.push_back(ex.choice[s]);
  std::reverse(ex.seq.begin(), ex.seq.end());
  // items of each distinct size, in window order
  ex.next.assign(m, 0);
  // the items of size distinct[j] occupy [n - cnt_le(v), ...)
  const std::int64_t n = h.n_items();
  std::int64_t fill = 0;
  for (index_t j : ex.seq) {
    const index_t w = distinct[j];
    const index_t it = static_cast<index_t>(n - h.cnt_le(w) + ex.next[j]++);
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
//! Returns 1 (packing in `out`), 0 (proved impossible), or -1 (budget of `budget` steps, one per
//! bin examined, exhausted).
inline int fits_in(const size_histogram& h, index_t g, index_t k, exact_scratch& ex, packing& out,
                   std::int64_t budget) {
  const std::vector<item>& items = h.items;
  const size_t n = items.size();
  if (static_cast<std::int64_t>(k) * g < h.total) return 0;
  std::vector<index_t>& dfs_fill = ex.dfs_fill;
  std::vector<index_t>& dfs_bin = ex.dfs_bin;
  dfs_fill.assign(static_cast<size_t>(k), 0);
  dfs_bin.assign(n, -1);
  size_t i = 0;
  while (i < n) {
    const index_t w = items[i].size;
    // an item equal to its predecessor goes to the same or a later group (swapping two equal
    // items changes nothing)
    const index_t start = (i > 0 && items[i - 1].size == w) ? dfs_bin[i - 1] : 0;
    index_t b = dfs_bin[i] >= 0 ? dfs_bin[i] + 1 : start;
    if (dfs_bin[i] >= 0) dfs_fill[dfs_bin[i]] -= w;  // undo the previous try
    for (; b < k; ++b) {
      --budget;
      if (dfs_fill[b] + w > g) continue;
      bool seen = false;
      index_t b2 = start;
      for (; b2 < b && !seen; ++b2) seen = dfs_fill[b2] == dfs_fill[b];
      budget -= b2 - start;
      if (!seen) break;
    }
    if (--budget < 0) return -1;
    if (b < k) {
      dfs_bin[i] = b;
      dfs_fill[b] += w;
      ++i;
    } else {
      dfs_bin[i] = -1;
      if (i == 0) return 0;
      --i;
    }
  }
  out.clear();
  for (index_t b = 0; b < k; ++b) {
    if (dfs_fill[b] == 0) continue;
    for (size_t j = 0; j < n; ++j)
      if (dfs_bin[j] == b) out.members.push_back(static_cast<index_t>(j));
    out.close_group(dfs_fill[b]);
  }
  return 1;
}

}  // namespace detail
}  // namespace greenmim
