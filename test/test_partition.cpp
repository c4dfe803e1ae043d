// Properties of the window lists and partition indices (partition.hpp) on random masks, random
// plans and random per-sample keep sets.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <greenmim/geometry.hpp>
#include <greenmim/attention_mask.hpp>
#include <greenmim/random_masks.hpp>
#include <greenmim/merging.hpp>
#include <greenmim/models.hpp>
#include <greenmim/partition.hpp>
#include <greenmim/planner.hpp>
#include <greenmim/plan.hpp>
#include <greenmim/windows.hpp>

#include "random_plan.hpp"

using namespace greenmim;

namespace {

// One window per group, G = max size (the classic per-window layout).
plan per_window_plan(const std::vector<index_t>& sizes) {
  plan p;
  p.clear();
  index_t G = 0;
  for (index_t i = 0; i < static_cast<index_t>(sizes.size()); ++i)
    if (sizes[i] > 0) {
      p.windows.push_back(i);
      p.group_offsets.push_back(static_cast<index_t>(p.windows.size()));
      p.fills.push_back(sizes[i]);
      G = std::max(G, sizes[i]);
    }
  p.group_size = std::max<index_t>(G, 1);
  return p;
}

std::vector<index_t> mask_coords(double ratio, std::uint64_t seed, index_t grid, std::uint64_t stream = 0) {
  mask_config cfg;
  cfg.ratio = ratio;
  const auto m = random_mask(cfg, seed, stream);
  std::vector<index_t> c;
  check(visible_coords(span<const std::uint8_t>(m), cfg.grid(), grid, c));
  return c;
}

// Each token of a `grid x grid` map kept with probability q (not mask-unit aligned).
std::vector<index_t> keep_set_coords(rng& r, index_t grid, double q) {
  std::vector<index_t> c;
  for (index_t h = 0; h < grid; ++h)
    for (index_t w = 0; w < grid; ++w)
      if (r.uniform() < q) c.push_back(pack_coord(h, w));
  return c;
}

// Checks everything a valid window list promises, from first principles.
void check_window_list(const window_list& l, const std::vector<index_t>& cu_seqlens) {
  const window_geometry& g = l.geometry;
  const index_t wps = g.num_windows();
  REQUIRE(l.num_windows() == l.num_samples * wps);
  REQUIRE(static_cast<index_t>(l.coords.size()) == l.num_tokens);
  std::vector<int> count(static_cast<size_t>(l.num_tokens), 0);
  for (index_t i = 0; i < l.num_windows(); ++i) {
    const index_t b = i / wps;
    const auto win = l.window(i);
    for (std::int64_t k = 0; k < win.size(); ++k) {
      const index_t t = win[k];
      REQUIRE(t >= cu_seqlens[b]);
      REQUIRE(t < cu_seqlens[b + 1]);
      if (k > 0) CHECK(win[k - 1] < t);
      CHECK(g.window_id(coord_h(l.coords[t]), coord_w(l.coords[t])) == i % wps);
      ++count[t];
    }
  }
  for (int c : count) CHECK(c == 1);
}

// Checks the partition layout against the plan and the list, from first principles.
void check_partition(const partition_indices& pi, const plan& p, const window_list& l) {
  const index_t G = p.group_size;
  REQUIRE(pi.group_size == G);
  REQUIRE(pi.num_groups == p.num_groups());
  REQUIRE(pi.num_tokens == l.num_tokens);
  REQUIRE(pi.gather.size() == static_cast<size_t>(pi.num_slots()));
  REQUIRE(pi.slot_window.size() == static_cast<size_t>(pi.num_slots()));
  REQUIRE(pi.slot_coord.size() == static_cast<size_t>(pi.num_slots()));
  REQUIRE(pi.scatter.size() == static_cast<size_t>(l.num_tokens));
  for (index_t g = 0; g < p.num_groups(); ++g) {
    index_t s = g * G;
    for (index_t w : p.group(g))
      for (index_t t : l.window(w)) {  // real slots: plan order, tokens ascending
        CHECK(pi.gather[s] == t);
        CHECK(pi.slot_window[s] == w);
        CHECK(pi.slot_coord[s] == l.coords[t]);
        ++s;
      }
    CHECK(s - g * G == p.fills[g]);
    for (; s < (g + 1) * G; ++s) {  // padding: exactly the trailing slots
      CHECK(pi.gather[s] == pad_index);
      CHECK(pi.slot_window[s] == pad_index);
      CHECK(pi.slot_coord[s] == 0);
    }
  }
  // inverse permutations on real tokens
  for (index_t t = 0; t < l.num_tokens; ++t) {
    REQUIRE(pi.scatter[t] >= 0);
    REQUIRE(pi.scatter[t] < pi.num_slots());
    CHECK(pi.gather[pi.scatter[t]] == t);
  }
  for (index_t s = 0; s < pi.num_slots(); ++s)
    if (pi.gather[s] != pad_index) CHECK(pi.scatter[pi.gather[s]] == s);
  CHECK(validate_partition(pi) == status::success);
}

// partition -> poison padding -> unpartition must give back x bit-exactly; padding rows hold the
// pad value. `B` samples share the indices (batch stride).
void check_round_trip(const partition_indices& pi, rng& r, index_t B, index_t C) {
  const index_t N = pi.num_tokens, S = pi.num_slots();
  std::vector<float> x(static_cast<size_t>(B) * N * C), y(static_cast<size_t>(B) * S * C, 7.f),
      back(x.size(), -1.f);
  for (auto& v : x) v = static_cast<float>(r.uniform() * 2 - 1);
  const float pad = std::numeric_limits<float>::quiet_NaN();
  REQUIRE(partition_tokens<float>(pi, make_view(x.data(), B, N, C), make_view(y.data(), B, S, C), pad) ==
          status::success);
  for (index_t b = 0; b < B; ++b)
    for (index_t s = 0; s < S; ++s)
      for (index_t c = 0; c < C; ++c) {
        const float v = y[(static_cast<size_t>(b) * S + s) * C + c];
        if (pi.gather[s] == pad_index)
          CHECK(std::isnan(v));
        else
          CHECK(std::memcmp(&v, &x[(static_cast<size_t>(b) * N + pi.gather[s]) * C + c], sizeof v) == 0);
      }
  for (index_t b = 0; b < B; ++b)  // whatever attention writes on padding must not leak back
    for (index_t s = 0; s < S; ++s)
      if (pi.gather[s] == pad_index)
        for (index_t c = 0; c < C; ++c) y[(static_cast<size_t>(b) * S + s) * C + c] = 1e30f;
  REQUIRE(unpartition_tokens<float>(pi, make_view(y.data(), B, S, C), make_view(back.data(), B, N, C)) ==
          status::success);
  CHECK(x == back);  // bit-exact: no NaN in x, and == on floats compares the values exactly
  if (!x.empty()) CHECK(std::memcmp(x.data(), back.data(), x.size() * sizeof(float)) == 0);
}

bool same(const partition_indices& a, const partition_indices& b) {
  return a.group_size == b.group_size && a.num_groups == b.num_groups && a.num_tokens == b.num_tokens &&
         a.gather == b.gather && a.scatter == b.scatter && a.slot_window == b.slot_window &&
         a.slot_coord == b.slot_coord;
}
bool same(const window_list& a, const window_list& b) {
  return a.num_tokens == b.num_tokens && a.num_samples == b.num_samples && a.offsets == b.offsets &&
         a.tokens == b.tokens && a.coords == b.coords && a.geometry.height == b.geometry.height &&
         a.geometry.width == b.geometry.width && a.geometry.window == b.geometry.window &&
         a.geometry.shift == b.geometry.shift;
}

const double ratios[] = {0.0, 0.25, 0.5, 0.75, 0.9, 1.0};
const index_t grids[] = {56, 28, 14, 7};

}  // namespace

