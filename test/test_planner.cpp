// Planner: knapsack forms, strategies, bounds, bad input.
#include <doctest/doctest.h>

#include <greenmim/random_masks.hpp>
#include <greenmim/models.hpp>
#include <greenmim/planner.hpp>
#include <greenmim/windows.hpp>

#include <algorithm>
#include <functional>
#include <random>
#include <vector>

using namespace greenmim;

namespace {

std::vector<index_t> random_sizes(rng& g, int n, int maxv, double zero_prob = 0.0) {
  std::vector<index_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = g.uniform() < zero_prob ? 0 : static_cast<index_t>(1 + g.below(static_cast<std::uint64_t>(maxv)));
  return v;
}

// The reconstruction rule, implemented independently with brute-force reachability:
// walk items last to first, skip an item when the running sum is reachable by a subset of the
// items before it.
std::vector<index_t> brute_knapsack(const std::vector<index_t>& phi, index_t g, std::int64_t& total) {
  const int n = static_cast<int>(phi.size());
  auto reachable = [&](int prefix, std::int64_t target) {
    for (std::uint32_t m = 0; m < (1u << prefix); ++m) {
      std::int64_t s = 0;
      for (int i = 0; i < prefix; ++i)
        if (m >> i & 1) s += phi[i];
      if (s == target) return true;
    }
    return false;
  };
  total = 0;
  for (std::uint32_t m = 0; m < (1u << n); ++m) {
    std::int64_t s = 0;
    for (int i = 0; i < n; ++i)
      if (m >> i & 1) s += phi[i];
    if (s <= g) total = std::max(total, s);
  }
  std::vector<index_t> chosen;
  std::int64_t res = total;
  for (int i = n; i > 0 && res > 0; --i) {
    if (reachable(i - 1, res)) continue;
    chosen.push_back(i - 1);
    res -= phi[i - 1];
  }
  std::reverse(chosen.begin(), chosen.end());
  return chosen;
}

// Exact optimum over all G and all partitions, by enumerating set partitions (n <= 9).
double brute_optimum(const std::vector<index_t>& sizes, const flops_cost& cost) {
  std::vector<index_t> w;
  for (index_t s : sizes)
    if (s > 0) w.push_back(s);
  const int n = static_cast<int>(w.size());
  std::vector<std::int64_t> sums;
  double best = 1e300;
  std::function<void(int)> rec = [&](int i) {
    if (i == n) {
      std::int64_t mx = 0;
      for (auto s : sums) mx = std::max(mx, s);
      best = std::min(best, cost(static_cast<index_t>(mx), static_cast<index_t>(sums.size())));
      return;
    }
    for (size_t b = 0; b < sums.size(); ++b) {
      sums[b] += w[i];
      rec(i + 1);
      sums[b] -= w[i];
    }
    sums.push_back(w[i]);
    rec(i + 1);
    sums.pop_back();
  };
  rec(0);
  return best;
}

// The paper's Algorithm 1 written out independently (list-based, like the appendix Python).
double paper_by_hand(const std::vector<index_t>& sizes, const flops_cost& cost, index_t& best_g) {
  std::vector<index_t> w;
  for (index_t s : sizes)
    if (s > 0) w.push_back(s);
  const index_t mx = *std::max_element(w.begin(), w.end());
  std::int64_t S = 0;
  for (auto x : w) S += x;
  double best = 1e300;
  std::vector<index_t> chosen, table;
  for (index_t g = mx; g <= S; ++g) {
    std::vector<index_t> rem = w;
    index_t groups = 0;
    while (!rem.empty()) {
      knapsack_table(span<const index_t>(rem), g, chosen, table);
      std::vector<index_t> next;
      for (index_t i = 0; i < static_cast<index_t>(rem.size()); ++i)
        if (std::find(chosen.begin(), chosen.end(), i) == chosen.end()) next.push_back(rem[i]);
      rem.swap(next);
      ++groups;
    }
    const double c = cost(g, groups);
    if (c < best) { best = c; best_g = g; }
  }
  return best;
}

std::vector<std::vector<index_t>> swin_stage_sizes(int stage, int masks, std::uint64_t seed, bool shifted) {
  const model_shape& m = *find_model("swin-b");
  mask_config cfg;
  std::vector<std::vector<index_t>> out;
  for (int i = 0; i < masks; ++i) {
    auto um = random_mask(cfg, seed, static_cast<std::uint64_t>(i));
    std::vector<index_t> coords;
    REQUIRE(visible_coords(span<const std::uint8_t>(um), cfg.grid(), m.grid(stage), coords) == status::success);
    out.push_back(window_sizes(m.geometry(stage, shifted), span<const index_t>(coords)));
  }
  return out;
}

}  // namespace

