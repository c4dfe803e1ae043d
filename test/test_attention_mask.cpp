// Block-diagonal masks, relative-position indices and dense biases of grouped tokens (mask.hpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <greenmim/geometry.hpp>
#include <greenmim/attention_mask.hpp>
#include <greenmim/random_masks.hpp>
#include <greenmim/partition.hpp>
#include <greenmim/plan.hpp>

#include "random_plan.hpp"

using namespace greenmim;

namespace {

std::vector<index_t> coords_m(double ratio, std::uint64_t seed, index_t grid, std::uint64_t stream = 0) {
  mask_config cfg;
  cfg.ratio = ratio;
  const auto m = random_mask(cfg, seed, stream);
  std::vector<index_t> c;
  check(visible_coords(span<const std::uint8_t>(m), cfg.grid(), grid, c));
  return c;
}

struct grouped {
  window_list list;
  partition_indices pi;
};

// Random shared-mask (per_sample = false) or per-sample (B = 3) partition.
grouped make_grouped(index_t grid, index_t p, bool shifted, double ratio, std::uint64_t seed, bool per_sample,
                     rng& r) {
  grouped out;
  const window_geometry g = make_window_geometry(grid, grid, p, shifted ? p / 2 : 0);
  if (!per_sample) {
    const auto c = coords_m(ratio, seed, grid);
    check(build_windows(g, span<const index_t>(c), out.list));
  } else {
    std::vector<index_t> cu{0}, c;
    for (std::uint64_t b = 0; b < 3; ++b) {
      const auto cb = coords_m(ratio, seed, grid, b);
      c.insert(c.end(), cb.begin(), cb.end());
      cu.push_back(static_cast<index_t>(c.size()));
    }
    check(build_windows_per_sample(g, span<const index_t>(cu), span<const index_t>(c), out.list));
  }
  check(build_partition(test::random_plan(out.list.sizes(), r), out.list, out.pi));
  return out;
}

// The window of the token in slot s, found through the list (independently of slot_window).
std::vector<index_t> window_of_token(const window_list& l) {
  std::vector<index_t> w(static_cast<size_t>(l.num_tokens), -7);
  for (index_t i = 0; i < l.num_windows(); ++i)
    for (index_t t : l.window(i)) w[t] = i;
  return w;
}

}  // namespace

TEST_CASE("dense mask is block-diagonal: 0 iff both slots real and of one window; symmetric") {
  rng r(1);
  std::int64_t groups_seen = 0, cross_pairs = 0;
  for (index_t p : {7, 14})
    for (index_t grid : {56, 28, 14, 7})
      for (bool shifted : {false, true})
        for (double ratio : {0.0, 0.5, 0.75, 0.9})
          for (bool per_sample : {false, true}) {
            const grouped gr = make_grouped(grid, p, shifted, ratio, 100 + grid + p, per_sample, r);
            std::int64_t bad = 0;
            const partition_indices& pi = gr.pi;
            const auto wot = window_of_token(gr.list);
            const index_t G = pi.group_size, ng = pi.num_groups;
            // each slot's window through the list (-1: padding), independently of slot_window
            std::vector<index_t> sw(static_cast<size_t>(ng) * G);
            for (size_t s = 0; s < sw.size(); ++s) sw[s] = pi.gather[s] >= 0 ? wot[pi.gather[s]] : -1;
            for (float masked : {released_mask_value, -std::numeric_limits<float>::infinity()}) {
              std::vector<float> m(static_cast<size_t>(ng) * G * G, 123.f);
              REQUIRE(build_attention_mask<float>(pi, make_view(m.data(), ng, G, G), masked) == status::success);
              // Every entry against its expected value, which is symmetric in (i, j): so is the mask.
              for (index_t g = 0; g < ng; ++g) {
                const index_t* row_w = sw.data() + static_cast<size_t>(g) * G;
                for (index_t i = 0; i < G; ++i) {
                  const float* row = m.data() + (static_cast<size_t>(g) * G + i) * G;
                  const index_t wi = row_w[i];
                  for (index_t j = 0; j < G; ++j) {
                    const bool same_window = wi >= 0 && row_w[j] == wi;
                    bad += row[j] != (same_window ? 0.f : masked);
                    cross_pairs += !same_window;
                  }
                }
              }
              groups_seen += ng;
            }
            CHECK(bad == 0);
          }
  CHECK(groups_seen > 100);
  CHECK(cross_pairs > 1000);  // the property was exercised on both sides
}