TEST_CASE("build_windows: window i is geometry window i, tokens ascending, sizes match window_sizes") {
  int cases = 0;
  for (index_t p : {7, 14})
    for (index_t grid : grids)
      for (bool shifted : {false, true})
        for (double ratio : ratios)
          for (std::uint64_t seed : {1u, 2u, 3u}) {
            const window_geometry g = make_window_geometry(grid, grid, p, shifted ? p / 2 : 0);
            const auto coords = mask_coords(ratio, seed * 977 + p, grid);
            window_list l;
            REQUIRE(build_windows(g, span<const index_t>(coords), l) == status::success);
            CHECK(l.num_samples == 1);
            CHECK(l.num_tokens == static_cast<index_t>(coords.size()));
            CHECK(l.sizes() == window_sizes(g, span<const index_t>(coords)));
            check_window_list(l, {0, static_cast<index_t>(coords.size())});
            CHECK(validate_window_list(l) == status::success);
            ++cases;
          }
  CHECK(cases == 2 * 4 * 2 * 6 * 3);
}

TEST_CASE("shifted windows are non-cyclic: border windows are smaller") {
  const window_geometry g = make_window_geometry(56, 56, 7, 3);
  std::vector<index_t> all;
  for (index_t h = 0; h < 56; ++h)
    for (index_t w = 0; w < 56; ++w) all.push_back(pack_coord(h, w));
  window_list l;
  REQUIRE(build_windows(g, span<const index_t>(all), l) == status::success);
  REQUIRE(l.num_windows() == 9 * 9);
  // offset (7 - 3) % 7 = 4: window rows/cols are [0,3), [3,10), ..., [45,52), [52,56)
  CHECK(l.size(0) == 3 * 3);       // top-left
  CHECK(l.size(1) == 3 * 7);       // top edge
  CHECK(l.size(8) == 3 * 4);       // top-right
  CHECK(l.size(9 + 1) == 7 * 7);   // interior
  CHECK(l.size(80) == 4 * 4);      // bottom-right
  index_t total = 0;
  for (index_t i = 0; i < l.num_windows(); ++i) total += l.size(i);
  CHECK(total == 56 * 56);
}