TEST_CASE("knapsack: table DP equals brute force, reconstruction included (n <= 14)") {
  rng g(1);
  std::vector<index_t> chosen, table;
  for (int trial = 0; trial < 400; ++trial) {
    const int n = 1 + static_cast<int>(g.below(14));
    auto phi = random_sizes(g, n, 1 + static_cast<int>(g.below(40)), 0.1);
    const index_t cap = static_cast<index_t>(g.below(120));
    std::int64_t want_total = 0;
    auto want = brute_knapsack(phi, cap, want_total);
    const std::int64_t total = knapsack_table(span<const index_t>(phi), cap, chosen, table);
    CHECK(total == want_total);
    CHECK(chosen == want);
  }
}

TEST_CASE("knapsack: bitset and table decide identically on random inputs") {
  rng g(2);
  std::vector<index_t> c1, c2, table;
  std::vector<std::uint64_t> rows;
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = static_cast<int>(g.below(70));
    auto phi = random_sizes(g, n, 1 + static_cast<int>(g.below(200)), 0.05);
    const index_t cap = static_cast<index_t>(g.below(400));
    const auto t1 = knapsack_table(span<const index_t>(phi), cap, c1, table);
    const auto t2 = knapsack_bitset(span<const index_t>(phi), cap, c2, rows);
    REQUIRE(t1 == t2);
    REQUIRE(c1 == c2);
    std::int64_t s = 0;
    for (auto i : c2) s += phi[i];
    CHECK(s == t2);
    CHECK(t2 <= cap);
  }
}

TEST_CASE("paper strategy: bitset, table and an independent Algorithm 1 agree") {
  rng g(3);
  const flops_cost cost{64};
  for (int trial = 0; trial < 60; ++trial) {
    auto sizes = random_sizes(g, 1 + static_cast<int>(g.below(12)), 1 + static_cast<int>(g.below(49)), 0.2);
    if (*std::max_element(sizes.begin(), sizes.end()) == 0) sizes[0] = 3;
    plan a, b;
    planner_options o;
    o.strat = strategy::paper;
    REQUIRE(make_plan(span<const index_t>(sizes), o, cost, a) == status::success);
    o.table_dp = true;
    REQUIRE(make_plan(span<const index_t>(sizes), o, cost, b) == status::success);
    CHECK(a.group_size == b.group_size);
    CHECK(a.windows == b.windows);
    CHECK(a.group_offsets == b.group_offsets);
    index_t hand_g = 0;
    const double hand = paper_by_hand(sizes, cost, hand_g);
    CHECK(a.cost == hand);
    CHECK(a.group_size == hand_g);
  }
}

TEST_CASE("every strategy yields a valid plan with cost >= lower bound; fast <= paper") {
  rng g(4);
  const strategy all[] = {strategy::fast, strategy::paper, strategy::per_window, strategy::single};
  for (int trial = 0; trial < 150; ++trial) {
    const int n = 1 + static_cast<int>(g.below(trial < 100 ? 24 : 70));
    auto sizes = random_sizes(g, n, 1 + static_cast<int>(g.below(60)), 0.3);
    if (*std::max_element(sizes.begin(), sizes.end()) == 0) sizes[g.below(sizes.size())] = 1;
    const flops_cost cost{static_cast<index_t>(16 + g.below(512))};
    double paper_cost = 0, fast_cost = 0, fast_bound = 0, least_cost = 1e300;
    for (strategy s : all) {
      plan p;
      planner_options o;
      o.strat = s;
      REQUIRE(make_plan(span<const index_t>(sizes), o, cost, p) == status::success);
      CHECK(validate_plan(span<const index_t>(sizes), p) == status::success);
      CHECK(p.cost == cost(p.group_size, p.num_groups()));
      CHECK(p.cost >= p.lower_bound);
      CHECK(p.lower_bound > 0);
      if (s == strategy::paper) paper_cost = p.cost;
      if (s == strategy::fast) fast_cost = p.cost, fast_bound = p.lower_bound;
      least_cost = std::min(least_cost, p.cost);
    }
    CHECK(fast_cost <= paper_cost);
    CHECK(fast_bound <= least_cost * (1 + 1e-12));  // fast's a-posteriori bound holds for every plan
  }
}