TEST_CASE("rel-pos index equals Swin's formula for pairs of one window, -1 elsewhere") {
  rng r(2);
  std::int64_t in_window = 0;
  for (index_t p : {7, 14})
    for (index_t grid : {56, 28, 14, 7})
      for (bool shifted : {false, true})
        for (double ratio : {0.0, 0.5, 0.75})
          for (bool per_sample : {false, true}) {
            const grouped gr = make_grouped(grid, p, shifted, ratio, 7 * grid + p, per_sample, r);
            const partition_indices& pi = gr.pi;
            const index_t pe = gr.list.geometry.window;  // effective p (7 on a 7x7 grid with p = 14)
            const index_t G = pi.group_size, ng = pi.num_groups, rows = (2 * pe - 1) * (2 * pe - 1);
            const auto wot = window_of_token(gr.list);
            std::vector<index_t> idx(static_cast<size_t>(ng) * G * G, 12345);
            std::int64_t bad = 0;
            REQUIRE(build_rel_pos_index(pi, pe, make_view(idx.data(), ng, G, G)) == status::success);
            const index_t center = (pe - 1) * (2 * pe - 1) + (pe - 1);
            for (index_t g = 0; g < ng; ++g)
              for (index_t i = 0; i < G; ++i)
                for (index_t j = 0; j < G; ++j) {
                  const index_t ti = pi.gather[g * G + i], tj = pi.gather[g * G + j];
                  const index_t v = idx[(static_cast<size_t>(g) * G + i) * G + j];
                  const index_t vt = idx[(static_cast<size_t>(g) * G + j) * G + i];
                  if (ti >= 0 && tj >= 0 && wot[ti] == wot[tj]) {
                    const index_t ci = gr.list.coords[ti], cj = gr.list.coords[tj];
                    const index_t dh = coord_h(ci) - coord_h(cj), dw = coord_w(ci) - coord_w(cj);
                    bad += v != (dh + pe - 1) * (2 * pe - 1) + (dw + pe - 1);
                    bad += v < 0 || v >= rows;
                    bad += v + vt != 2 * center;  // (i, j) and (j, i) mirror around the centre
                    bad += (i == j) != (v == center);
                    ++in_window;
                  } else {
                    bad += v != rel_pos_none;
                  }
                }
            CHECK(bad == 0);
          }
  CHECK(in_window > 10000);
}

TEST_CASE("dense bias gathers the table for pairs of one window and is 0 elsewhere") {
  rng r(3);
  for (index_t grid : {56, 28, 14})
    for (bool shifted : {false, true})
      for (bool per_sample : {false, true}) {
        const grouped gr = make_grouped(grid, 7, shifted, 0.75, 55 + grid, per_sample, r);
        const partition_indices& pi = gr.pi;
        const index_t p = 7, G = pi.group_size, ng = pi.num_groups, heads = 3, rows = 13 * 13;
        std::vector<float> table(static_cast<size_t>(rows) * heads);
        for (auto& v : table) v = static_cast<float>(r.uniform() + 0.5);  // never 0
        std::vector<index_t> idx(static_cast<size_t>(ng) * G * G);
        REQUIRE(build_rel_pos_index(pi, p, make_view(idx.data(), ng, G, G)) == status::success);
        std::vector<float> bias(static_cast<size_t>(ng) * heads * G * G, -9.f);
        std::int64_t bad = 0;
        REQUIRE(build_rel_pos_bias<float>(pi, p, make_view(static_cast<const float*>(table.data()), rows, heads),
                                          make_view(bias.data(), ng, heads, G, G)) == status::success);
        for (index_t g = 0; g < ng; ++g)
          for (index_t h = 0; h < heads; ++h)
            for (index_t i = 0; i < G; ++i)
              for (index_t j = 0; j < G; ++j) {
                const index_t k = idx[(static_cast<size_t>(g) * G + i) * G + j];
                const float v = bias[((static_cast<size_t>(g) * heads + h) * G + i) * G + j];
                bad += v != (k == rel_pos_none ? 0.f : table[static_cast<size_t>(k) * heads + h]);
                bad += (v != 0.f) != attends(pi.slot_window[g * G + i], pi.slot_window[g * G + j]);
              }
        CHECK(bad == 0);
      }
}