TEST_CASE("random plans: layout, inverse permutations, round trip bit-exact (shared mask)") {
  rng r(42);
  for (index_t p : {7, 14})
    for (index_t grid : grids)
      for (bool shifted : {false, true})
        for (double ratio : ratios)
          for (std::uint64_t seed : {11u, 12u}) {
            const window_geometry g = make_window_geometry(grid, grid, p, shifted ? p / 2 : 0);
            const auto coords = mask_coords(ratio, seed + 31 * grid, grid);
            window_list l;
            REQUIRE(build_windows(g, span<const index_t>(coords), l) == status::success);
            const auto sizes = l.sizes();
            for (int rep = 0; rep < 2; ++rep) {
              const plan pl = rep == 0 ? test::random_plan(sizes, r) : per_window_plan(sizes);
              REQUIRE(validate_plan(span<const index_t>(sizes), pl) == status::success);
              partition_indices pi;
              REQUIRE(build_partition(pl, l, pi) == status::success);
              check_partition(pi, pl, l);
              check_round_trip(pi, r, 2, 3);
            }
          }
}

TEST_CASE("round trip through strided (non-contiguous) views") {
  rng r(5);
  const window_geometry g = make_window_geometry(28, 28, 7, 3);
  const auto coords = mask_coords(0.75, 99, 28);
  window_list l;
  REQUIRE(build_windows(g, span<const index_t>(coords), l) == status::success);
  const plan pl = test::random_plan(l.sizes(), r);
  partition_indices pi;
  REQUIRE(build_partition(pl, l, pi) == status::success);
  const index_t B = 3, C = 5, N = pi.num_tokens, S = pi.num_slots();
  // x stored token-major [N, B, C], y stored [S, B, C]; viewed as [B, N, C] / [B, S, C].
  std::vector<double> xs(static_cast<size_t>(N) * B * C), ys(static_cast<size_t>(S) * B * C), bs(xs.size());
  for (auto& v : xs) v = r.uniform();
  auto strided = [&](double* d, index_t n) {
    tensor_view<double, 3> v;
    v.data = d;
    v.extent[0] = B; v.extent[1] = n; v.extent[2] = C;
    v.stride[0] = C; v.stride[1] = static_cast<std::int64_t>(B) * C; v.stride[2] = 1;
    return v;
  };
  REQUIRE(partition_tokens<double>(pi, strided(xs.data(), N), strided(ys.data(), S), -3.0) == status::success);
  REQUIRE(unpartition_tokens<double>(pi, strided(ys.data(), S), strided(bs.data(), N)) == status::success);
  CHECK(std::memcmp(xs.data(), bs.data(), xs.size() * sizeof(double)) == 0);
}

