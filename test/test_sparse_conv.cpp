// Index tables for convolutions on visible tokens (sparse_conv.hpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include <greenmim/random_masks.hpp>
#include <greenmim/merging.hpp>
#include <greenmim/sparse_conv.hpp>

#include "sparse_conv_test_util.hpp"

using namespace greenmim;

namespace {

using gm_sc_test::find_token;
using gm_sc_test::random_coords;

std::vector<index_t> unit_coords(const std::vector<std::uint8_t>& units, index_t grid) {
  std::vector<index_t> c;
  check(visible_coords(span<const std::uint8_t>(units), 7, grid, c));
  return c;
}

void check_table(const neighbor_table& t, const std::vector<index_t>& coords, index_t H, index_t W, index_t k,
                 index_t first = 0) {
  for (size_t i = 0; i < coords.size(); ++i)
    for (index_t a = 0; a < k; ++a)
      for (index_t b = 0; b < k; ++b) {
        const index_t dh = a - k / 2, dw = b - k / 2;  // row-major over the stencil
        const index_t h = coord_h(coords[i]) + dh, w = coord_w(coords[i]) + dw;
        const index_t want = (h < 0 || h >= H || w < 0 || w >= W) ? pad_index : find_token(coords, first, h, w);
        REQUIRE(t.at(first + static_cast<index_t>(i), a * k + b) == want);
      }
}

}  // namespace

TEST_CASE("stencil index math") {
  for (index_t k : {1, 3, 5, 7})
    for (index_t o = 0; o < k * k; ++o) {
      CHECK(stencil_offset(k, stencil_dh(k, o), stencil_dw(k, o)) == o);
      CHECK(stencil_dh(k, mirror_offset(k, o)) == -stencil_dh(k, o));
      CHECK(stencil_dw(k, mirror_offset(k, o)) == -stencil_dw(k, o));
    }
  CHECK(stencil_offset(3, 0, 0) == 4);  // the centre tap of a 3x3
  CHECK(block_h(4, 2, 7) == 9);
  CHECK(block_w(4, 2, 7) == 11);
}

TEST_CASE("neighbour table equals brute force: random sets, borders, odd grids, k = 1, 3, 5, 7") {
  std::mt19937 g(11);
  for (int rep = 0; rep < 40; ++rep) {
    const index_t H = 1 + rep % 9, W = 1 + (rep * 7) % 11;
    for (double keep : {0.0, 0.3, 0.7, 1.0})
      for (index_t k : {1, 3, 5, 7}) {
        auto coords = random_coords(g, H, W, keep);
        std::shuffle(coords.begin(), coords.end(), g);  // any order is accepted
        neighbor_table t;
        REQUIRE(build_neighbor_table(H, W, k, span<const index_t>(coords), t) == status::success);
        CHECK(t.num_tokens == static_cast<index_t>(coords.size()));
        CHECK(t.nbr.size() == coords.size() * k * k);
        check_table(t, coords, H, W, k);
        for (index_t i = 0; i < t.num_tokens; ++i) CHECK(t.at(i, k * k / 2) == i);  // centre = itself
      }
  }
}

TEST_CASE("neighbour table: a single token, and a full grid's corners") {
  neighbor_table t;
  const std::vector<index_t> one{pack_coord(3, 4)};
  REQUIRE(build_neighbor_table(8, 8, 3, span<const index_t>(one), t) == status::success);
  for (index_t o = 0; o < 9; ++o) CHECK(t.at(0, o) == (o == 4 ? 0 : pad_index));
  std::vector<index_t> all;
  for (index_t h = 0; h < 4; ++h)
    for (index_t w = 0; w < 5; ++w) all.push_back(pack_coord(h, w));
  REQUIRE(build_neighbor_table(4, 5, 3, span<const index_t>(all), t) == status::success);
  const index_t top_left[9] = {-1, -1, -1, -1, 0, 1, -1, 5, 6};
  for (index_t o = 0; o < 9; ++o) CHECK(t.at(0, o) == top_left[o]);
  const index_t bottom_right[9] = {13, 14, -1, 18, 19, -1, -1, -1, -1};
  for (index_t o = 0; o < 9; ++o) CHECK(t.at(19, o) == bottom_right[o]);
}

