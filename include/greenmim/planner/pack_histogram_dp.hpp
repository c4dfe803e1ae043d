//! \file planner/pack_histogram_dp.hpp
//! Packer 3, the subset-sum DP on the size histogram ("DP on decreasing sizes" for thousands of
//! windows): each group is the largest fill <= G reachable with the sizes still left, and each
//! pattern found is applied as many times as the counts allow. `histogram_dp` only records the
//! patterns (and counts the groups); `materialize` forms the groups from them.
//! Part of planner.hpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "knapsack.hpp"
#include "histogram.hpp"

namespace greenmim {
namespace detail {

//! Calls shift(t * v) for the binary split t = 1, 2, 4, ..., remainder of 0..t_max copies of
//! size v: or-ing a reachable set with itself shifted by each makes every count 0..t_max reachable.
template <class Shift>
void binary_split(std::int64_t t_max, std::int64_t v, Shift shift) {
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

//! Scratch of `histogram_dp` and `materialize`, kept between calls.
struct histogram_dp_scratch {
  std::vector<index_t> cnt, next, active;
  std::vector<std::uint64_t> reach;
};

//! Subset-sum DP on the size histogram into groups of capacity g >= maxw: each group is the
//! largest fill <= g reachable with the remaining counts, reconstructed preferring larger sizes,
//! and each pattern found is applied as many times as the counts allow. Reachable fills are
//! bitsets (one word for g < 64); a size with count c is added by log2(c) shift-ors (binary
//! splitting of 0..c copies). O(phases * d * log(g) * g / 64). Returns the number of groups; the
//! patterns go to `res` (`materialize` turns them into groups).
inline index_t histogram_dp(const size_histogram& h, index_t g, histogram_dp_scratch& hs, hd_patterns& res) {
  using word = std::uint64_t;
  res.clear();
  const std::vector<index_t>& distinct = h.distinct;
  const size_t m = distinct.size();
  const size_t W = static_cast<size_t>(g) / 64 + 1;
  const word top_mask = (g % 64 == 63) ? ~word{0} : ((word{1} << (g % 64 + 1)) - 1);
  // active size ranks (count > 0), largest size first; rank j = 0 is the largest size
  hs.cnt.resize(m);
  hs.active.resize(m);
  std::int64_t left = 0;
  for (size_t j = 0; j < m; ++j) {
    const index_t v = distinct[m - 1 - j];
    hs.cnt[j] = static_cast<index_t>(h.cnt_le(v) - h.cnt_le(v - 1));
    hs.active[j] = static_cast<index_t>(j);
    left += hs.cnt[j];
  }
  size_t act = m;
  hs.reach.resize((m + 1) * W);
  auto test = [](const word* r, std::int64_t x) { return (r[x >> 6] >> (x & 63)) & 1u; };
  while (left > 0) {
    // row a + 1 = fills reachable with the first a + 1 active sizes (row 0 = {0})
    word* r0 = hs.reach.data();
    if (W == 1) {  // g < 64: one word per row
      word r = 1;
      r0[0] = r;
      for (size_t a = 0; a < act; ++a) {
        const index_t j = hs.active[a];
        const std::int64_t v = distinct[m - 1 - static_cast<size_t>(j)];
        binary_split(std::min<std::int64_t>(hs.cnt[j], g / v), v, [&](std::int64_t sh) { r |= r << sh; });
        r0[a + 1] = r;
      }
    } else {
      std::fill(r0, r0 + W, word{0});
      r0[0] = 1;
      for (size_t a = 0; a < act; ++a) {
        const index_t j = hs.active[a];
        const std::int64_t v = distinct[m - 1 - static_cast<size_t>(j)];
        word* cur = r0 + (a + 1) * W;
        std::copy(r0 + a * W, r0 + (a + 1) * W, cur);
        binary_split(std::min<std::int64_t>(hs.cnt[j], g / v), v, [&](std::int64_t sh) {
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
      if (x) fill = static_cast<std::int64_t>(i) * 64 + 63 - clz64(x);
    }
    // reconstruct, smallest size first (take the fewest copies possible), so larger sizes fill
    std::int64_t rest = fill;
    std::int64_t reps = std::numeric_limits<std::int64_t>::max();
    const index_t begin = static_cast<index_t>(res.takes.size());
    for (size_t a = act; a-- > 0;) {
      const index_t j = hs.active[a];
      const std::int64_t v = distinct[m - 1 - static_cast<size_t>(j)];
      index_t t = 0;
      while (!test(r0 + a * W, rest - static_cast<std::int64_t>(t) * v)) ++t;
      if (t) {
        res.takes.emplace_back(j, t);
        rest -= static_cast<std::int64_t>(t) * v;
        reps = std::min<std::int64_t>(reps, hs.cnt[j] / t);
      }
    }
    bool emptied = false;
    for (size_t q = begin; q < res.takes.size(); ++q) {
      const index_t j = res.takes[q].first;
      hs.cnt[j] -= static_cast<index_t>(reps * res.takes[q].second);
      left -= reps * res.takes[q].second;
      emptied |= hs.cnt[j] == 0;
    }
    if (emptied) {  // drop exhausted sizes, keeping the order
      size_t k = 0;
      for (size_t a = 0; a < act; ++a)
        if (hs.cnt[hs.active[a]] > 0) hs.active[k++] = hs.active[a];
      act = k;
    }
    res.pats.push_back({static_cast<index_t>(fill), static_cast<index_t>(reps), begin,
                        static_cast<index_t>(res.takes.size())});
    res.groups += static_cast<index_t>(reps);
  }
  return res.groups;
}

//! The groups of `res` (from `histogram_dp` on the items of `h`), into `out`: item positions,
//! or window indices (the caller's numbering) when `Windows`.
template <bool Windows>
void materialize(const size_histogram& h, const hd_patterns& res, histogram_dp_scratch& hs, packing& out) {
  const std::vector<index_t>& distinct = h.distinct;
  const size_t m = distinct.size();
  const std::int64_t n = h.n_items();
  hs.next.resize(m);
  for (size_t j = 0; j < m; ++j) hs.next[j] = static_cast<index_t>(n - h.cnt_le(distinct[m - 1 - j]));
  out.members.resize(static_cast<size_t>(n));
  out.fills.resize(static_cast<size_t>(res.groups));
  out.offsets.resize(static_cast<size_t>(res.groups) + 1);
  index_t* mem = out.members.data();
  index_t* nxt = hs.next.data();
  const item* items = h.items.data();
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

}  // namespace detail
}  // namespace greenmim