TEST_CASE("masking mode: one group across windows, mask and rel-pos still per window") {
  const window_geometry g = make_window_geometry(14, 14, 7, 3);
  const auto c = coords_m(0.75, 9, 14);
  window_list l;
  REQUIRE(build_windows(g, span<const index_t>(c), l) == status::success);
  partition_indices pi;
  REQUIRE(build_single_group(l, pi) == status::success);
  const index_t G = pi.group_size;
  REQUIRE(G == static_cast<index_t>(c.size()));
  std::vector<float> m(static_cast<size_t>(G) * G);
  std::vector<index_t> idx(m.size());
  REQUIRE(build_attention_mask<float>(pi, make_view(m.data(), 1, G, G)) == status::success);
  REQUIRE(build_rel_pos_index(pi, 7, make_view(idx.data(), 1, G, G)) == status::success);
  int cross = 0;
  for (index_t i = 0; i < G; ++i)
    for (index_t j = 0; j < G; ++j) {
      const bool sw = g.window_id(coord_h(c[i]), coord_w(c[i])) == g.window_id(coord_h(c[j]), coord_w(c[j]));
      CHECK(m[static_cast<size_t>(i) * G + j] == (sw ? 0.f : -100.f));
      CHECK((idx[static_cast<size_t>(i) * G + j] == rel_pos_none) == !sw);
      cross += !sw;
    }
  CHECK(cross > 0);
}

TEST_CASE("mask builders refuse bad input and leave the output untouched") {
  rng r(4);
  const grouped gr = make_grouped(28, 7, true, 0.75, 3, false, r);
  const partition_indices& pi = gr.pi;
  const index_t G = pi.group_size, ng = pi.num_groups, heads = 2, rows = 169;
  REQUIRE(ng > 0);
  std::vector<float> m(static_cast<size_t>(ng) * G * G + 16, 5.f);
  std::vector<index_t> idx(m.size(), 5);
  std::vector<float> table(static_cast<size_t>(rows) * heads + 16, 1.f);
  std::vector<float> bias(static_cast<size_t>(ng) * heads * G * G + 16, 5.f);
  const auto m0 = m;
  const auto idx0 = idx;
  const auto bias0 = bias;
  auto tab = [&](index_t nrows, index_t nheads) {
    return make_view(static_cast<const float*>(table.data()), nrows, nheads);
  };
  auto all = [&](const partition_indices& q, index_t a, index_t b, index_t c, index_t window, index_t trows,
                 index_t theads, index_t bheads) {
    m = m0;
    idx = idx0;
    bias = bias0;
    const status s1 = build_attention_mask<float>(q, make_view(m.data(), a, b, c));
    const status s2 = build_rel_pos_index(q, window, make_view(idx.data(), a, b, c));
    const status s3 = build_rel_pos_bias<float>(q, window, tab(trows, theads), make_view(bias.data(), a, bheads, b, c));
    if (s1 != status::success) CHECK(m == m0);
    if (s2 != status::success) CHECK(idx == idx0);
    if (s3 != status::success) CHECK(bias == bias0);
    return std::vector<status>{s1, s2, s3};
  };
  using V = std::vector<status>;
  const status sm = status::shape_mismatch;
  CHECK(all(pi, ng + 1, G, G, 7, rows, heads, heads) == V{sm, sm, sm});
  CHECK(all(pi, ng, G - 1, G, 7, rows, heads, heads) == V{sm, sm, sm});
  CHECK(all(pi, ng, G, G + 1, 7, rows, heads, heads) == V{sm, sm, sm});
  CHECK(all(pi, ng, G, G, 7, rows - 1, heads, heads)[2] == sm);      // table rows != (2p-1)^2
  CHECK(all(pi, ng, G, G, 7, rows, heads, heads + 1)[2] == sm);      // heads differ
  CHECK(all(pi, ng, G, G, 0, rows, heads, heads)[1] == status::invalid_argument);
  CHECK(all(pi, ng, G, G, 0, rows, heads, heads)[2] == status::invalid_argument);
  {  // corrupted partitions
    partition_indices q = pi;
    q.slot_window.pop_back();
    CHECK(all(q, ng, G, G, 7, rows, heads, heads) == V{sm, sm, sm});
    q = pi;
    q.gather[0] = q.num_tokens;
    const status oor = status::out_of_range;
    CHECK(all(q, ng, G, G, 7, rows, heads, heads) == V{oor, oor, oor});
  }
  {  // two slots of one window p or more apart: the index would leave the table
    partition_indices q = pi;
    index_t s = 0;
    while (!(q.gather[s] >= 0 && q.gather[s + 1] >= 0 && q.slot_window[s] == q.slot_window[s + 1])) ++s;
    q.slot_coord[s] = pack_coord(coord_h(q.slot_coord[s + 1]) + 7, coord_w(q.slot_coord[s + 1]));
    const V v = all(q, ng, G, G, 7, rows, heads, heads);
    CHECK(v[0] == status::success);  // the mask does not read coordinates
    CHECK(v[1] == status::out_of_range);
    CHECK(v[2] == status::out_of_range);
  }
  // table overlapping the output
  CHECK(build_rel_pos_bias<float>(pi, 7, make_view(static_cast<const float*>(bias.data()), rows, heads),
                                  make_view(bias.data(), ng, heads, G, G)) == status::invalid_argument);
  CHECK(bias == bias0);
}