TEST_CASE("transposed table = the table at mirrored offsets (the backward's dx needs no second table)") {
  std::mt19937 g(5);
  for (int rep = 0; rep < 30; ++rep)
    for (index_t k : {1, 3, 5}) {
      const auto coords = random_coords(g, 2 + rep % 13, 3 + rep % 7, 0.5);
      neighbor_table t, tt;
      REQUIRE(build_neighbor_table(2 + rep % 13, 3 + rep % 7, k, span<const index_t>(coords), t) == status::success);
      REQUIRE(transpose_neighbor_table(t, tt) == status::success);
      for (index_t s = 0; s < t.num_tokens; ++s)
        for (index_t o = 0; o < k * k; ++o) {
          CHECK(tt.at(s, o) == t.at(s, mirror_offset(k, o)));
          if (tt.at(s, o) != pad_index) CHECK(t.at(tt.at(s, o), o) == s);  // u reads s at offset o
        }
    }
  // Not a submanifold table: two outputs read token 0 at offset 0.
  neighbor_table bad;
  bad.kernel = 1;
  bad.num_tokens = 2;
  bad.nbr = {0, 0};
  neighbor_table out;
  CHECK(transpose_neighbor_table(bad, out) == status::invalid_argument);
  bad.nbr = {0, 2};
  CHECK(transpose_neighbor_table(bad, out) == status::out_of_range);
}

TEST_CASE("per-sample neighbour table: each sample as if alone, offsets by cu_seqlens, never across samples") {
  std::mt19937 g(3);
  const index_t H = 9, W = 8;
  std::vector<std::vector<index_t>> samples;
  std::vector<index_t> cu{0}, flat;
  for (int b = 0; b < 6; ++b) {
    samples.push_back(random_coords(g, H, W, b == 2 ? 0.0 : 0.2 * b));  // sample 2 empty
    flat.insert(flat.end(), samples.back().begin(), samples.back().end());
    cu.push_back(static_cast<index_t>(flat.size()));
  }
  neighbor_table t;
  REQUIRE(build_neighbor_table_per_sample(H, W, 3, span<const index_t>(cu), span<const index_t>(flat), t) ==
          status::success);
  for (int b = 0; b < 6; ++b) {
    check_table(t, samples[b], H, W, 3, cu[b]);
    for (index_t i = cu[b]; i < cu[b + 1]; ++i)
      for (index_t o = 0; o < 9; ++o)
        if (t.at(i, o) != pad_index) CHECK((t.at(i, o) >= cu[b] && t.at(i, o) < cu[b + 1]));
  }
}