TEST_CASE("fast is exactly optimal over all G for few windows (brute force)") {
  rng g(5);
  for (int trial = 0; trial < 120; ++trial) {
    auto sizes = random_sizes(g, 1 + static_cast<int>(g.below(9)), 1 + static_cast<int>(g.below(49)), 0.15);
    if (*std::max_element(sizes.begin(), sizes.end()) == 0) sizes[0] = 7;
    const flops_cost cost{static_cast<index_t>(8 + g.below(256))};
    plan p;
    REQUIRE(make_plan(span<const index_t>(sizes), planner_options{}, cost, p) == status::success);
    const double opt = brute_optimum(sizes, cost);
    CHECK(p.cost == doctest::Approx(opt).epsilon(1e-12));
    CHECK(p.lower_bound <= opt * (1 + 1e-12));  // a bound, never above the optimum
    CHECK(p.lower_bound == doctest::Approx(opt).epsilon(1e-12));  // exact sweep: the bound is tight
  }
}

TEST_CASE("max_group_size: G within the cap; exact under it for few windows; paper and fast agree") {
  rng g(21);
  for (int trial = 0; trial < 200; ++trial) {
    auto sizes = random_sizes(g, 1 + static_cast<int>(g.below(9)), 1 + static_cast<int>(g.below(64)), 0.15);
    if (*std::max_element(sizes.begin(), sizes.end()) == 0) sizes[0] = 5;
    const index_t maxw = *std::max_element(sizes.begin(), sizes.end());
    index_t total = 0;
    for (index_t w : sizes) total += w;
    const flops_cost cost{static_cast<index_t>(8 + g.below(256))};
    // uncapped first: a cap just below its G (when one fits) forces a different plan
    plan free;
    REQUIRE(make_plan(span<const index_t>(sizes), planner_options{}, cost, free) == status::success);
    const index_t cap = trial % 3 == 0 && free.group_size > maxw
                            ? free.group_size - 1
                            : maxw + static_cast<index_t>(g.below(static_cast<std::uint64_t>(total - maxw + 3)));
    INFO("trial " << trial << " cap " << cap << " free G " << free.group_size);
    // the optimum under the cap: the least, over G <= cap, of fast at that G (exact for <= 16 windows)
    double want = 1e300;
    for (index_t G = maxw; G <= std::min(cap, total); ++G) {
      planner_options fixed;
      fixed.group_size = G;
      plan q;
      REQUIRE(make_plan(span<const index_t>(sizes), fixed, cost, q) == status::success);
      want = std::min(want, q.cost);
    }
    for (strategy st : {strategy::fast, strategy::paper}) {
      planner_options o;
      o.strat = st;
      o.max_group_size = cap;
      plan p;
      REQUIRE(make_plan(span<const index_t>(sizes), o, cost, p) == status::success);
      CHECK(validate_plan(span<const index_t>(sizes), p) == status::success);
      CHECK(p.group_size <= cap);
      CHECK(p.cost >= free.cost * (1 - 1e-12));  // fewer choices never cost less (free is exact here)
      CHECK(p.cost >= p.lower_bound);
      CHECK(p.lower_bound <= want * (1 + 1e-12));  // a bound on every plan under the cap
      if (st == strategy::fast) {
        CHECK(p.cost == doctest::Approx(want).epsilon(1e-12));
        CHECK(p.lower_bound == doctest::Approx(want).epsilon(1e-12));
      }
      if (cap >= total) {  // the cap does not bind: the same plan as without it
        plan unc;
        planner_options o2;
        o2.strat = st;
        REQUIRE(make_plan(span<const index_t>(sizes), o2, cost, unc) == status::success);
        CHECK(p.group_size == unc.group_size);
        CHECK(p.windows == unc.windows);
        CHECK(p.lower_bound == unc.lower_bound);
      }
    }
  }
}