TEST_CASE("per-sample flat layout: random masks and arbitrary keep sets") {
  rng r(2024);
  for (index_t p : {7, 14})
    for (index_t grid : grids)
      for (bool shifted : {false, true})
        for (int trial = 0; trial < 4; ++trial) {
          const window_geometry g = make_window_geometry(grid, grid, p, shifted ? p / 2 : 0);
          const index_t B = 1 + static_cast<index_t>(r.below(4));
          std::vector<index_t> cu{0}, coords;
          for (index_t b = 0; b < B; ++b) {
            std::vector<index_t> c;
            if (trial % 2 == 0)
              c = mask_coords(ratios[r.below(6)], 1000 + trial, grid, static_cast<std::uint64_t>(b));
            else
              c = keep_set_coords(r, grid, r.uniform());
            if (b % 2 == 1) std::reverse(c.begin(), c.end());  // any token order is fine
            coords.insert(coords.end(), c.begin(), c.end());
            cu.push_back(static_cast<index_t>(coords.size()));
          }
          window_list l;
          REQUIRE(build_windows_per_sample(g, span<const index_t>(cu), span<const index_t>(coords), l) ==
                  status::success);
          CHECK(l.num_samples == B);
          check_window_list(l, cu);
          // per sample, the window sizes are those of the sample's own mask
          for (index_t b = 0; b < B; ++b) {
            const auto sb = window_sizes(
                g, span<const index_t>(coords.data() + cu[b], cu[b + 1] - cu[b]));
            for (index_t i = 0; i < g.num_windows(); ++i) CHECK(l.size(b * g.num_windows() + i) == sb[i]);
          }
          const plan pl = test::random_plan(l.sizes(), r);
          partition_indices pi;
          REQUIRE(build_partition(pl, l, pi) == status::success);
          check_partition(pi, pl, l);
          check_round_trip(pi, r, 1, 4);
        }
}

TEST_CASE("keep_mask_coords feeds build_windows_per_sample") {
  rng r(8);
  const index_t B = 3, H = 14, W = 14;
  std::vector<std::uint8_t> keep(static_cast<size_t>(B) * H * W);
  for (auto& k : keep) k = r.uniform() < 0.3;
  std::vector<index_t> cu, coords;
  REQUIRE(keep_mask_coords(span<const std::uint8_t>(keep), B, H, W, cu, coords) == status::success);
  REQUIRE(cu.size() == static_cast<size_t>(B) + 1);
  CHECK(cu[0] == 0);
  for (index_t b = 0; b < B; ++b) {
    std::vector<index_t> expect;
    for (index_t h = 0; h < H; ++h)
      for (index_t w = 0; w < W; ++w)
        if (keep[(static_cast<size_t>(b) * H + h) * W + w]) expect.push_back(pack_coord(h, w));
    CHECK(std::vector<index_t>(coords.begin() + cu[b], coords.begin() + cu[b + 1]) == expect);
  }
  std::vector<index_t> cu2{9}, c2{9};
  CHECK(keep_mask_coords(span<const std::uint8_t>(keep), B, H, W + 1, cu2, c2) == status::shape_mismatch);
  CHECK(keep_mask_coords(span<const std::uint8_t>(keep), B, 0, W, cu2, c2) == status::invalid_argument);
  CHECK(cu2 == std::vector<index_t>{9});
  CHECK(c2 == std::vector<index_t>{9});
}

TEST_CASE("masking mode: one group, original token order, window id per token") {
  CHECK(use_masking_mode(98, 7));
  CHECK_FALSE(use_masking_mode(99, 7));
  for (index_t grid : grids)
    for (bool shifted : {false, true})
      for (double ratio : ratios) {
        const window_geometry g = make_window_geometry(grid, grid, 7, shifted ? 3 : 0);
        const auto coords = mask_coords(ratio, 77, grid);
        window_list l;
        REQUIRE(build_windows(g, span<const index_t>(coords), l) == status::success);
        for (index_t extra : {0, 5}) {
          const index_t G = extra == 0 ? 0 : l.num_tokens + extra;
          partition_indices pi;
          REQUIRE(build_single_group(l, pi, G) == status::success);
          const index_t N = l.num_tokens;
          CHECK(pi.group_size == (G == 0 ? N : G));
          CHECK(pi.num_groups == (pi.group_size > 0 ? 1 : 0));
          for (index_t t = 0; t < N; ++t) {
            CHECK(pi.gather[t] == t);
            CHECK(pi.scatter[t] == t);
            CHECK(pi.slot_coord[t] == coords[t]);
            CHECK(pi.slot_window[t] == g.window_id(coord_h(coords[t]), coord_w(coords[t])));
          }
          for (index_t s = N; s < pi.num_slots(); ++s) {
            CHECK(pi.gather[s] == pad_index);
            CHECK(pi.slot_window[s] == pad_index);
          }
          CHECK(validate_partition(pi) == status::success);
          if (N > 0) {
            rng r(3);
            check_round_trip(pi, r, 2, 2);
          }
        }
        partition_indices before;
        before.group_size = 99;
        partition_indices pi = before;
        if (l.num_tokens > 1) {
          CHECK(build_single_group(l, pi, l.num_tokens - 1) == status::size_exceeds_group);
          CHECK(same(pi, before));
        }
        CHECK(build_single_group(l, pi, -1) == status::invalid_argument);
        CHECK(same(pi, before));
      }
}