TEST_CASE("neighbour table refuses bad input and leaves the output untouched") {
  neighbor_table t;
  t.num_tokens = 77;
  const std::vector<index_t> dup{pack_coord(1, 1), pack_coord(1, 1)};
  const std::vector<index_t> oob{pack_coord(1, 1), pack_coord(8, 0)};
  const std::vector<index_t> ok{pack_coord(1, 1)};
  CHECK(build_neighbor_table(8, 8, 3, span<const index_t>(dup), t) == status::invalid_argument);
  CHECK(build_neighbor_table(8, 8, 3, span<const index_t>(oob), t) == status::out_of_range);
  CHECK(build_neighbor_table(8, 8, 4, span<const index_t>(ok), t) == status::invalid_argument);
  CHECK(build_neighbor_table(8, 8, 0, span<const index_t>(ok), t) == status::invalid_argument);
  CHECK(build_neighbor_table(0, 8, 3, span<const index_t>(ok), t) == status::invalid_argument);
  const std::vector<index_t> neg{-5};
  CHECK(build_neighbor_table(8, 8, 3, span<const index_t>(neg), t) == status::out_of_range);
  const std::vector<index_t> cu_bad{0, 2}, cu_dec{0, 1, 0, 1};
  CHECK(build_neighbor_table_per_sample(8, 8, 3, span<const index_t>(cu_bad), span<const index_t>(ok), t) ==
        status::shape_mismatch);
  CHECK(build_neighbor_table_per_sample(8, 8, 3, span<const index_t>(cu_dec), span<const index_t>(ok), t) ==
        status::shape_mismatch);
  // a duplicate inside the second sample only: the scratch grid was restored after the first
  const std::vector<index_t> two{pack_coord(1, 1), pack_coord(1, 1), pack_coord(1, 1)}, cu2{0, 1, 3};
  CHECK(build_neighbor_table_per_sample(8, 8, 3, span<const index_t>(cu2), span<const index_t>(two), t) ==
        status::invalid_argument);
  CHECK(t.num_tokens == 77);
  // The same position in different samples is fine.
  const std::vector<index_t> cu3{0, 1, 2};
  REQUIRE(build_neighbor_table_per_sample(8, 8, 3, span<const index_t>(cu3), span<const index_t>(two).subspan(0, 2),
                                          t) == status::success);
  CHECK(t.at(1, 4) == 1);
  CHECK(t.at(1, 3) == pad_index);
}

TEST_CASE("block table: Twins-L sizes (GSA sr 8/4/2, patch embed 2) on mask-unit masks") {
  const index_t grids[3] = {56, 28, 14}, sr[3] = {8, 4, 2};
  for (double ratio : {0.0, 0.5, 0.75, 0.9, 1.0})
    for (std::uint64_t seed : {1u, 2u, 3u}) {
      mask_config cfg;
      cfg.ratio = ratio;
      const auto units = random_mask(cfg, seed);
      for (int st = 0; st < 3; ++st)
        for (index_t s : {sr[st], index_t(2)}) {
          const auto coords = unit_coords(units, grids[st]);
          block_table b;
          REQUIRE(build_block_table(grids[st], grids[st], s, span<const index_t>(coords), b) == status::success);
          REQUIRE(b.gather.size() == static_cast<size_t>(b.num_outputs()) * s * s);
          CHECK(b.gather.size() == coords.size());  // aligned: every visible token in one block
          CHECK(b.next_cu_seqlens == std::vector<index_t>{0, b.num_outputs()});
          std::vector<int> used(coords.size(), 0);
          for (index_t n = 0; n < b.num_outputs(); ++n) {
            if (n > 0) CHECK(b.next_coords[n - 1] < b.next_coords[n]);  // row-major
            const index_t bh = coord_h(b.next_coords[n]), bw = coord_w(b.next_coords[n]);
            for (index_t i = 0; i < s; ++i)
              for (index_t j = 0; j < s; ++j) {
                const index_t t = b.gather[static_cast<size_t>(n) * s * s + i * s + j];  // row-major in block
                CHECK(coord_h(coords[t]) == s * bh + i);
                CHECK(coord_w(coords[t]) == s * bw + j);
                ++used[t];
              }
          }
          for (int u : used) CHECK(u == 1);
          if (s == sr[st]) CHECK(b.num_outputs() == static_cast<index_t>(cfg.num_keep()));  // one key per unit
          // s = 2 is patch merging with another column order: same blocks, same next coordinates.
          if (s == 2) {
            std::vector<index_t> g4, next;
            REQUIRE(merge_indices(grids[st], grids[st], span<const index_t>(coords), g4, next) == status::success);
            CHECK(next == b.next_coords);
            for (index_t n = 0; n < b.num_outputs(); ++n)
              for (index_t k = 0; k < 4; ++k)
                CHECK(g4[4 * n + k] == b.gather[4 * n + merge_dh(k) * 2 + merge_dw(k)]);
          }
        }
    }
}