TEST_CASE("max_group_size on many windows (histogram path, per-sample batches): within the cap") {
  rng g(22);
  int binding = 0;
  for (int trial = 0; trial < 40; ++trial) {
    // 14x14 windows of a per-sample batch: hundreds of windows, one full (196 tokens)
    auto sizes = random_sizes(g, 300 + static_cast<int>(g.below(700)), 60 + static_cast<int>(g.below(137)), 0.2);
    sizes[0] = 196;
    const flops_cost cost{128};
    plan p, free;
    REQUIRE(make_plan(span<const index_t>(sizes), planner_options{}, cost, free) == status::success);
    // a cap below the free plan's G where one fits (it then binds), else the largest window
    const index_t cap = free.group_size > 196
                            ? 196 + static_cast<index_t>(g.below(static_cast<std::uint64_t>(free.group_size - 196)))
                            : 196;
    binding += free.group_size > cap;
    planner_options o;
    o.max_group_size = cap;
    REQUIRE(make_plan(span<const index_t>(sizes), o, cost, p) == status::success);
    CHECK(validate_plan(span<const index_t>(sizes), p) == status::success);
    CHECK(p.group_size <= cap);
    CHECK(p.cost >= p.lower_bound);
    CHECK(p.cost >= free.lower_bound * (1 - 1e-12));  // the free bound holds for every plan
  }
  CHECK(binding >= 10);  // the cap was below the free choice often enough to mean something
}

TEST_CASE("fast on Swin-B stages: never costlier than paper; exact on stages 2-3") {
  for (bool shifted : {false, true}) {
    for (int stage = 0; stage < 3; ++stage) {
      const index_t C = find_model("swin-b")->channels[stage];
      for (const auto& sizes : swin_stage_sizes(stage, 12, 11, shifted)) {
        plan f, p;
        planner_options o;
        REQUIRE(make_plan(span<const index_t>(sizes), o, flops_cost{C}, f) == status::success);
        o.strat = strategy::paper;
        REQUIRE(make_plan(span<const index_t>(sizes), o, flops_cost{C}, p) == status::success);
        CHECK(f.cost <= p.cost);
        CHECK(validate_plan(span<const index_t>(sizes), f) == status::success);
        if (stage == 2) CHECK(f.cost == doctest::Approx(brute_optimum(sizes, flops_cost{C})));
      }
    }
  }
}

TEST_CASE("fixed group size: capped at sum w, and near the optimal group count on perfect instances") {
  rng g(6);
  // Perfect instances: k groups of exactly G cut into random pieces; optimum = k groups.
  double total_k = 0, total_found = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const index_t G = static_cast<index_t>(20 + g.below(60));
    const int k = 1 + static_cast<int>(g.below(20));
    std::vector<index_t> sizes;
    for (int b = 0; b < k; ++b) {
      index_t left = G;
      while (left > 0) {
        index_t piece = static_cast<index_t>(1 + g.below(static_cast<std::uint64_t>(std::min<index_t>(left, G))));
        sizes.push_back(piece);
        left -= piece;
      }
    }
    for (size_t i = sizes.size(); i > 1; --i) std::swap(sizes[i - 1], sizes[g.below(i)]);
    plan p;
    planner_options o;
    o.group_size = G;
    REQUIRE(make_plan(span<const index_t>(sizes), o, flops_cost{128}, p) == status::success);
    CHECK(p.group_size == G);
    CHECK(validate_plan(span<const index_t>(sizes), p) == status::success);
    CHECK(p.num_groups() >= k);
    total_k += k;
    total_found += p.num_groups();
  }
  MESSAGE("perfect instances: optimal groups " << total_k << ", fast found " << total_found);
  CHECK(total_found <= 1.01 * total_k);

  const std::vector<index_t> small = {3, 4, 5};
  plan p;
  planner_options o;
  o.group_size = 49;  // the paper's p x p row, capped at sum w = 12
  REQUIRE(make_plan(span<const index_t>(small), o, flops_cost{128}, p) == status::success);
  CHECK(p.group_size == 12);
  CHECK(p.num_groups() == 1);
  o.strat = strategy::paper;
  REQUIRE(make_plan(span<const index_t>(small), o, flops_cost{128}, p) == status::success);
  CHECK(p.group_size == 12);
}

TEST_CASE("zero-size windows are in no group and keep the others' order") {
  const std::vector<index_t> sizes = {12, 30, 0, 7, 0, 0, 49};
  for (strategy s : {strategy::fast, strategy::paper, strategy::per_window, strategy::single}) {
    plan p;
    planner_options o;
    o.strat = s;
    REQUIRE(make_plan(span<const index_t>(sizes), o, flops_cost{128}, p) == status::success);
    for (index_t w : p.windows) CHECK(sizes[w] > 0);
    CHECK(p.windows.size() == 4);
  }
}