TEST_CASE("build_windows refuses bad input and leaves the output untouched") {
  const window_geometry g = make_window_geometry(14, 14, 7, 3);
  window_list before;
  REQUIRE(build_windows(g, span<const index_t>(std::vector<index_t>{pack_coord(1, 1)}), before) ==
          status::success);
  auto expect = [&](std::vector<index_t> coords, status s, window_geometry geo) {
    window_list l = before;
    CHECK(build_windows(geo, span<const index_t>(coords), l) == s);
    CHECK(same(l, before));
  };
  expect({pack_coord(0, 0), pack_coord(14, 0)}, status::out_of_range, g);
  expect({pack_coord(0, 14)}, status::out_of_range, g);
  expect({-1}, status::out_of_range, g);
  expect({pack_coord(3, 3), pack_coord(5, 5), pack_coord(3, 3)}, status::invalid_argument, g);  // duplicate
  expect({pack_coord(0, 0)}, status::invalid_argument, window_geometry{14, 14, 0, 0});
  expect({pack_coord(0, 0)}, status::invalid_argument, window_geometry{14, 14, 7, 7});
  expect({pack_coord(0, 0)}, status::invalid_argument, window_geometry{0, 14, 7, 0});

  // per-sample: malformed cu_seqlens
  const std::vector<index_t> coords{pack_coord(0, 0), pack_coord(1, 1), pack_coord(0, 0)};
  auto expect_cu = [&](std::vector<index_t> cu, status s) {
    window_list l = before;
    CHECK(build_windows_per_sample(g, span<const index_t>(cu), span<const index_t>(coords), l) == s);
    CHECK(same(l, before));
  };
  expect_cu({}, status::shape_mismatch);
  expect_cu({1, 3}, status::shape_mismatch);
  expect_cu({0, 2}, status::shape_mismatch);
  expect_cu({0, 3, 2, 3}, status::shape_mismatch);
  expect_cu({0, 3}, status::invalid_argument);  // (0,0) twice in one sample
  window_list ok = before;
  CHECK(build_windows_per_sample(g, span<const index_t>(std::vector<index_t>{0, 2, 3}),
                                 span<const index_t>(coords), ok) == status::success);  // same coord, two samples
  CHECK(ok.num_samples == 2);
}