TEST_CASE("block table refuses a partly visible block, never merges it") {
  std::vector<index_t> coords;
  for (index_t h = 0; h < 4; ++h)
    for (index_t w = 0; w < 4; ++w) coords.push_back(pack_coord(h, w));
  block_table b;
  b.num_inputs = 99;
  REQUIRE(build_block_table(8, 8, 4, span<const index_t>(coords), b) == status::success);
  CHECK(b.num_outputs() == 1);
  coords.pop_back();  // (3, 3) masked: the block is partly visible
  CHECK(build_block_table(8, 8, 4, span<const index_t>(coords), b) == status::misaligned);
  CHECK(b.num_outputs() == 1);  // untouched
  CHECK(b.num_inputs == 16);
  CHECK(build_block_table(8, 8, 2, span<const index_t>(coords), b) == status::misaligned);
  CHECK(build_block_table(8, 8, 3, span<const index_t>(coords), b) == status::invalid_argument);  // 8 % 3
  CHECK(build_block_table(8, 8, 0, span<const index_t>(coords), b) == status::invalid_argument);
  // a 1-token shift of an aligned mask breaks every block
  std::mt19937 g(1);
  mask_config cfg;
  const auto units = random_mask(cfg, 9);
  auto c = unit_coords(units, 56);
  for (auto& x : c) x = pack_coord(coord_h(x), (coord_w(x) + 1) % 56);
  std::sort(c.begin(), c.end());
  CHECK(build_block_table(56, 56, 8, span<const index_t>(c), b) == status::misaligned);
  CHECK(build_block_table(56, 56, 2, span<const index_t>(c), b) == status::misaligned);
}

TEST_CASE("block_rule::any: an output per block with a visible input, masked inputs pad_index (brute force)") {
  std::mt19937 g(5);
  for (index_t s : {index_t(1), index_t(2), index_t(4), index_t(8)})
    for (double keep : {0.05, 0.3, 0.7, 1.0}) {
      const index_t H = 16, W = 24;
      std::vector<std::vector<index_t>> samples{random_coords(g, H, W, keep), random_coords(g, H, W, keep), {}};
      std::vector<index_t> cu{0}, flat;
      for (const auto& c : samples) {
        flat.insert(flat.end(), c.begin(), c.end());
        cu.push_back(static_cast<index_t>(flat.size()));
      }
      block_table b;
      REQUIRE(build_block_table_per_sample(H, W, s, span<const index_t>(cu), span<const index_t>(flat), b,
                                           block_rule::any) == status::success);
      REQUIRE(b.next_cu_seqlens.size() == samples.size() + 1);
      std::vector<char> used(flat.size(), 0);
      for (size_t i = 0; i < samples.size(); ++i) {
        std::vector<index_t> want;  // blocks with a visible input, row-major
        for (index_t bh = 0; bh < H / s; ++bh)
          for (index_t bw = 0; bw < W / s; ++bw) {
            bool any = false;
            for (index_t p = 0; p < s * s; ++p)
              any |= find_token(samples[i], 0, block_h(s, bh, p), block_w(s, bw, p)) != pad_index;
            if (any) want.push_back(pack_coord(bh, bw));
          }
        const index_t first = b.next_cu_seqlens[i], n = b.next_cu_seqlens[i + 1] - first;
        REQUIRE(n == static_cast<index_t>(want.size()));
        for (index_t j = 0; j < n; ++j) {
          REQUIRE(b.next_coords[first + j] == want[j]);
          for (index_t p = 0; p < s * s; ++p) {
            const index_t t = b.gather[(first + j) * s * s + p];
            REQUIRE(t == find_token(samples[i], cu[i], block_h(s, coord_h(want[j]), p),
                                    block_w(s, coord_w(want[j]), p)));
            if (t != pad_index) used[t]++;
          }
        }
      }
      for (char u : used) REQUIRE(u == 1);  // every visible token in exactly one block
      // aligned sets: the two rules give the same table
      if (keep == 1.0) {
        block_table whole;
        REQUIRE(build_block_table_per_sample(H, W, s, span<const index_t>(cu), span<const index_t>(flat), whole) ==
                status::success);
        CHECK(whole.gather == b.gather);
        CHECK(whole.next_coords == b.next_coords);
      }
    }
  // the shared-mask builder under the same rule: a partly visible 4x4 block is one output with one hole
  std::vector<index_t> c;
  for (index_t h = 0; h < 4; ++h)
    for (index_t w = 0; w < 4; ++w)
      if (h != 3 || w != 3) c.push_back(pack_coord(h, w));
  block_table b;
  REQUIRE(build_block_table(8, 8, 4, span<const index_t>(c), b, block_rule::any) == status::success);
  REQUIRE(b.num_outputs() == 1);
  CHECK(b.gather[15] == pad_index);
  CHECK(std::count(b.gather.begin(), b.gather.end(), pad_index) == 1);
}

