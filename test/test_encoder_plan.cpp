// The one-call encoder plan (encoder_plan.hpp) against the general builders it replaces on the
// hot path: windows (build_windows / build_windows_per_sample), the planner, build_partition,
// merge_indices; on random shared and per-sample masks, several geometries and group caps.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include <greenmim/encoder_plan.hpp>
#include <greenmim/merging.hpp>
#include <greenmim/partition.hpp>

using namespace greenmim;

namespace {

struct mask_batch {
  std::vector<std::uint8_t> cells;  // [M, units, units]
  index_t M, units;
};

mask_batch random_units(std::mt19937_64& rng, index_t M, index_t units, bool allow_empty_sample) {
  mask_batch b{std::vector<std::uint8_t>(static_cast<size_t>(M) * units * units, 0), M, units};
  for (index_t s = 0; s < M; ++s) {
    const index_t n = units * units;
    const index_t keep = allow_empty_sample ? static_cast<index_t>(rng() % (n + 1))
                                            : 1 + static_cast<index_t>(rng() % n);
    std::vector<index_t> idx(static_cast<size_t>(n));
    for (index_t i = 0; i < n; ++i) idx[static_cast<size_t>(i)] = i;
    std::shuffle(idx.begin(), idx.end(), rng);
    for (index_t i = 0; i < keep; ++i) b.cells[static_cast<size_t>(s * n + idx[static_cast<size_t>(i)])] = 1;
  }
  return b;
}

std::vector<index_t> slice(const std::vector<index_t>& arena, const arena_range& r) {
  return std::vector<index_t>(arena.begin() + r.offset, arena.begin() + r.offset + r.size);
}

// Stage-s mask at token resolution, [M, H, H], as the Python package defined it before:
// the stage-1 mask (units repeated) subsampled by 2^s.
std::vector<std::uint8_t> stage_mask(const mask_batch& m, index_t grid, index_t s) {
  const index_t H = grid >> s, f = grid / m.units;
  std::vector<std::uint8_t> out(static_cast<size_t>(m.M) * H * H);
  for (index_t b = 0; b < m.M; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t w = 0; w < H; ++w)
        out[static_cast<size_t>((b * H + h) * H + w)] =
            m.cells[static_cast<size_t>((b * m.units + (h << s) / f) * m.units + (w << s) / f)];
  return out;
}

void check_against_general_builders(const mask_batch& m, bool per_sample, const encoder_geometry& geo,
                                    const encoder_plan_options& opt) {
  encoder_planner ep;
  encoder_plan p;
  REQUIRE(ep.run(span<const std::uint8_t>(m.cells), m.M, m.units, m.units, per_sample, geo, opt, p) ==
          status::success);
  REQUIRE(static_cast<index_t>(p.stages.size()) == geo.num_stages);
  std::int64_t covered = 0;
  for (index_t s = 0; s < geo.num_stages; ++s) {
    const encoder_stage& st = p.stages[static_cast<size_t>(s)];
    const index_t H = geo.grid >> s;
    CAPTURE(s);
    std::vector<index_t> cu, coords;
    const std::vector<std::uint8_t> sm = stage_mask(m, geo.grid, s);
    REQUIRE(keep_mask_coords(span<const std::uint8_t>(sm), m.M, H, H, cu, coords) == status::success);
    CHECK(st.num_tokens == static_cast<index_t>(coords.size()));
    for (int k = 0; k < 2; ++k) {
      const window_geometry g = make_window_geometry(H, H, geo.window, k ? geo.window / 2 : 0);
      window_list wl;
      REQUIRE((per_sample ? build_windows_per_sample(g, span<const index_t>(cu), span<const index_t>(coords), wl)
                          : build_windows(g, span<const index_t>(coords), wl)) == status::success);
      planner_options po;
      po.strat = opt.strat;
      po.group_size = opt.window_area_groups ? g.window * g.window : opt.group_size;
      po.max_group_size = opt.max_group_size;
      plan want_plan;
      REQUIRE(make_plan(span<const index_t>(wl.sizes()), po, flops_cost{geo.embed_dim << s}, want_plan) ==
              status::success);
      partition_indices want;
      REQUIRE(build_partition(want_plan, wl, want) == status::success);
      const encoder_partition& got = st.part[k];
      CAPTURE(k);
      CHECK(got.window == g.window);
      CHECK(got.shift == g.shift);
      CHECK(got.group_size == want.group_size);
      if (opt.window_area_groups) CHECK(got.group_size == std::min(g.window * g.window, st.num_tokens));  // capped at N
      CHECK(got.num_groups == want.num_groups);
      CHECK(got.cost == doctest::Approx(want_plan.cost));
      CHECK(slice(p.arena, got.gather) == want.gather);
      CHECK(slice(p.arena, got.scatter) == want.scatter);
      CHECK(slice(p.arena, got.slot_window) == want.slot_window);
      CHECK(slice(p.arena, got.slot_coord) == want.slot_coord);
      covered += got.gather.size + got.scatter.size + got.slot_window.size + got.slot_coord.size;
      if (k == 1 && g.shift == 0) covered -= got.gather.size + got.scatter.size + got.slot_window.size + got.slot_coord.size;
    }
    const std::vector<index_t> pos = slice(p.arena, st.position);
    REQUIRE(pos.size() == coords.size());
    for (index_t b = 0; b < m.M; ++b)
      for (index_t t = cu[static_cast<size_t>(b)]; t < cu[static_cast<size_t>(b) + 1]; ++t)
        CHECK(pos[static_cast<size_t>(t)] ==
              (per_sample ? b * H * H : 0) + coord_h(coords[static_cast<size_t>(t)]) * H + coord_w(coords[static_cast<size_t>(t)]));
    covered += st.position.size;
    if (per_sample) CHECK(slice(p.arena, st.cu_seqlens) == cu);
    else CHECK(st.cu_seqlens.size == 0);
    covered += st.cu_seqlens.size;
    if (s + 1 < geo.num_stages) {
      std::vector<index_t> g4, next, next_cu;
      REQUIRE((per_sample ? merge_indices_per_sample(H, H, span<const index_t>(cu), span<const index_t>(coords), g4,
                                                     next_cu, next)
                          : merge_indices(H, H, span<const index_t>(coords), g4, next)) == status::success);
      CHECK(slice(p.arena, st.merge) == g4);
      CHECK(st.unit_rank.size == 0);
    } else {
      CHECK(st.merge.size == 0);
      const std::vector<index_t> rank = slice(p.arena, st.unit_rank);
      REQUIRE(rank.size() == sm.size());
      for (index_t b = 0; b < m.M; ++b) {
        index_t vis = 0, hid = 0;
        for (index_t c = 0; c < H * H; ++c) {
          const index_t r = rank[static_cast<size_t>(b * H * H + c)];
          CHECK(r == (sm[static_cast<size_t>(b * H * H + c)] ? vis++ : -1 - hid++));
        }
      }
    }
    covered += st.merge.size + st.unit_rank.size;
  }
  CHECK(covered == static_cast<std::int64_t>(p.arena.size()));  // the ranges tile the arena
}

}  // namespace

