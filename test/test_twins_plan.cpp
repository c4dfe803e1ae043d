// The one-call Twins plan (twins_plan.hpp) against the general builders and brute force: each
// stage's tokens (spconv's rule: a block with a visible token is a token of the next stage) in
// block-major order, the LSA partition, the PEG neighbour table, the GSA and patch-embedding
// block tables (and whether each is a reshape of its input), the padded GSA layout and the unit
// ranks; random unit and per-patch masks, shared and per sample.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include <greenmim/partition.hpp>
#include <greenmim/sparse_conv.hpp>
#include <greenmim/twins_plan.hpp>

using namespace greenmim;

namespace {

std::vector<index_t> slice(const std::vector<index_t>& arena, const arena_range& r) {
  return std::vector<index_t>(arena.begin() + r.offset, arena.begin() + r.offset + r.size);
}

// [M, side, side] cells, each visible with probability keep (a sample may come out empty).
std::vector<std::uint8_t> random_cells(std::mt19937& g, index_t M, index_t side, double keep) {
  std::bernoulli_distribution d(keep);
  std::vector<std::uint8_t> m(static_cast<size_t>(M) * side * side);
  for (auto& v : m) v = d(g) ? 1 : 0;
  return m;
}

// Brute force: the rank of (i, j) in an f x f cell visited quadrant by quadrant (Z order).
index_t z_rank(index_t i, index_t j, index_t f) {
  index_t r = 0;
  for (index_t half = f / 2; half >= 1; half /= 2) {
    r = r * 4 + (i >= half ? 2 : 0) + (j >= half ? 1 : 0);
    i %= half;
    j %= half;
  }
  return r;
}

// The block-major key of cell (h, w) of a side x side grid with f x f coarse cells.
std::int64_t block_major_key(index_t c, index_t side, index_t f) {
  const index_t h = coord_h(c), w = coord_w(c);
  return (static_cast<std::int64_t>(h / f) * (side / f) + w / f) * f * f + z_rank(h % f, w % f, f);
}

// The permutation that sorts each sample's range [cu[b], cu[b+1]) of `coords` by block-major key.
std::vector<index_t> block_major_perm(const std::vector<index_t>& cu, const std::vector<index_t>& coords, index_t side,
                                      index_t f) {
  std::vector<index_t> perm(coords.size());
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<index_t>(i);
  for (size_t b = 0; b + 1 < cu.size(); ++b)
    std::stable_sort(perm.begin() + cu[b], perm.begin() + cu[b + 1], [&](index_t x, index_t y) {
      return block_major_key(coords[static_cast<size_t>(x)], side, f) < block_major_key(coords[static_cast<size_t>(y)], side, f);
    });
  return perm;
}

// A general builder's block table (outputs row-major) with its outputs in block-major order.
void reorder_outputs(block_table& t, index_t side, index_t f) {
  const std::vector<index_t> perm = block_major_perm(t.next_cu_seqlens, t.next_coords, side, f);
  const index_t ss = t.positions();
  std::vector<index_t> gather, coords;
  for (index_t o : perm) {
    gather.insert(gather.end(), t.gather.begin() + static_cast<std::int64_t>(o) * ss,
                  t.gather.begin() + static_cast<std::int64_t>(o + 1) * ss);
    coords.push_back(t.next_coords[static_cast<size_t>(o)]);
  }
  t.gather.swap(gather);
  t.next_coords.swap(coords);
}

// Brute force: output n's tap (i, j) is input n*s*s + z_rank(i, j), every input used once.
bool is_reshape(const block_table& t) {
  const index_t s = t.stride;
  if (t.num_outputs() * s * s != t.num_inputs) return false;
  for (index_t n = 0; n < t.num_outputs(); ++n)
    for (index_t i = 0; i < s; ++i)
      for (index_t j = 0; j < s; ++j)
        if (t.gather[static_cast<size_t>((n * s + i) * s + j)] != n * s * s + z_rank(i, j, s)) return false;
  return true;
}

// Brute force: stage masks [M, H, H]; stage 0 is the mask upsampled to the grid, stage s+1 a
// 2x2 "any" pooling of stage s.
std::vector<std::vector<std::uint8_t>> stage_masks(const std::vector<std::uint8_t>& mask, index_t M, index_t units,
                                                   index_t grid, index_t stages) {
  std::vector<std::vector<std::uint8_t>> out;
  std::vector<std::uint8_t> cur(static_cast<size_t>(M) * grid * grid);
  const index_t f = grid / units;
  for (index_t b = 0; b < M; ++b)
    for (index_t h = 0; h < grid; ++h)
      for (index_t w = 0; w < grid; ++w)
        cur[static_cast<size_t>((b * grid + h) * grid + w)] =
            mask[static_cast<size_t>((b * units + h / f) * units + w / f)];
  out.push_back(cur);
  for (index_t s = 1, H = grid / 2; s < stages; ++s, H /= 2) {
    std::vector<std::uint8_t> nxt(static_cast<size_t>(M) * H * H, 0);
    for (index_t b = 0; b < M; ++b)
      for (index_t h = 0; h < 2 * H; ++h)
        for (index_t w = 0; w < 2 * H; ++w)
          nxt[static_cast<size_t>((b * H + h / 2) * H + w / 2)] |= out.back()[static_cast<size_t>((b * 2 * H + h) * 2 * H + w)];
    out.push_back(nxt);
  }
  return out;
}

void check_plan(const std::vector<std::uint8_t>& mask, index_t M, index_t units, bool per_sample,
                const twins_geometry& geo, const encoder_plan_options& opt) {
  twins_planner tp;
  twins_plan p;
  REQUIRE(tp.run(span<const std::uint8_t>(mask), M, units, units, per_sample, geo, opt, p) == status::success);
  const auto sm = stage_masks(mask, M, units, geo.grid, geo.num_stages());
  // mask units as large as the last stage's tokens: every block of every stage is whole
  const bool whole = units == (geo.grid >> (geo.num_stages() - 1));
  REQUIRE(static_cast<index_t>(p.stages.size()) == geo.num_stages());
  std::int64_t covered = 0;
  for (index_t s = 0; s < geo.num_stages(); ++s) {
    CAPTURE(s);
    const twins_stage& st = p.stages[static_cast<size_t>(s)];
    const index_t H = geo.grid >> s;
    std::vector<index_t> cu, row_major;
    REQUIRE(keep_mask_coords(span<const std::uint8_t>(sm[static_cast<size_t>(s)]), M, H, H, cu, row_major) ==
            status::success);
    const index_t f = index_t{1} << (geo.num_stages() - 1 - s);  // the last stage's cells, at this stage
    std::vector<index_t> coords;  // block-major per sample
    for (index_t t : block_major_perm(cu, row_major, H, f)) coords.push_back(row_major[static_cast<size_t>(t)]);
    const index_t N = static_cast<index_t>(coords.size());
    REQUIRE(st.num_tokens == N);
    const auto pos = slice(p.arena, st.position);
    for (index_t b = 0; b < M; ++b)
      for (index_t t = cu[b]; t < cu[b + 1]; ++t)
        REQUIRE(pos[t] == (per_sample ? b * H * H : 0) + coord_h(coords[t]) * H + coord_w(coords[t]));
    if (per_sample) CHECK(slice(p.arena, st.cu_seqlens) == cu);
    const span<const index_t> cus(cu), cs(coords);
    // LSA: the builders' partition of the plain windows
    const window_geometry g{H, H, geo.windows[s], 0};
    window_list wl;
    REQUIRE((per_sample ? build_windows_per_sample(g, cus, cs, wl) : build_windows(g, cs, wl)) == status::success);
    planner_options po;
    po.strat = opt.strat;
    po.group_size = opt.window_area_groups ? g.window * g.window : opt.group_size;
    plan want_plan;
    REQUIRE(make_plan(span<const index_t>(wl.sizes()), po, geo.channels[s], want_plan) == status::success);
    partition_indices want;
    REQUIRE(build_partition(want_plan, wl, want) == status::success);
    CHECK(st.lsa.group_size == want.group_size);
    CHECK(st.lsa.num_groups == want.num_groups);
    CHECK(st.lsa.shift == 0);
    CHECK(slice(p.arena, st.lsa.gather) == want.gather);
    CHECK(slice(p.arena, st.lsa.scatter) == want.scatter);
    CHECK(slice(p.arena, st.lsa.slot_window) == want.slot_window);
    CHECK(slice(p.arena, st.lsa.slot_coord) == want.slot_coord);
    // PEG
    neighbor_table nt;
    REQUIRE((per_sample ? build_neighbor_table_per_sample(H, H, 3, cus, cs, nt) : build_neighbor_table(H, H, 3, cs, nt)) ==
            status::success);
    CHECK(slice(p.arena, st.neighbors) == nt.nbr);
    // GSA keys
    const index_t sr = geo.sr_ratios[s];
    std::vector<index_t> key_cu = cu;
    if (sr > 1) {
      block_table kt;
      REQUIRE((per_sample ? build_block_table_per_sample(H, H, sr, cus, cs, kt, block_rule::any)
                          : build_block_table(H, H, sr, cs, kt, block_rule::any)) == status::success);
      if (f % sr == 0) reorder_outputs(kt, H / sr, f / sr);  // sr a power of two here
      CHECK(slice(p.arena, st.keys) == kt.gather);
      CHECK(st.key_reshape == is_reshape(kt));
      CHECK(st.key_reshape == block_table_is_reshape(kt));
      if (whole) CHECK(st.key_reshape);
      CHECK(st.key_holes == (std::count(kt.gather.begin(), kt.gather.end(), pad_index) > 0));
      key_cu = kt.next_cu_seqlens;
    } else {
      CHECK(st.keys.size == 0);
    }
    CHECK(st.num_keys == key_cu.back());
    if (per_sample) CHECK(slice(p.arena, st.key_cu_seqlens) == key_cu);
    index_t mt = 0, mk = 0;
    for (index_t b = 0; b < M; ++b) {
      mt = std::max(mt, cu[b + 1] - cu[b]);
      mk = std::max(mk, key_cu[b + 1] - key_cu[b]);
    }
    CHECK(st.max_tokens == mt);
    CHECK(st.max_keys == mk);
    bool uni = true;
    for (index_t b = 0; b < M; ++b) uni &= cu[b + 1] - cu[b] == mt && key_cu[b + 1] - key_cu[b] == mk;
    CHECK(st.uniform == uni);
    if (per_sample && !uni) {
      const auto qs = slice(p.arena, st.query_slot), kg = slice(p.arena, st.key_gather);
      REQUIRE(static_cast<index_t>(kg.size()) == M * mk);
      std::vector<char> hit(static_cast<size_t>(M) * mt, 0);
      for (index_t b = 0; b < M; ++b) {
        for (index_t t = cu[b]; t < cu[b + 1]; ++t) {
          REQUIRE(qs[t] / mt == b);  // in its own sample's row
          REQUIRE(hit[qs[t]]++ == 0);
        }
        for (index_t j = 0; j < mk; ++j)
          CHECK(kg[b * mk + j] == (key_cu[b] + j < key_cu[b + 1] ? key_cu[b] + j : pad_index));
      }
    } else {
      CHECK(st.query_slot.size == 0);
      CHECK(st.key_gather.size == 0);
    }
    // patch embedding into the next stage, or the unit ranks
    if (s + 1 < geo.num_stages()) {
      block_table et;
      REQUIRE((per_sample ? build_block_table_per_sample(H, H, 2, cus, cs, et, block_rule::any)
                          : build_block_table(H, H, 2, cs, et, block_rule::any)) == status::success);
      reorder_outputs(et, H / 2, f / 2);
      CHECK(slice(p.arena, st.embed) == et.gather);
      CHECK(st.embed_reshape == is_reshape(et));
      CHECK(st.embed_reshape == block_table_is_reshape(et));
      if (whole) CHECK(st.embed_reshape);
      CHECK(st.unit_rank.size == 0);
    } else {
      const auto rank = slice(p.arena, st.unit_rank);
      REQUIRE(static_cast<index_t>(rank.size()) == M * H * H);
      for (index_t b = 0; b < M; ++b) {
        index_t v = 0, m = 0;
        for (index_t i = 0; i < H * H; ++i)
          CHECK(rank[b * H * H + i] == (sm[static_cast<size_t>(s)][b * H * H + i] ? v++ : -1 - m++));
      }
    }
    for (const arena_range* r : {&st.position, &st.cu_seqlens, &st.neighbors, &st.keys, &st.key_cu_seqlens,
                                 &st.query_slot, &st.key_gather, &st.embed, &st.unit_rank, &st.lsa.gather,
                                 &st.lsa.scatter, &st.lsa.slot_window, &st.lsa.slot_coord})
      covered += r->size;
  }
  CHECK(covered == static_cast<std::int64_t>(p.arena.size()));  // the ranges tile the arena
}

}  // namespace