TEST_CASE("build_partition refuses bad plans and bad lists, output untouched") {
  rng r(9);
  const window_geometry g = make_window_geometry(28, 28, 7, 0);
  const auto coords = mask_coords(0.9, 4, 28);  // 4 units: some windows empty
  window_list l;
  REQUIRE(build_windows(g, span<const index_t>(coords), l) == status::success);
  const auto sizes = l.sizes();
  const plan good = per_window_plan(sizes);
  REQUIRE(good.num_groups() >= 3);
  partition_indices before;
  REQUIRE(build_partition(good, l, before) == status::success);

  auto expect = [&](const plan& pl, const window_list& wl, status s) {
    partition_indices pi = before;
    CHECK(build_partition(pl, wl, pi) == s);
    CHECK(same(pi, before));
  };
  {  // plan misses a window
    plan p = good;
    p.windows.pop_back(); p.group_offsets.pop_back(); p.fills.pop_back();
    expect(p, l, status::not_covered);
  }
  {  // duplicate window (in a second group)
    plan p = good;
    p.windows.push_back(p.windows[0]);
    p.group_offsets.push_back(static_cast<index_t>(p.windows.size()));
    p.fills.push_back(p.fills[0]);
    expect(p, l, status::not_covered);
  }
  {  // window larger than G
    plan p = good;
    p.group_size = *std::max_element(sizes.begin(), sizes.end()) - 1;
    expect(p, l, status::size_exceeds_group);
  }
  {  // window index out of range
    plan p = good;
    p.windows[0] = l.num_windows();
    expect(p, l, status::out_of_range);
  }
  {  // empty window in a group
    plan p = good;
    index_t empty = -1;
    for (index_t i = 0; i < l.num_windows(); ++i)
      if (sizes[i] == 0) empty = i;
    REQUIRE(empty >= 0);
    p.windows.push_back(empty);
    p.group_offsets.back() += 1;
    expect(p, l, status::not_covered);
  }
  {  // wrong fill
    plan p = good;
    p.fills[0] += 1;
    expect(p, l, status::not_covered);
  }
  {  // plan made for another mask
    const auto other = mask_coords(0.9, 5, 28);
    window_list l2;
    REQUIRE(build_windows(g, span<const index_t>(other), l2) == status::success);
    REQUIRE(l2.sizes() != sizes);
    expect(good, l2, status::not_covered);
  }
  // corrupted lists
  auto corrupt = [&](auto edit, status s) {
    window_list wl = l;
    edit(wl);
    expect(good, wl, s);
    CHECK(validate_window_list(wl) == s);
  };
  index_t w0 = 0;
  while (l.size(w0) < 2) ++w0;
  const index_t at = l.offsets[w0];
  corrupt([&](window_list& wl) { wl.tokens[at + 1] = wl.tokens[at]; }, status::not_covered);  // token twice
  corrupt([&](window_list& wl) { wl.tokens[at] = wl.num_tokens; }, status::out_of_range);
  corrupt([&](window_list& wl) { wl.tokens[at] = -1; }, status::out_of_range);
  corrupt([&](window_list& wl) { std::swap(wl.tokens[at], wl.tokens[at + 1]); }, status::invalid_argument);
  corrupt([&](window_list& wl) { wl.coords[wl.tokens[at]] = pack_coord(28, 0); }, status::out_of_range);
  corrupt([&](window_list& wl) { wl.coords[wl.tokens[at]] = pack_coord(0, 30); }, status::out_of_range);
  corrupt([&](window_list& wl) {  // coordinate of another window
    const index_t c = wl.coords[wl.tokens[at]];
    wl.coords[wl.tokens[at]] = pack_coord((coord_h(c) + 7) % 28, coord_w(c));
  }, status::out_of_range);
  corrupt([&](window_list& wl) {  // two tokens of one window at one coordinate
    wl.coords[wl.tokens[at + 1]] = wl.coords[wl.tokens[at]];
  }, status::invalid_argument);
  corrupt([&](window_list& wl) { wl.coords.pop_back(); }, status::shape_mismatch);
  corrupt([&](window_list& wl) { wl.offsets.pop_back(); }, status::shape_mismatch);
  corrupt([&](window_list& wl) { wl.offsets[1] = wl.offsets[2] + 1; }, status::shape_mismatch);
  corrupt([&](window_list& wl) {  // a token in no window: drop it (sizes change, so fix nothing else)
    wl.tokens.erase(wl.tokens.begin() + at);
    for (size_t i = static_cast<size_t>(w0) + 1; i < wl.offsets.size(); ++i) --wl.offsets[i];
  }, status::not_covered);
  corrupt([&](window_list& wl) { wl.geometry.window = 0; }, status::invalid_argument);
}

TEST_CASE("build_partition accepts the empty mask (no group) and refuses overflow") {
  const window_geometry g = make_window_geometry(56, 56, 7, 0);
  window_list l;
  REQUIRE(build_windows(g, span<const index_t>(), l) == status::success);
  plan p;
  p.clear();
  partition_indices pi;
  CHECK(build_partition(p, l, pi) == status::success);
  CHECK(pi.num_groups == 0);
  CHECK(pi.num_tokens == 0);
  CHECK(pi.gather.empty());

  const std::vector<index_t> one{pack_coord(0, 0)};
  REQUIRE(build_windows(g, span<const index_t>(one), l) == status::success);
  REQUIRE(build_partition(per_window_plan(l.sizes()), l, pi) == status::success);
  const partition_indices before = pi;
  plan big;  // three groups (two of them empty) of G = 2^30: n_g * G overflows int32
  big.clear();
  big.group_size = std::numeric_limits<index_t>::max() / 2 + 1;
  big.windows = {0};
  big.group_offsets = {0, 1, 1, 1};
  big.fills = {1, 0, 0};
  CHECK(build_partition(big, l, pi) == status::overflow);
  CHECK(same(pi, before));
}

