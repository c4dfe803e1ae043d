//! \file planner/pack_best_fit.hpp
//! Packer 2, best-fit decreasing on the size histogram: identical items go, as many as fit, into
//! the fullest group that still takes one. `best_fit_decreasing` forms the groups; `bfd_count`
//! only counts them (large inputs count during the sweep and form the winner's groups once).
//! Part of planner.hpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../config.hpp"
#include "histogram.hpp"

namespace greenmim {
namespace detail {

//! Scratch of the best-fit packers, kept between calls.
struct best_fit_scratch {
  std::vector<index_t> bucket_head, bin_next, bin_items, bin_fill, item_next;
  std::vector<std::int64_t> bins_at_fill;  // bfd_count: number of bins at each fill level

  void push_item(index_t b, index_t it) {
    item_next[it] = bin_items[b];
    bin_items[b] = it;
  }
  void move_bin(index_t b, index_t fill) {
    bin_fill[b] = fill;
    bin_next[b] = bucket_head[fill];
    bucket_head[fill] = b;
  }
};

//! Best-fit decreasing into groups of capacity g >= maxw; bins are kept in buckets by fill
//! level. O(n + d*g) for d distinct sizes.
inline void best_fit_decreasing(const size_histogram& h, index_t g, best_fit_scratch& bf, packing& out) {
  out.clear();
  bf.bucket_head.assign(static_cast<size_t>(g) + 1, -1);  // per fill level: a linked stack of bins
  bf.bin_next.clear();
  bf.bin_items.clear();  // per bin: linked list of items through item_next
  bf.bin_fill.clear();
  bf.item_next.assign(h.items.size(), -1);
  size_t pos = 0;
  const size_t n = h.items.size();
  while (pos < n) {
    const index_t w = h.items[pos].size;
    size_t end = pos;
    while (end < n && h.items[end].size == w) ++end;
    for (std::int64_t f = g - w; f >= 1 && pos < end; --f) {
      while (bf.bucket_head[f] >= 0 && pos < end) {
        const index_t b = bf.bucket_head[f];
        bf.bucket_head[f] = bf.bin_next[b];
        std::int64_t fill = f;
        while (fill + w <= g && pos < end) bf.push_item(b, static_cast<index_t>(pos++)), fill += w;
        bf.move_bin(b, static_cast<index_t>(fill));
      }
    }
    while (pos < end) {  // open new bins
      const index_t b = static_cast<index_t>(bf.bin_fill.size());
      bf.bin_fill.push_back(0);
      bf.bin_next.push_back(-1);
      bf.bin_items.push_back(-1);
      std::int64_t fill = 0;
      while (fill + w <= g && pos < end) bf.push_item(b, static_cast<index_t>(pos++)), fill += w;
      bf.move_bin(b, static_cast<index_t>(fill));
    }
  }
  for (size_t b = 0; b < bf.bin_fill.size(); ++b) {
    for (index_t it = bf.bin_items[b]; it >= 0; it = bf.item_next[it]) out.members.push_back(it);
    out.close_group(bf.bin_fill[b]);
  }
}

//! Group count of `best_fit_decreasing` without forming the groups: bins are counted per fill
//! level. O(d * g).
inline index_t bfd_count(const size_histogram& h, index_t g, best_fit_scratch& bf) {
  std::vector<std::int64_t>& bc = bf.bins_at_fill;
  bc.assign(static_cast<size_t>(g) + 1, 0);
  std::int64_t bins = 0;
  for (size_t j = h.distinct.size(); j-- > 0;) {  // decreasing sizes
    const index_t w = h.distinct[j];
    std::int64_t c = h.cnt_le(w) - h.cnt_le(w - 1);
    for (std::int64_t f = g - w; f >= 1 && c > 0; --f) {
      if (!bc[f]) continue;
      const std::int64_t q = (g - f) / w;  // copies a bin at fill f takes
      const std::int64_t full = std::min<std::int64_t>(bc[f], c / q);
      bc[f] -= full;
      bc[f + q * w] += full;
      c -= full * q;
      if (c > 0 && c < q && bc[f] > 0) {  // the last, partly filled bin
        --bc[f];
        ++bc[f + c * w];
        c = 0;
      }
    }
    if (c > 0) {  // new bins
      const std::int64_t q = g / w;
      const std::int64_t full = c / q;
      bc[q * w] += full;
      bins += full;
      c -= full * q;
      if (c > 0) {
        ++bc[c * w];
        ++bins;
      }
    }
  }
  return static_cast<index_t>(bins);
}

}  // namespace detail
}  // namespace greenmim