TEST_CASE("bad input is refused with a status and leaves the plan untouched") {
  plan p;
  p.group_size = 1234;
  auto expect = [&](std::vector<index_t> sizes, planner_options o, status want) {
    CHECK(make_plan(span<const index_t>(sizes), o, flops_cost{128}, p) == want);
    CHECK(p.group_size == 1234);
  };
  planner_options o;
  expect({}, o, status::empty_input);
  expect({0, 0, 0}, o, status::empty_input);
  expect({3, -1, 4}, o, status::invalid_argument);
  expect({3, 1 << 21}, o, status::overflow);
  planner_options fixed;
  fixed.group_size = 10;
  expect({3, 11, 4}, fixed, status::size_exceeds_group);
  fixed.strat = strategy::paper;
  expect({3, 11, 4}, fixed, status::size_exceeds_group);
  fixed.strat = strategy::per_window;
  expect({3, 4}, fixed, status::invalid_argument);
  planner_options neg;
  neg.group_size = -5;
  expect({3, 4}, neg, status::invalid_argument);
  // max_group_size: below the largest window, negative, with another strategy, below a fixed G
  planner_options capped;
  capped.max_group_size = 10;
  expect({3, 11, 4}, capped, status::size_exceeds_group);
  capped.strat = strategy::paper;
  expect({3, 11, 4}, capped, status::size_exceeds_group);
  capped.strat = strategy::single;
  expect({3, 4}, capped, status::invalid_argument);
  capped.strat = strategy::fast;
  capped.max_group_size = -1;
  expect({3, 4}, capped, status::invalid_argument);
  capped.max_group_size = 8;
  capped.group_size = 9;
  expect({3, 4}, capped, status::invalid_argument);
  // A sweep that would take hours is refused instead of hanging.
  planner_options paper;
  paper.strat = strategy::paper;
  expect(std::vector<index_t>(20000, 1000), paper, status::invalid_argument);
}

TEST_CASE("validate_plan catches broken plans") {
  const std::vector<index_t> sizes = {5, 6, 0, 7};
  plan p;
  REQUIRE(make_plan(span<const index_t>(sizes), planner_options{}, flops_cost{32}, p) == status::success);
  REQUIRE(validate_plan(span<const index_t>(sizes), p) == status::success);
  plan dup = p;
  dup.windows[0] = dup.windows.size() > 1 ? dup.windows[1] : 2;
  CHECK(validate_plan(span<const index_t>(sizes), dup) != status::success);
  plan big = p;
  big.group_size = 1;
  CHECK(validate_plan(span<const index_t>(sizes), big) == status::size_exceeds_group);
  plan oob = p;
  oob.windows[0] = 17;
  CHECK(validate_plan(span<const index_t>(sizes), oob) == status::out_of_range);
  plan empty_w = p;
  empty_w.windows[0] = 2;  // the zero-size window
  CHECK(validate_plan(span<const index_t>(sizes), empty_w) != status::success);
}

TEST_CASE("a reused planner gives the same plans as one-shot planning") {
  rng g(8);
  planner<flops_cost> reused(flops_cost{128});
  for (int trial = 0; trial < 50; ++trial) {
    auto sizes = random_sizes(g, 1 + static_cast<int>(g.below(64)), 49, 0.3);
    if (*std::max_element(sizes.begin(), sizes.end()) == 0) sizes[0] = 1;
    if (trial % 10 == 3) {  // a huge window in between: scratch grows, then must shrink back
      const std::vector<index_t> huge = {1 << 20, 5, 0, 7};
      plan h;
      REQUIRE(reused.run(span<const index_t>(huge), planner_options{}, h) == status::success);
      CHECK(validate_plan(span<const index_t>(huge), h) == status::success);
    }
    plan a, b;
    REQUIRE(reused.run(span<const index_t>(sizes), planner_options{}, a) == status::success);
    REQUIRE(make_plan(span<const index_t>(sizes), planner_options{}, flops_cost{128}, b) == status::success);
    CHECK(a.windows == b.windows);
    CHECK(a.cost == b.cost);
  }
}

