// Patch merging of visible tokens (merging.hpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include <greenmim/geometry.hpp>
#include <greenmim/random_masks.hpp>
#include <greenmim/merging.hpp>

using namespace greenmim;

namespace {

// Swin's PatchMerging: x0 = x[0::2, 0::2], x1 = x[1::2, 0::2], x2 = x[0::2, 1::2], x3 = x[1::2, 1::2]
// as (dh, dw), written out here rather than taken from geometry.hpp.
const index_t swin_order[4][2] = {{0, 0}, {1, 0}, {0, 1}, {1, 1}};

std::vector<index_t> unit_coords(const std::vector<std::uint8_t>& units, index_t grid) {
  std::vector<index_t> c;
  check(visible_coords(span<const std::uint8_t>(units), 7, grid, c));
  return c;
}

// Checks gather4 against coordinates: part k of output j sits at (2h + dh_k, 2w + dw_k).
void check_merge(const std::vector<index_t>& coords, const std::vector<index_t>& g4,
                 const std::vector<index_t>& next, index_t first = 0) {
  REQUIRE(g4.size() == 4 * next.size());
  std::vector<int> used(coords.size(), 0);
  for (size_t j = 0; j < next.size(); ++j) {
    const index_t h = coord_h(next[j]), w = coord_w(next[j]);
    for (int k = 0; k < 4; ++k) {
      const index_t t = g4[4 * j + k] - first;
      REQUIRE(t >= 0);
      REQUIRE(t < static_cast<index_t>(coords.size()));
      CHECK(coord_h(coords[t]) == 2 * h + swin_order[k][0]);
      CHECK(coord_w(coords[t]) == 2 * w + swin_order[k][1]);
      ++used[t];
    }
    if (j > 0) CHECK(next[j - 1] < next[j]);  // row-major (packed order = row-major order)
  }
  for (int u : used) CHECK(u == 1);  // every visible token merged exactly once
}

}  // namespace

TEST_CASE("merging follows the masks stage by stage: 56 -> 28 -> 14 -> 7") {
  for (double ratio : {0.0, 0.25, 0.5, 0.75, 0.9, 1.0})
    for (std::uint64_t seed : {1u, 2u, 3u, 4u}) {
      mask_config cfg;
      cfg.ratio = ratio;
      const auto units = random_mask(cfg, seed);
      for (index_t grid : {56, 28, 14}) {
        const auto coords = unit_coords(units, grid);
        std::vector<index_t> g4, next;
        REQUIRE(merge_indices(grid, grid, span<const index_t>(coords), g4, next) == status::success);
        CHECK(next == unit_coords(units, grid / 2));  // the next stage sees the same mask units
        check_merge(coords, g4, next);
      }
    }
}

TEST_CASE("merging accepts any token order and any 2x2-aligned keep set") {
  rng r(17);
  for (int trial = 0; trial < 20; ++trial) {
    const index_t H = 2 * (1 + static_cast<index_t>(r.below(20))), W = 2 * (1 + static_cast<index_t>(r.below(20)));
    std::vector<index_t> coords, expect_next;
    for (index_t bh = 0; bh < H / 2; ++bh)
      for (index_t bw = 0; bw < W / 2; ++bw)
        if (r.uniform() < 0.4) {
          expect_next.push_back(pack_coord(bh, bw));
          for (int k = 0; k < 4; ++k) coords.push_back(pack_coord(2 * bh + swin_order[k][0], 2 * bw + swin_order[k][1]));
        }
    for (size_t i = coords.size(); i > 1; --i) std::swap(coords[i - 1], coords[r.below(i)]);
    std::vector<index_t> g4, next;
    REQUIRE(merge_indices(H, W, span<const index_t>(coords), g4, next) == status::success);
    CHECK(next == expect_next);
    check_merge(coords, g4, next);
  }
}

