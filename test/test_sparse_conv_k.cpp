// Submanifold neighbour tables for ConvNeXt's stencils (sparse_conv.hpp, k = 5 and 7): per-sample
// layouts against brute force, the interior fast path against the bounds-tested border path, the
// transposed table, and ConvNeXt V2's stage grids under 32-px mask units.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include <greenmim/random_masks.hpp>
#include <greenmim/sparse_conv.hpp>

#include "sparse_conv_test_util.hpp"

using namespace greenmim;

namespace {

//! Every row of one sample's tokens [first, + coords.size()) equals brute force.
void check_rows_k(const neighbor_table& t, const std::vector<index_t>& coords, index_t H, index_t W, index_t k,
                  index_t first) {
  REQUIRE(t.kernel == k);
  for (size_t i = 0; i < coords.size(); ++i)
    for (index_t o = 0; o < k * k; ++o) {
      const index_t h = coord_h(coords[i]) + stencil_dh(k, o), w = coord_w(coords[i]) + stencil_dw(k, o);
      const index_t want = (h < 0 || h >= H || w < 0 || w >= W) ? pad_index : gm_sc_test::find_token(coords, first, h, w);
      INFO("token " << first + static_cast<index_t>(i) << " offset " << o);
      REQUIRE(t.at(first + static_cast<index_t>(i), o) == want);
    }
}

}  // namespace

TEST_CASE("neighbour table k = 5, 7, per sample: each sample as if alone, borders, empty samples, grids smaller than k") {
  std::mt19937 g(41);
  for (int rep = 0; rep < 16; ++rep)
    for (index_t k : {5, 7}) {
      // grids from 1 x 1 (every tap but the centre outside) to 13 x 11 (interior rows exist)
      const index_t H = 1 + (rep * 5) % 13, W = 1 + (rep * 3) % 11;
      std::vector<std::vector<index_t>> samples;
      std::vector<index_t> cu{0}, flat;
      for (int b = 0; b < 4; ++b) {
        samples.push_back(gm_sc_test::random_coords(g, H, W, b == 1 ? 0.0 : 0.25 * b + 0.2));
        std::shuffle(samples.back().begin(), samples.back().end(), g);  // any order within a sample
        flat.insert(flat.end(), samples.back().begin(), samples.back().end());
        cu.push_back(static_cast<index_t>(flat.size()));
      }
      neighbor_table t;
      REQUIRE(build_neighbor_table_per_sample(H, W, k, span<const index_t>(cu), span<const index_t>(flat), t) ==
              status::success);
      CHECK(t.num_tokens == static_cast<index_t>(flat.size()));
      CHECK(t.nbr.size() == flat.size() * static_cast<size_t>(k * k));
      for (int b = 0; b < 4; ++b) {
        INFO("rep " << rep << " k " << k << " grid " << H << "x" << W << " sample " << b);
        check_rows_k(t, samples[b], H, W, k, cu[b]);
        // the same sample alone (shared-mask builder) gives the same rows shifted by cu[b]
        neighbor_table alone;
        REQUIRE(build_neighbor_table(H, W, k, span<const index_t>(samples[b]), alone) == status::success);
        for (index_t i = 0; i < alone.num_tokens; ++i)
          for (index_t o = 0; o < k * k; ++o) {
            const index_t a = alone.at(i, o);
            REQUIRE(t.at(cu[b] + i, o) == (a == pad_index ? pad_index : a + cu[b]));
          }
      }
    }
}

TEST_CASE("neighbour table k = 7: the full grid's rows, interior and border, equal the stencil's arithmetic") {
  // every site visible, row-major: the neighbour at (h + dh, w + dw) is token (h + dh) * W + w + dw
  for (index_t k : {5, 7}) {
    const index_t H = 10, W = 9;
    std::vector<index_t> all;
    for (index_t h = 0; h < H; ++h)
      for (index_t w = 0; w < W; ++w) all.push_back(pack_coord(h, w));
    neighbor_table t;
    REQUIRE(build_neighbor_table(H, W, k, span<const index_t>(all), t) == status::success);
    for (index_t h = 0; h < H; ++h)
      for (index_t w = 0; w < W; ++w)
        for (index_t o = 0; o < k * k; ++o) {
          const index_t hh = h + stencil_dh(k, o), ww = w + stencil_dw(k, o);
          const bool in = hh >= 0 && hh < H && ww >= 0 && ww < W;
          REQUIRE(t.at(h * W + w, o) == (in ? hh * W + ww : pad_index));
        }
    CHECK(t.at(0, k * k / 2) == 0);  // the centre tap is the token itself
  }
}