namespace {
// Plans three batches of `batch` samples, every sample its own mask (the second batch with shifted
// windows), checks each plan, and returns sum(cost) / sum(bound) - 1. `min_g`: least G expected.
double per_sample_gap(const char* model, int batch, std::uint64_t seed, index_t min_g) {
  const model_shape& m = *find_model(model);
  mask_config cfg;
  planner<flops_cost> pl(flops_cost{m.channels[0]});
  double cost = 0, bound = 0;
  for (int r = 0; r < 3; ++r) {
    std::vector<index_t> all;
    for (int b = 0; b < batch; ++b) {
      const auto um = random_mask(cfg, seed + static_cast<std::uint64_t>(r), static_cast<std::uint64_t>(b));
      std::vector<index_t> coords;
      REQUIRE(visible_coords(span<const std::uint8_t>(um), cfg.grid(), m.grid(0), coords) == status::success);
      const auto s = window_sizes(m.geometry(0, r == 1), span<const index_t>(coords));
      all.insert(all.end(), s.begin(), s.end());
    }
    plan p;
    REQUIRE(pl.run(span<const index_t>(all), planner_options{}, p) == status::success);
    CHECK(validate_plan(span<const index_t>(all), p) == status::success);
    CHECK(p.group_size >= min_g);
    CHECK(p.cost >= p.lower_bound);
    cost += p.cost;
    bound += p.lower_bound;
  }
  return (cost - bound) / bound;
}
}  // namespace

TEST_CASE("per-sample batches: valid plans within 0.2% of the lower bound on Swin-B stage 1") {
  const double gap = per_sample_gap("swin-b", 96, 100, 1);
  MESSAGE("per-sample gap " << 100 * gap << "%");
  CHECK(gap <= 0.002);
}

TEST_CASE("the histogram path (large inputs) gives valid plans on any input, multi-word G included") {
  // paper_dp_max_windows = 0 sends every input down the path large batches take: counting
  // packers during the sweep, groups formed once at the end.
  rng g(12);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + static_cast<int>(g.below(trial < 200 ? 60 : 600));
    const int maxv = 1 + static_cast<int>(g.below(trial % 3 == 0 ? 300 : 60));  // G up to a few words
    auto sizes = random_sizes(g, n, maxv, 0.3);
    if (*std::max_element(sizes.begin(), sizes.end()) == 0) sizes[g.below(sizes.size())] = 1;
    const flops_cost cost{static_cast<index_t>(16 + g.below(512))};
    planner_options lazy;
    lazy.paper_dp_max_windows = 0;
    lazy.exact_max_windows = 0;
    plan p;
    REQUIRE(make_plan(span<const index_t>(sizes), lazy, cost, p) == status::success);
    REQUIRE(validate_plan(span<const index_t>(sizes), p) == status::success);
    CHECK(p.cost == cost(p.group_size, p.num_groups()));
    CHECK(p.cost >= p.lower_bound);
    // a fixed G takes the same path
    planner_options fixed = lazy;
    fixed.group_size = p.group_size + static_cast<index_t>(g.below(100));
    plan q;
    REQUIRE(make_plan(span<const index_t>(sizes), fixed, cost, q) == status::success);
    REQUIRE(validate_plan(span<const index_t>(sizes), q) == status::success);
    CHECK(q.cost >= p.cost);  // p is the best over all G, this G included
  }
}

TEST_CASE("histogram path: near the optimal group count on large perfect instances") {
  rng g(13);
  double total_k = 0, total_found = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const index_t G = static_cast<index_t>(20 + g.below(200));  // up to 4 words per reachability row
    const int k = 100 + static_cast<int>(g.below(400));
    std::vector<index_t> sizes;
    for (int b = 0; b < k; ++b) {
      index_t left = G;
      while (left > 0) {
        const index_t piece = static_cast<index_t>(1 + g.below(static_cast<std::uint64_t>(std::min<index_t>(left, 49))));
        sizes.push_back(piece);
        left -= piece;
      }
    }
    for (size_t i = sizes.size(); i > 1; --i) std::swap(sizes[i - 1], sizes[g.below(i)]);
    REQUIRE(sizes.size() > 256);  // the histogram path
    plan p;
    planner_options o;
    o.group_size = G;
    REQUIRE(make_plan(span<const index_t>(sizes), o, flops_cost{128}, p) == status::success);
    REQUIRE(validate_plan(span<const index_t>(sizes), p) == status::success);
    CHECK(p.group_size == G);
    CHECK(p.num_groups() >= k);
    total_k += k;
    total_found += p.num_groups();
  }
  MESSAGE("large perfect instances: optimal groups " << total_k << ", found " << total_found);
  CHECK(total_found <= 1.002 * total_k);
}