TEST_CASE("partition_tokens / unpartition_tokens refuse bad shapes and bad indices, output untouched") {
  rng r(13);
  const window_geometry g = make_window_geometry(14, 14, 7, 3);
  const auto coords = mask_coords(0.5, 21, 14);
  window_list l;
  REQUIRE(build_windows(g, span<const index_t>(coords), l) == status::success);
  const plan pl = test::random_plan(l.sizes(), r);
  partition_indices pi;
  REQUIRE(build_partition(pl, l, pi) == status::success);
  REQUIRE(pi.num_slots() > pi.num_tokens);  // random slack is drawn; make sure there is padding
  const index_t B = 2, C = 3, N = pi.num_tokens, S = pi.num_slots();
  std::vector<float> x(static_cast<size_t>(B) * N * C + 64, 1.f), y(static_cast<size_t>(B) * S * C + 64, 2.f);
  const std::vector<float> x0 = x, y0 = y;

  auto fwd = [&](const partition_indices& q, index_t b1, index_t n, index_t c1, index_t b2, index_t s, index_t c2) {
    return partition_tokens<float>(q, make_view(x.data(), b1, n, c1), make_view(y.data(), b2, s, c2), 0.f);
  };
  auto bwd = [&](const partition_indices& q, index_t b1, index_t n, index_t c1, index_t b2, index_t s, index_t c2) {
    return unpartition_tokens<float>(q, make_view(y.data(), b2, s, c2), make_view(x.data(), b1, n, c1));
  };
  const index_t bad[][6] = {{B, N + 1, C, B, S, C}, {B, N, C, B, S - 1, C}, {B, N, C, B + 1, S, C},
                            {B, N, C, B, S, C + 1}};
  for (const auto& e : bad) {
    CHECK(fwd(pi, e[0], e[1], e[2], e[3], e[4], e[5]) == status::shape_mismatch);
    CHECK(bwd(pi, e[0], e[1], e[2], e[3], e[4], e[5]) == status::shape_mismatch);
  }
  auto corrupt = [&](auto edit, status s) {
    partition_indices q = pi;
    edit(q);
    CHECK(fwd(q, B, N, C, B, S, C) == s);
    CHECK(bwd(q, B, N, C, B, S, C) == s);
    CHECK(validate_partition(q) == s);
  };
  index_t pad_slot = 0;
  while (pi.gather[pad_slot] != pad_index) ++pad_slot;
  corrupt([&](partition_indices& q) { q.gather[q.scatter[0]] = N; }, status::out_of_range);
  corrupt([&](partition_indices& q) { q.gather[q.scatter[0]] = -2; }, status::out_of_range);
  corrupt([&](partition_indices& q) { q.scatter[0] = S; }, status::out_of_range);
  corrupt([&](partition_indices& q) { q.scatter[0] = -1; }, status::out_of_range);
  corrupt([&](partition_indices& q) { q.scatter[0] = pad_slot; }, status::not_covered);  // reads padding
  corrupt([&](partition_indices& q) { q.gather[pad_slot] = 0; }, status::not_covered);    // token twice
  corrupt([&](partition_indices& q) { q.slot_window[pad_slot] = 0; }, status::not_covered);
  corrupt([&](partition_indices& q) { q.gather.pop_back(); }, status::shape_mismatch);
  corrupt([&](partition_indices& q) { q.scatter.push_back(0); }, status::shape_mismatch);
  corrupt([&](partition_indices& q) { q.group_size = -1; }, status::invalid_argument);
  // overlapping input and output
  CHECK(partition_tokens<float>(pi, make_view(x.data(), B, N, C), make_view(x.data() + 1, B, S, C)) ==
        status::invalid_argument);
  CHECK(x == x0);
  CHECK(y == y0);
}