TEST_CASE("transposed table k = 5, 7 (per sample) = the table at mirrored offsets") {
  std::mt19937 g(43);
  for (int rep = 0; rep < 8; ++rep)
    for (index_t k : {5, 7}) {
      std::vector<index_t> cu{0}, flat;
      for (int b = 0; b < 3; ++b) {
        const auto c = gm_sc_test::random_coords(g, 9, 8, 0.5);
        flat.insert(flat.end(), c.begin(), c.end());
        cu.push_back(static_cast<index_t>(flat.size()));
      }
      neighbor_table t, tt;
      REQUIRE(build_neighbor_table_per_sample(9, 8, k, span<const index_t>(cu), span<const index_t>(flat), t) ==
              status::success);
      REQUIRE(transpose_neighbor_table(t, tt) == status::success);
      for (index_t s = 0; s < t.num_tokens; ++s)
        for (index_t o = 0; o < k * k; ++o) REQUIRE(tt.at(s, o) == t.at(s, mirror_offset(k, o)));
    }
}

TEST_CASE("ConvNeXt V2 stage grids under 32-px mask units: 7 x 7 tables stay within each sample's visible units") {
  // 224 px, FCMAE's 60% of the 7 x 7 units masked; stage s has a (56 >> s) grid, a unit is
  // (8 >> s) tokens a side
  std::mt19937 g(47);
  mask_config cfg;
  cfg.ratio = 0.6;
  for (index_t stage = 0; stage < 4; ++stage) {
    const index_t grid = 56 >> stage;
    std::vector<index_t> cu{0}, flat;
    std::vector<std::vector<index_t>> samples;
    for (int b = 0; b < 2; ++b) {
      std::vector<index_t> c;
      check(visible_coords(span<const std::uint8_t>(random_mask(cfg, 100 + b, 0)), cfg.grid(), grid, c));
      samples.push_back(c);
      flat.insert(flat.end(), c.begin(), c.end());
      cu.push_back(static_cast<index_t>(flat.size()));
    }
    neighbor_table t;
    REQUIRE(build_neighbor_table_per_sample(grid, grid, 7, span<const index_t>(cu), span<const index_t>(flat), t) ==
            status::success);
    for (int b = 0; b < 2; ++b) {
      INFO("stage " << stage << " sample " << b);
      CHECK(samples[b].size() == static_cast<size_t>((grid / 7) * (grid / 7) * cfg.num_keep()));  // 19 visible units
      if (stage >= 2) check_rows_k(t, samples[b], grid, grid, 7, cu[b]);  // brute force is O(N^2): small stages
      for (index_t i = cu[b]; i < cu[b + 1]; ++i)
        for (index_t o = 0; o < 49; ++o)
          if (t.at(i, o) != pad_index) REQUIRE((t.at(i, o) >= cu[b] && t.at(i, o) < cu[b + 1]));
    }
  }
}

TEST_CASE("neighbour table refuses even k and k beyond 15, untouched output") {
  const std::vector<index_t> ok{pack_coord(1, 1)}, cu{0, 1};
  neighbor_table t;
  t.num_tokens = 5;
  for (index_t k : {2, 6, 8, 17, -7}) {
    INFO("k " << k);
    CHECK(build_neighbor_table(8, 8, k, span<const index_t>(ok), t) == status::invalid_argument);
    CHECK(build_neighbor_table_per_sample(8, 8, k, span<const index_t>(cu), span<const index_t>(ok), t) ==
          status::invalid_argument);
  }
  CHECK(t.num_tokens == 5);
  REQUIRE(build_neighbor_table(8, 8, 15, span<const index_t>(ok), t) == status::success);  // the largest
  CHECK(t.nbr.size() == 225);
}