TEST_CASE("per-sample batches with 14x14 windows (G > 64): valid, close to the bound") {
  const double gap = per_sample_gap("swin-b-w14", 64, 200, 64);
  MESSAGE("per-sample w14 gap " << 100 * gap << "%");
  CHECK(gap <= 0.01);
}

namespace {
// The FLOPs model without `per_group`: the planner must list every range of large G eagerly.
struct opaque_flops {
  flops_cost inner;
  double operator()(index_t g, index_t n) const { return inner(g, n); }
};
struct opaque_slots {  // padded slots: one group of all windows (G = S) is optimal, ties abound
  double operator()(index_t g, index_t n) const { return slots_cost{}(g, n); }
};
}  // namespace

TEST_CASE("ranges of large G listed on demand give the same plans and bounds as listed eagerly") {
  static_assert(detail::has_per_group<flops_cost>::value && detail::has_per_group<slots_cost>::value, "");
  static_assert(!detail::has_per_group<opaque_flops>::value, "");
  rng g(14);
  for (int trial = 0; trial < 400; ++trial) {
    // few windows of mixed sizes, or many small ones (S / max w large: thousands of ranges)
    const bool many = trial % 4 == 0;
    const int n = many ? 300 + static_cast<int>(g.below(3000)) : 1 + static_cast<int>(g.below(40));
    auto sizes = random_sizes(g, n, 1 + static_cast<int>(g.below(many ? 12 : 80)), 0.3);
    if (*std::max_element(sizes.begin(), sizes.end()) == 0) sizes[0] = 1;
    const index_t C = static_cast<index_t>(1 + g.below(trial % 3 == 0 ? 8 : 512));  // small C: large G can win
    for (strategy st : {strategy::fast, strategy::paper, strategy::per_window}) {
      if (st == strategy::paper && many) continue;
      planner_options o;
      o.strat = st;
      plan a, b;
      REQUIRE(make_plan(span<const index_t>(sizes), o, flops_cost{C}, a) == status::success);
      REQUIRE(make_plan(span<const index_t>(sizes), o, opaque_flops{flops_cost{C}}, b) == status::success);
      CHECK(a.group_size == b.group_size);
      CHECK(a.cost == b.cost);
      CHECK(a.lower_bound == b.lower_bound);
      CHECK(a.windows == b.windows);
      plan c, d;
      REQUIRE(make_plan(span<const index_t>(sizes), o, slots_cost{}, c) == status::success);
      REQUIRE(make_plan(span<const index_t>(sizes), o, opaque_slots{}, d) == status::success);
      CHECK(c.group_size == d.group_size);
      CHECK(c.cost == d.cost);
      CHECK(c.lower_bound == d.lower_bound);
      CHECK(c.windows == d.windows);
    }
  }
}

TEST_CASE("the bounded search for fewer groups never makes a plan costlier, and its proofs hold") {
  rng g(15);
  int improved = 0;
  for (int trial = 0; trial < 150; ++trial) {
    const int n = 17 + static_cast<int>(g.below(100));  // above the exact-search size
    auto sizes = random_sizes(g, n, 1 + static_cast<int>(g.below(49)), 0.2);
    if (*std::max_element(sizes.begin(), sizes.end()) == 0) sizes[0] = 3;
    const flops_cost cost{static_cast<index_t>(16 + g.below(256))};
    planner_options off;
    off.search_budget = 0;
    plan with, without, paper;
    REQUIRE(make_plan(span<const index_t>(sizes), planner_options{}, cost, with) == status::success);
    REQUIRE(make_plan(span<const index_t>(sizes), off, cost, without) == status::success);
    planner_options po;
    po.strat = strategy::paper;
    REQUIRE(make_plan(span<const index_t>(sizes), po, cost, paper) == status::success);
    CHECK(validate_plan(span<const index_t>(sizes), with) == status::success);
    CHECK(with.cost <= without.cost);
    CHECK(with.lower_bound <= std::min(without.cost, paper.cost) * (1 + 1e-12));  // a bound on every plan
    CHECK(without.lower_bound <= with.cost * (1 + 1e-12));
    improved += with.cost < without.cost;
  }
  MESSAGE("the search found a cheaper plan in " << improved << " of 150 cases");
}