TEST_CASE("merge_tokens concatenates in Swin's order x0, x1, x2, x3") {
  mask_config cfg;
  const auto units = random_mask(cfg, 5);
  const index_t grid = 28, B = 2, C = 3;
  const auto coords = unit_coords(units, grid);
  std::vector<index_t> g4, next;
  REQUIRE(merge_indices(grid, grid, span<const index_t>(coords), g4, next) == status::success);
  const index_t N = static_cast<index_t>(coords.size()), M = static_cast<index_t>(next.size());
  // x[b, t, c] encodes (b, h, w, c) of the token
  std::vector<double> x(static_cast<size_t>(B) * N * C), y(static_cast<size_t>(B) * M * 4 * C, -1);
  auto code = [](index_t b, index_t h, index_t w, index_t c) { return ((b * 100.0 + h) * 100.0 + w) * 10.0 + c; };
  for (index_t b = 0; b < B; ++b)
    for (index_t t = 0; t < N; ++t)
      for (index_t c = 0; c < C; ++c)
        x[(static_cast<size_t>(b) * N + t) * C + c] = code(b, coord_h(coords[t]), coord_w(coords[t]), c);
  REQUIRE(merge_tokens<double>(span<const index_t>(g4), make_view(x.data(), B, N, C),
                               make_view(y.data(), B, M, 4 * C)) == status::success);
  for (index_t b = 0; b < B; ++b)
    for (index_t j = 0; j < M; ++j)
      for (int k = 0; k < 4; ++k)
        for (index_t c = 0; c < C; ++c)
          CHECK(y[(static_cast<size_t>(b) * M + j) * 4 * C + k * C + c] ==
                code(b, 2 * coord_h(next[j]) + swin_order[k][0], 2 * coord_w(next[j]) + swin_order[k][1], c));

  const auto y0 = y;
  std::vector<index_t> bad = g4;
  bad[5] = N;
  CHECK(merge_tokens<double>(span<const index_t>(bad), make_view(x.data(), B, N, C),
                             make_view(y.data(), B, M, 4 * C)) == status::out_of_range);
  bad[5] = -1;
  CHECK(merge_tokens<double>(span<const index_t>(bad), make_view(x.data(), B, N, C),
                             make_view(y.data(), B, M, 4 * C)) == status::out_of_range);
  CHECK(merge_tokens<double>(span<const index_t>(g4.data(), static_cast<std::int64_t>(g4.size()) - 1),
                             make_view(x.data(), B, N, C), make_view(y.data(), B, M, 4 * C)) ==
        status::shape_mismatch);
  CHECK(merge_tokens<double>(span<const index_t>(g4), make_view(x.data(), B, N, C),
                             make_view(y.data(), B, M, 2 * C)) == status::shape_mismatch);
  CHECK(merge_tokens<double>(span<const index_t>(g4), make_view(x.data(), B, N, C),
                             make_view(y.data(), B - 1, M, 4 * C)) == status::shape_mismatch);
  CHECK(merge_tokens<double>(span<const index_t>(g4), make_view(x.data(), B, N, C),
                             make_view(x.data() + 1, B, M, 4 * C)) == status::invalid_argument);
  CHECK(y == y0);
}

TEST_CASE("per-sample merging: each sample its own mask, flat token axis") {
  rng r(3);
  const index_t grid = 56, B = 4;
  std::vector<index_t> cu{0}, coords;
  std::vector<std::vector<std::uint8_t>> masks;
  for (index_t b = 0; b < B; ++b) {
    mask_config cfg;
    cfg.ratio = b == 2 ? 1.0 : 0.75;  // an empty sample in the middle
    masks.push_back(random_mask(cfg, 9, static_cast<std::uint64_t>(b)));
    const auto c = unit_coords(masks.back(), grid);
    coords.insert(coords.end(), c.begin(), c.end());
    cu.push_back(static_cast<index_t>(coords.size()));
  }
  std::vector<index_t> g4, ncu, next;
  REQUIRE(merge_indices_per_sample(grid, grid, span<const index_t>(cu), span<const index_t>(coords), g4, ncu, next) ==
          status::success);
  REQUIRE(ncu.size() == static_cast<size_t>(B) + 1);
  CHECK(ncu[0] == 0);
  CHECK(ncu[B] == static_cast<index_t>(next.size()));
  for (index_t b = 0; b < B; ++b) {
    const std::vector<index_t> nb(next.begin() + ncu[b], next.begin() + ncu[b + 1]);
    CHECK(nb == unit_coords(masks[b], grid / 2));
    const std::vector<index_t> cb(coords.begin() + cu[b], coords.begin() + cu[b + 1]);
    const std::vector<index_t> gb(g4.begin() + 4 * ncu[b], g4.begin() + 4 * ncu[b + 1]);
    check_merge(cb, gb, nb, cu[b]);  // indices point into sample b's range of the flat axis
  }
  // a partial block in sample 3 only is refused, outputs untouched
  std::vector<index_t> broken = coords;
  broken.erase(broken.begin() + cu[3]);
  std::vector<index_t> cu2 = cu;
  --cu2[B];
  const auto g40 = g4, ncu0 = ncu, next0 = next;
  CHECK(merge_indices_per_sample(grid, grid, span<const index_t>(cu2), span<const index_t>(broken), g4, ncu, next) ==
        status::misaligned);
  CHECK(merge_indices_per_sample(grid, grid, span<const index_t>(cu), span<const index_t>(broken), g4, ncu, next) ==
        status::shape_mismatch);
  CHECK(merge_indices_per_sample(grid, grid, span<const index_t>(std::vector<index_t>{0, 5, 3, cu2[B]}),
                                 span<const index_t>(broken), g4, ncu, next) == status::shape_mismatch);
  CHECK(g4 == g40);
  CHECK(ncu == ncu0);
  CHECK(next == next0);
}