// The small example drawn in docs/indices.md: 4x4 grid, window 2, 8 visible tokens, G = 5.
TEST_CASE("docs/indices.md drawn example") {
  const window_geometry g{4, 4, 2, 0};
  const std::vector<index_t> coords{pack_coord(0, 0), pack_coord(0, 1), pack_coord(0, 3), pack_coord(1, 0),
                                    pack_coord(2, 2), pack_coord(2, 3), pack_coord(3, 2), pack_coord(3, 3)};
  window_list l;
  REQUIRE(build_windows(g, span<const index_t>(coords), l) == status::success);
  CHECK(l.offsets == std::vector<index_t>{0, 3, 4, 4, 8});
  CHECK(l.tokens == std::vector<index_t>{0, 1, 3, 2, 4, 5, 6, 7});
  plan p;
  p.clear();
  p.group_size = 5;
  p.windows = {3, 0, 1};
  p.group_offsets = {0, 1, 3};
  p.fills = {4, 4};
  partition_indices pi;
  REQUIRE(build_partition(p, l, pi) == status::success);
  CHECK(pi.gather == std::vector<index_t>{4, 5, 6, 7, -1, 0, 1, 3, 2, -1});
  CHECK(pi.scatter == std::vector<index_t>{5, 6, 8, 7, 0, 1, 2, 3});
  CHECK(pi.slot_window == std::vector<index_t>{3, 3, 3, 3, -1, 0, 0, 0, 1, -1});
  CHECK(pi.slot_coord == std::vector<index_t>{pack_coord(2, 2), pack_coord(2, 3), pack_coord(3, 2),
                                              pack_coord(3, 3), 0, pack_coord(0, 0), pack_coord(0, 1),
                                              pack_coord(1, 0), pack_coord(0, 3), 0});
  window_list ls;  // shifted by 1: rows/cols [0,1), [1,3), [3,4)
  REQUIRE(build_windows(window_geometry{4, 4, 2, 1}, span<const index_t>(coords), ls) == status::success);
  CHECK(ls.sizes() == std::vector<index_t>{1, 1, 1, 1, 1, 1, 0, 1, 1});
}

// The per-block flow of a trainer, as shown in docs/indices.md.
TEST_CASE("docs/indices.md trainer flow: partition -> attention -> unpartition per block") {
  // example-begin trainer
  const model_shape& m = *find_model("swin-b");
  mask_config cfg;                                   // 224 px, 32 px unit, ratio 0.75
  const auto units = random_mask(cfg, /*seed=*/1, /*stream=rank*/ 0);
  const index_t B = 2;
  for (int stage = 0; stage < 2; ++stage) {
    std::vector<index_t> coords;                     // visible tokens of this stage, row-major
    check(visible_coords(span<const std::uint8_t>(units), cfg.grid(), m.grid(stage), coords));
    const index_t N = static_cast<index_t>(coords.size()), C = m.channels[stage];
    std::vector<float> x(static_cast<size_t>(B) * N * C, 0.5f);  // [B, N, C] features
    for (int block = 0; block < m.depths[stage]; ++block) {
      const window_geometry g = m.geometry(stage, /*shifted=*/block % 2 == 1);
      window_list windows;
      check(build_windows(g, span<const index_t>(coords), windows));
      const std::vector<index_t> sizes = windows.sizes();
      plan pl;
      check(make_plan(span<const index_t>(sizes), planner_options{}, C, pl));
      partition_indices pi;
      check(build_partition(pl, windows, pi));       // or build_single_group when use_masking_mode
      const index_t S = pi.num_slots(), G = pi.group_size;
      std::vector<float> y(static_cast<size_t>(B) * S * C);
      check(partition_tokens<float>(pi, make_view(x.data(), B, N, C), make_view(y.data(), B, S, C)));
      std::vector<float> mask(static_cast<size_t>(pi.num_groups) * G * G);
      check(build_attention_mask<float>(pi, make_view(mask.data(), pi.num_groups, G, G)));  // -100 across
      // ... attention over each group of y: softmax(q k^T * scale + bias + mask) v, written into y ...
      check(unpartition_tokens<float>(pi, make_view(y.data(), B, S, C), make_view(x.data(), B, N, C)));
    }
    CHECK(x == std::vector<float>(x.size(), 0.5f));  // (test) no attention ran: identity
    std::vector<index_t> gather4, next;              // patch merging to the next stage
    check(merge_indices(m.grid(stage), m.grid(stage), span<const index_t>(coords), gather4, next));
    CHECK(gather4.size() == coords.size());          // (test) every token merged once
  }
  // example-end trainer
}