TEST_CASE("Twins plan equals the general builders: unit and per-patch masks, shared and per sample") {
  std::mt19937 g(3);
  twins_geometry l;  // Twins-L at 224 px
  twins_geometry small;
  small.grid = 28;
  small.windows = {7, 7, 7};
  small.sr_ratios = {4, 2, 1};
  small.channels = {16, 32, 64};
  encoder_plan_options opt, area;
  area.window_area_groups = true;
  for (int rep = 0; rep < 3; ++rep) {
    const auto shared = random_cells(g, 1, 7, 0.25 + 0.2 * rep);
    if (std::count(shared.begin(), shared.end(), 1) == 0) continue;
    check_plan(shared, 1, 7, false, l, rep == 1 ? area : opt);
    check_plan(random_cells(g, 3, 7, 0.3), 3, 7, true, l, opt);
    // per patch: partly visible blocks at every stage (holes in the block tables)
    check_plan(random_cells(g, 1, 28, 0.5), 1, 28, false, small, opt);
    check_plan(random_cells(g, 4, 28, 0.2 + 0.1 * rep), 4, 28, true, small, area);
  }
}

TEST_CASE("Twins plan: uniform per-sample batches need no padding; refusals; two phases") {
  std::mt19937 g(4);
  twins_geometry l;
  std::vector<std::uint8_t> m(4 * 49, 0);  // 12 units per sample, as random masks keep
  for (int b = 0; b < 4; ++b)
    for (int k = 0; k < 12; ++k) m[static_cast<size_t>(b * 49 + (k * 4 + b) % 49)] = 1;
  twins_planner tp;
  twins_plan p;
  REQUIRE(tp.run(span<const std::uint8_t>(m), 4, 7, 7, true, l, encoder_plan_options{}, p) == status::success);
  for (const auto& st : p.stages) {
    CHECK(st.uniform);
    CHECK(st.num_keys == 4 * 12);  // one key per visible unit at every stage
    CHECK(!st.key_holes);
    CHECK(!st.embed_holes);
  }
  const encoder_plan_options o;
  twins_plan untouched;
  auto bad = l;
  bad.windows = {7, 7, 7, 4};  // 4 does not divide 7
  CHECK(tp.prepare(span<const std::uint8_t>(m), 4, 7, 7, true, bad, o, untouched) == status::invalid_argument);
  bad = l;
  bad.sr_ratios = {8, 4, 3, 1};
  CHECK(tp.prepare(span<const std::uint8_t>(m), 4, 7, 7, true, bad, o, untouched) == status::invalid_argument);
  bad = l;
  bad.channels = {1, 2};
  CHECK(tp.prepare(span<const std::uint8_t>(m), 4, 7, 7, true, bad, o, untouched) == status::invalid_argument);
  CHECK(tp.prepare(span<const std::uint8_t>(m), 4, 7, 7, false, l, o, untouched) == status::invalid_argument);
  CHECK(tp.prepare(span<const std::uint8_t>(m.data(), 5 * 5 * 4), 4, 5, 5, true, l, o, untouched) ==
        status::shape_mismatch);
  std::vector<std::uint8_t> none(49, 0);
  CHECK(tp.prepare(span<const std::uint8_t>(none), 1, 7, 7, false, l, o, untouched) == status::empty_input);
  CHECK(untouched.stages.empty());
  std::vector<index_t> arena(16);
  CHECK(tp.write(arena.data()) == status::invalid_argument);  // the last prepare failed
  // prepare + write equals run
  twins_plan lay;
  REQUIRE(tp.prepare(span<const std::uint8_t>(m), 4, 7, 7, true, l, o, lay) == status::success);
  arena.assign(static_cast<size_t>(tp.arena_size()), -9);
  REQUIRE(tp.write(arena.data()) == status::success);
  CHECK(arena == p.arena);
}