TEST_CASE("per-sample block table: cu_seqlens of the next stage, each sample as if alone") {
  mask_config cfg;
  std::vector<index_t> cu{0}, flat;
  std::vector<std::vector<index_t>> samples;
  for (int b = 0; b < 5; ++b) {
    cfg.ratio = b == 3 ? 1.0 : 0.75;  // sample 3 has no visible token
    samples.push_back(unit_coords(random_mask(cfg, 42, static_cast<std::uint64_t>(b)), 28));
    flat.insert(flat.end(), samples.back().begin(), samples.back().end());
    cu.push_back(static_cast<index_t>(flat.size()));
  }
  block_table all;
  REQUIRE(build_block_table_per_sample(28, 28, 4, span<const index_t>(cu), span<const index_t>(flat), all) ==
          status::success);
  REQUIRE(all.next_cu_seqlens.size() == 6);
  for (int b = 0; b < 5; ++b) {
    block_table one;
    REQUIRE(build_block_table(28, 28, 4, span<const index_t>(samples[b]), one) == status::success);
    const index_t n0 = all.next_cu_seqlens[b];
    REQUIRE(all.next_cu_seqlens[b + 1] - n0 == one.num_outputs());
    for (index_t n = 0; n < one.num_outputs(); ++n) {
      CHECK(all.next_coords[n0 + n] == one.next_coords[n]);
      for (index_t p = 0; p < 16; ++p) CHECK(all.gather[(n0 + n) * 16 + p] == one.gather[n * 16 + p] + cu[b]);
    }
  }
  const std::vector<index_t> cu_bad{0, 5};
  CHECK(build_block_table_per_sample(28, 28, 4, span<const index_t>(cu_bad), span<const index_t>(flat), all) ==
        status::shape_mismatch);
}

TEST_CASE("tables chain through a Twins-L encoder: patch embedding gives the next stage's tokens, GSA one key per unit") {
  const index_t grids[4] = {56, 28, 14, 7}, sr[4] = {8, 4, 2, 1};
  for (std::uint64_t seed : {7u, 8u, 9u}) {
    mask_config cfg;
    const auto units = random_mask(cfg, seed);
    const auto unit_grid = unit_coords(units, 7);  // the visible mask units themselves
    for (int st = 0; st < 4; ++st) {
      const auto coords = unit_coords(units, grids[st]);
      neighbor_table peg;
      REQUIRE(build_neighbor_table(grids[st], grids[st], 3, span<const index_t>(coords), peg) == status::success);
      block_table keys;
      REQUIRE(build_block_table(grids[st], grids[st], sr[st], span<const index_t>(coords), keys) == status::success);
      CHECK(keys.next_coords == unit_grid);  // GSA keys: one per visible mask unit, in unit row-major order
      if (st < 3) {
        block_table embed;
        REQUIRE(build_block_table(grids[st], grids[st], 2, span<const index_t>(coords), embed) == status::success);
        CHECK(embed.next_coords == unit_coords(units, grids[st + 1]));  // = the next stage's visible tokens
      }
    }
  }
}