TEST_CASE("encoder plan equals the general builders (random masks, geometries, caps)") {
  std::mt19937_64 rng(20261125);
  struct geo_case {
    encoder_geometry geo;
    index_t units;
  };
  const geo_case cases[] = {
      {{56, 7, 4, 32}, 7},    // Swin 224 / window 7 / 32 px units
      {{48, 6, 4, 32}, 6},    // SimMIM 192 / window 6
      {{64, 8, 4, 32}, 8},    // Swin V2 256 / window 8
      {{64, 16, 4, 32}, 8},   // window 16
      {{56, 14, 4, 32}, 7},   // window 14
      {{56, 7, 4, 32}, 14},   // 16 px units, masks of whole 32 px blocks (made below)
      {{32, 5, 3, 16}, 4},    // odd window, 3 stages
  };
  for (const geo_case& c : cases) {
    for (int rep = 0; rep < 7; ++rep) {
      const bool per_sample = rep % 2 == 1;
      const index_t M = per_sample ? 1 + static_cast<index_t>(rng() % 5) : 1;
      // 16 px units do not cover the last stage's 32 px tokens: only masks of whole 2x2 unit blocks merge
      mask_batch m = random_units(rng, M, c.units, false);
      if (c.units == 14) {
        mask_batch coarse = random_units(rng, M, 7, false);
        for (index_t b = 0; b < M; ++b)
          for (index_t i = 0; i < 14 * 14; ++i)
            m.cells[static_cast<size_t>(b * 196 + i)] =
                coarse.cells[static_cast<size_t>(b * 49 + (i / 14 / 2) * 7 + (i % 14) / 2)];
      }
      encoder_plan_options opt;
      if (rep == 2) opt.strat = strategy::paper;
      if (rep == 3) opt.max_group_size = c.geo.window * c.geo.window;
      if (rep == 4) opt.strat = strategy::per_window;
      if (rep == 6) opt.window_area_groups = true;
      CAPTURE(c.geo.grid);
      CAPTURE(c.geo.window);
      CAPTURE(rep);
      check_against_general_builders(m, per_sample, c.geo, opt);
    }
  }
}