TEST_CASE("group-count bounds (L2, Fekete-Schepers) never exceed the exact minimum (brute force)") {
  rng g(16);
  int tight = 0, total = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<index_t> w = random_sizes(g, 1 + static_cast<int>(g.below(9)), 1 + static_cast<int>(g.below(60)));
    const index_t mx = *std::max_element(w.begin(), w.end());
    planner<flops_cost> pl(flops_cost{64});
    plan p;
    REQUIRE(pl.run(span<const index_t>(w), planner_options{}, p) == status::success);
    for (index_t cap = mx; cap <= mx + 40; ++cap) {
      // exact minimum number of groups of capacity cap, by enumerating set partitions
      int best = static_cast<int>(w.size());
      std::vector<std::int64_t> fills;
      std::function<void(size_t)> rec = [&](size_t i) {
        if (static_cast<int>(fills.size()) >= best) return;
        if (i == w.size()) { best = static_cast<int>(fills.size()); return; }
        for (size_t b = 0; b < fills.size(); ++b)  // by index: the recursion may grow `fills`
          if (fills[b] + w[i] <= cap) { fills[b] += w[i]; rec(i + 1); fills[b] -= w[i]; }
        fills.push_back(w[i]);
        rec(i + 1);
        fills.pop_back();
      };
      rec(0);
      const index_t b = pl.group_count_bound(cap);
      CHECK(b <= best);
      tight += b == best;
      ++total;
    }
  }
  MESSAGE("bound equals the exact minimum in " << tight << " of " << total << " cases");
}

TEST_CASE("work budget: huge sizes end with a valid plan whose bound still holds") {
  // Sizes in the tens of thousands to millions make every DP bitset thousands of words and the
  // sweep range wide; the budget bounds the work and the plan reports it ran out.
  std::mt19937 gen(0x9e3779b9u ^ doctest::getContextOptions()->rand_seed);
  for (int rep = 0; rep < 24; ++rep) {
    std::vector<index_t> sizes;
    const int n = rep % 2 ? 40 : 300;  // the full-DP path (<= 256 windows) and the histogram path
    // window-like sizes (a sweep cut after a few G), large, huge
    const index_t hi = rep < 20 ? 49 : rep < 22 ? 5000 : 200000;
    for (int i = 0; i < n; ++i) sizes.push_back(1 + static_cast<index_t>(gen() % static_cast<unsigned>(hi)));
    INFO("rep " << rep << " n " << n << " max " << hi);
    plan q;  // without a limit, where that is quick
    const bool small = hi <= 5000;  // (a plan of window-like sizes never needs the budget)
    if (small) {
      planner_options unlimited;
      unlimited.work_budget = 0;
      REQUIRE(make_plan(span<const index_t>(sizes), unlimited, 128, q) == status::success);
      CHECK_FALSE(q.budget_exhausted);
    }
    for (std::int64_t budget : {std::int64_t{1} << 10, std::int64_t{1} << 12, std::int64_t{1} << 13,
                                std::int64_t{1} << 16, std::int64_t{1} << 20}) {
      INFO("budget " << budget);
      planner_options tight;
      tight.work_budget = budget;
      plan p;
      REQUIRE(make_plan(span<const index_t>(sizes), tight, 128, p) == status::success);
      CHECK(validate_plan(span<const index_t>(sizes), p) == status::success);
      if (budget <= (std::int64_t{1} << 12) && hi > 49) CHECK(p.budget_exhausted);  // < one best-fit pass
      CHECK(p.cost >= p.lower_bound);
      if (small) {  // each plan's bound holds for the other plan too
        CHECK(q.cost <= p.cost);
        CHECK(p.lower_bound <= q.cost * (1 + 1e-12));
        CHECK(q.lower_bound <= p.cost * (1 + 1e-12));
      }
    }
  }
}

TEST_CASE("work budget: the default never binds on real window sizes, and 0 means no limit") {
  std::mt19937 gen(7);
  for (int rep = 0; rep < 20; ++rep) {
    std::vector<index_t> sizes;
    const int n = 1 + static_cast<int>(gen() % 600);
    for (int i = 0; i < n; ++i) sizes.push_back(static_cast<index_t>(gen() % 197));  // window 14: up to 196
    plan a, b;
    planner_options unlimited;
    unlimited.work_budget = 0;
    REQUIRE(make_plan(span<const index_t>(sizes), planner_options{}, 128, a) == status::success);
    REQUIRE(make_plan(span<const index_t>(sizes), unlimited, 128, b) == status::success);
    CHECK_FALSE(a.budget_exhausted);
    CHECK(a.group_size == b.group_size);
    CHECK(a.windows == b.windows);
    CHECK(a.cost == b.cost);
    CHECK(a.lower_bound == b.lower_bound);
  }
}
