// Test helper shared by the index-builder tests: random valid plans.
#pragma once

#include <greenmim/random_masks.hpp>
#include <greenmim/plan.hpp>

#include <algorithm>
#include <vector>

namespace greenmim {
namespace test {

// A random valid plan: the non-empty windows of `sizes`, shuffled, dealt into a random number of
// groups in random order; G = largest fill + a random slack in [0, 4].
inline plan random_plan(const std::vector<index_t>& sizes, rng& r) {
  std::vector<index_t> ids;
  for (index_t i = 0; i < static_cast<index_t>(sizes.size()); ++i)
    if (sizes[i] > 0) ids.push_back(i);
  for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[r.below(i)]);
  plan p;
  p.clear();
  if (ids.empty()) { p.group_size = 1 + static_cast<index_t>(r.below(4)); return p; }
  const size_t ng = 1 + r.below(ids.size());
  std::vector<std::vector<index_t>> groups(ng);
  for (size_t i = 0; i < ids.size(); ++i) groups[i < ng ? i : r.below(ng)].push_back(ids[i]);
  index_t G = 0;
  for (auto& grp : groups) {
    index_t fill = 0;
    for (index_t w : grp) { p.windows.push_back(w); fill += sizes[w]; }
    p.group_offsets.push_back(static_cast<index_t>(p.windows.size()));
    p.fills.push_back(fill);
    G = std::max(G, fill);
  }
  p.group_size = G + static_cast<index_t>(r.below(5));
  return p;
}

}  // namespace test
}  // namespace greenmim