// The arena's partitions are written as blocks of 8 or 16 entries that may pass a run's end
// (overwritten later), entry by entry near each array's end, and one entry at a time for windows
// above 16 (detail/window_partitioners.hpp, row_partitioner::write): large batches put many
// groups and rows on the block path and windows of every size class on theirs.
TEST_CASE("encoder plan: large per-sample batches and windows above 16 equal the general builders") {
  std::mt19937_64 rng(20261126);
  struct geo_case {
    encoder_geometry geo;
    index_t units, M;
  };
  const geo_case cases[] = {
      {{56, 7, 4, 128}, 7, 128},  // Swin-B 224, the benchmark's batch
      {{56, 7, 4, 32}, 7, 61},
      {{48, 6, 4, 32}, 6, 40},    // SimMIM 192 / window 6
      {{64, 12, 4, 32}, 8, 37},   // window 12: blocks of 16
      {{64, 20, 3, 32}, 16, 23},  // window 20: entry by entry
      {{56, 28, 3, 32}, 7, 17},   // window 28
  };
  for (const geo_case& c : cases) {
    for (int rep = 0; rep < 3; ++rep) {
      const mask_batch m = random_units(rng, c.M, c.units, false);
      encoder_plan_options opt;
      if (rep == 1) opt.max_group_size = c.geo.window * c.geo.window;
      if (rep == 2) opt.window_area_groups = true;
      CAPTURE(c.geo.grid);
      CAPTURE(c.geo.window);
      CAPTURE(c.M);
      CAPTURE(rep);
      check_against_general_builders(m, true, c.geo, opt);
    }
  }
}

TEST_CASE("encoder plan: two phases, reuse, refusals leave the output alone") {
  std::mt19937_64 rng(7);
  encoder_planner ep;
  const encoder_geometry geo{56, 7, 4, 32};
  encoder_plan first, again;
  const mask_batch a = random_units(rng, 3, 7, false);
  REQUIRE(ep.run(span<const std::uint8_t>(a.cells), 3, 7, 7, true, geo, {}, first) == status::success);
  // a second mask through the same (warm) planner, then the first again: the same arena
  const mask_batch b = random_units(rng, 5, 7, false);
  encoder_plan other;
  REQUIRE(ep.run(span<const std::uint8_t>(b.cells), 5, 7, 7, true, geo, {}, other) == status::success);
  REQUIRE(ep.run(span<const std::uint8_t>(a.cells), 3, 7, 7, true, geo, {}, again) == status::success);
  CHECK(again.arena == first.arena);

  // prepare + write into caller memory equals run
  encoder_plan layout;
  REQUIRE(ep.prepare(span<const std::uint8_t>(a.cells), 3, 7, 7, true, geo, {}, layout) == status::success);
  std::vector<index_t> buf(static_cast<size_t>(ep.arena_size()), 12345);
  REQUIRE(ep.write(buf.data()) == status::success);
  CHECK(buf == first.arena);

  encoder_plan untouched = first;
  auto refused = [&](std::vector<std::uint8_t> cells, index_t M, index_t mh, bool ps, encoder_geometry g,
                     encoder_plan_options o = {}) {
    const status s = ep.run(span<const std::uint8_t>(cells), M, mh, mh, ps, g, o, untouched);
    CHECK(untouched.arena == first.arena);
    return s;
  };
  CHECK(refused(std::vector<std::uint8_t>(49, 0), 1, 7, false, geo) == status::empty_input);
  CHECK(refused(std::vector<std::uint8_t>(25, 1), 1, 5, false, geo) == status::shape_mismatch);  // 5 does not tile 56
  CHECK(refused(a.cells, 3, 7, false, geo) == status::invalid_argument);                         // 3 masks, not per sample
  CHECK(refused(std::vector<std::uint8_t>(49, 1), 1, 7, false, {54, 7, 4, 32}) == status::invalid_argument);
  std::vector<std::uint8_t> checker(56 * 56);
  for (size_t i = 0; i < checker.size(); ++i) checker[i] = static_cast<std::uint8_t>(((i / 56) + i) % 2);
  CHECK(refused(checker, 1, 56, false, geo) == status::misaligned);  // patch-level noise: 2x2 blocks partly visible
  encoder_plan_options tight;
  tight.max_group_size = 40;  // a full 7x7 window holds 49
  CHECK(refused(std::vector<std::uint8_t>(49, 1), 1, 7, false, geo, tight) == status::size_exceeds_group);
  CHECK(ep.write(buf.data()) == status::invalid_argument);  // the last prepare failed: nothing to write
}