TEST_CASE("Block-major order: Morton ranks and the cell list are the Z order, every aligned block a run") {
  for (index_t f : {1, 2, 4, 8, 16})
    for (index_t i = 0; i < f; ++i)
      for (index_t j = 0; j < f; ++j) CHECK(morton_rank(i, j) == z_rank(i, j, f));
  for (index_t side : {1, 8, 24, 56}) {
    for (index_t f = 1; f <= 8 && side % f == 0; f *= 2) {
      CAPTURE(side);
      CAPTURE(f);
      std::vector<index_t> cells;
      block_major_cells(side, f, cells);
      REQUIRE(static_cast<index_t>(cells.size()) == side * side);
      std::vector<char> seen(static_cast<size_t>(side) * side, 0);
      for (size_t r = 0; r < cells.size(); ++r) {
        REQUIRE(block_major_key(cells[r], side, f) == static_cast<std::int64_t>(r));  // sorted, no gap
        REQUIRE(seen[static_cast<size_t>(coord_h(cells[r]) * side + coord_w(cells[r]))]++ == 0);
      }
      // every aligned k x k block (k | f) is the run [r0, r0 + k*k) in Morton order
      for (index_t k = 1; k <= f; k *= 2)
        for (size_t r0 = 0; r0 < cells.size(); r0 += static_cast<size_t>(k * k)) {
          const index_t h0 = coord_h(cells[r0]), w0 = coord_w(cells[r0]);
          REQUIRE(h0 % k == 0);
          REQUIRE(w0 % k == 0);
          for (index_t i = 0; i < k; ++i)
            for (index_t j = 0; j < k; ++j)
              REQUIRE(cells[r0 + static_cast<size_t>(morton_rank(i, j))] == pack_coord(h0 + i, w0 + j));
        }
    }
  }
}

TEST_CASE("Twins planner reused across geometries equals a fresh one (its cached block-major cells)") {
  std::mt19937 g(6);
  twins_geometry l, small, other_sr;
  small.grid = 28;
  small.windows = {7, 7, 7};
  small.sr_ratios = {4, 2, 1};
  small.channels = {16, 32, 64};
  other_sr.sr_ratios = {4, 2, 2, 1};  // Twins-L's grid, other GSA strides: the keys' cells change
  twins_planner reused;
  for (int rep = 0; rep < 2; ++rep)
    for (const twins_geometry* geo : {&l, &small, &other_sr, &l}) {
      const auto m = random_cells(g, 3, 7, 0.4);
      twins_plan a, b;
      REQUIRE(reused.run(span<const std::uint8_t>(m), 3, 7, 7, true, *geo, encoder_plan_options{}, a) ==
              status::success);
      twins_planner fresh;
      REQUIRE(fresh.run(span<const std::uint8_t>(m), 3, 7, 7, true, *geo, encoder_plan_options{}, b) ==
              status::success);
      CHECK(a.arena == b.arena);
    }
}
