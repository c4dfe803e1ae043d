//! \file planner/pack_knapsack.hpp
//! Packer 1, the paper's GroupPartition (appendix): the subset-sum DP (knapsack.hpp) repeated on
//! the remaining items until all are placed. The `paper` strategy runs it in input order;
//! `fast` runs it in decreasing-size order and, for <= 256 windows, in input order too.
//! Part of planner.hpp.
#pragma once

#include <cstdint>
#include <vector>

#include "../config.hpp"
#include "knapsack.hpp"
#include "../view.hpp"
#include "histogram.hpp"

namespace greenmim {
namespace detail {

//! Scratch of `repeated_knapsack`, kept between calls.
struct knapsack_scratch {
  std::vector<index_t> remaining, phi, chosen, table;
  std::vector<std::uint64_t> rows;
};

//! Packs the items of `h` listed in `order` (item positions) into groups of capacity g >= maxw:
//! each group is the knapsack's choice among the items not yet placed, in `order`; each round
//! places >= 1 item because every item fits. `Table`: the literal (n+1) x (G+1) table DP
//! instead of the bitset form (same decisions). O(groups * n * g / 64) with bitsets.
template <bool Table>
void repeated_knapsack(const size_histogram& h, const std::vector<index_t>& order, index_t g, knapsack_scratch& ks,
                       packing& out) {
  out.clear();
  ks.remaining.assign(order.begin(), order.end());
  while (!ks.remaining.empty()) {
    ks.phi.resize(ks.remaining.size());
    for (size_t i = 0; i < ks.remaining.size(); ++i) ks.phi[i] = h.items[ks.remaining[i]].size;
    std::int64_t fill;
    if (Table)
      fill = knapsack_table(span<const index_t>(ks.phi), g, ks.chosen, ks.table);
    else
      fill = knapsack_bitset(span<const index_t>(ks.phi), g, ks.chosen, ks.rows);
    size_t keep = 0, c = 0;
    for (size_t i = 0; i < ks.remaining.size(); ++i) {
      if (c < ks.chosen.size() && static_cast<size_t>(ks.chosen[c]) == i) {
        out.members.push_back(ks.remaining[i]);
        ++c;
      } else {
        ks.remaining[keep++] = ks.remaining[i];
      }
    }
    ks.remaining.resize(keep);
    out.close_group(static_cast<index_t>(fill));
  }
}

}  // namespace detail
}  // namespace greenmim