TEST_CASE("merging refuses partly visible blocks, odd grids, bad coordinates; outputs untouched") {
  mask_config cfg;
  const auto units = random_mask(cfg, 11);
  const index_t grid = 28;
  const auto coords = unit_coords(units, grid);
  REQUIRE(coords.size() > 4);
  const std::vector<index_t> g40{42}, next0{43};
  auto expect = [&](index_t h, index_t w, const std::vector<index_t>& c, status s) {
    std::vector<index_t> g4 = g40, next = next0;
    CHECK(merge_indices(h, w, span<const index_t>(c), g4, next) == s);
    CHECK(g4 == g40);
    CHECK(next == next0);
  };
  rng r(1);
  for (int trial = 0; trial < 10; ++trial) {  // drop 1..3 tokens of one block: always misaligned
    std::vector<index_t> c = coords;
    const size_t i = r.below(c.size());
    const index_t bh = coord_h(c[i]) / 2, bw = coord_w(c[i]) / 2;
    const int drop = 1 + static_cast<int>(r.below(3));
    int dropped = 0;
    c.erase(std::remove_if(c.begin(), c.end(),
                           [&](index_t v) {
                             return coord_h(v) / 2 == bh && coord_w(v) / 2 == bw && dropped < drop && ++dropped;
                           }),
            c.end());
    REQUIRE(dropped == drop);
    expect(grid, grid, c, status::misaligned);
  }
  {  // one extra token in an otherwise masked block
    std::vector<index_t> c = coords;
    index_t h = 0, w = 0;
    while (std::find(c.begin(), c.end(), pack_coord(h, w)) != c.end()) { w += 2; if (w >= grid) { w = 0; h += 2; } }
    c.push_back(pack_coord(h + 1, w));
    expect(grid, grid, c, status::misaligned);
  }
  {  // token-level random keep set (DynamicViT style) cannot merge
    std::vector<index_t> c;
    for (index_t h = 0; h < grid; ++h)
      for (index_t w = 0; w < grid; ++w)
        if ((h * 7 + w * 3) % 5 == 0) c.push_back(pack_coord(h, w));
    expect(grid, grid, c, status::misaligned);
  }
  expect(7, 7, {}, status::invalid_argument);          // stage 4 grid: nothing to merge
  expect(28, 27, coords, status::invalid_argument);    // odd width
  expect(0, 28, {}, status::invalid_argument);
  expect(grid, grid, {pack_coord(0, 0), pack_coord(grid, 0)}, status::out_of_range);
  expect(grid, grid, {pack_coord(0, grid)}, status::out_of_range);
  expect(grid, grid, {-5}, status::out_of_range);
  {
    std::vector<index_t> c = coords;
    c.push_back(c[3]);
    expect(grid, grid, c, status::invalid_argument);  // duplicate coordinate
  }
  // the unmodified set still merges
  std::vector<index_t> g4, next;
  CHECK(merge_indices(grid, grid, span<const index_t>(coords), g4, next) == status::success);
  check_merge(coords, g4, next);
}
