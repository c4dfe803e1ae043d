// libFuzzer target: the planner's public API (make_plan, planner::run, validate_plan) over every
// strategy and option with arbitrary size lists. Invariants checked on every input:
//  - no exception crosses the API: a status comes back;
//  - on success the plan is valid (validate_plan), its cost is the cost model's value of
//    (G, groups), cost >= lower bound, and per_window / single have their defined G;
//  - on failure the output plan is left exactly as it was;
//  - a reused planner returns the same plan as a fresh one (scratch reuse is invisible);
//  - every plan costs at least every run's lower bound (a bound on ANY plan of these sizes);
//  - fast (sweep) <= paper (sweep), and at a fixed G fast <= paper, where the paper runs and
//    fast's DP covers the windows (<= paper_dp_max_windows) within its work budget;
//  - at a fixed G no plan (fast, paper, per_window, single) is cheaper than the sweep's plan, and
//    the paper's fixed-G plan is never cheaper than the paper's sweep;
//  - the work budget ends the run: budgets are drawn so that every input finishes well inside
//    libFuzzer's -timeout (a run that does not stop is reported as a timeout);
//  - max_group_size (caps derived from the sizes: below the largest window, at it, just below
//    the sweep's G): a cap below the largest window or with another strategy is refused; a
//    capped plan keeps G <= cap and costs at least every uncapped bound; fast <= paper under the
//    same cap where the paper runs and fast's DP covers the windows.
#include <greenmim/greenmim.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <vector>

#include "fuzz_util.hpp"

using namespace greenmim;

namespace {

struct outcome {
  bool ok = false;
  plan p;
};

bool same_plan(const plan& a, const plan& b) {
  return a.strat == b.strat && a.group_size == b.group_size && a.group_offsets == b.group_offsets &&
         a.windows == b.windows && a.fills == b.fills && a.cost == b.cost && a.lower_bound == b.lower_bound &&
         a.budget_exhausted == b.budget_exhausted;
}

plan sentinel_plan() {
  plan s;
  s.strat = strategy::single;
  s.group_size = 12345;
  s.group_offsets = {0, 1};
  s.windows = {77};
  s.fills = {5};
  s.cost = 42.5;
  s.lower_bound = 41.5;
  s.budget_exhausted = true;
  return s;
}

template <class Cost>
outcome run_one(planner<Cost>& reused, const Cost& cost, const std::vector<index_t>& sizes,
                const planner_options& opt) {
  const span<const index_t> sz(sizes);
  outcome r;
  plan fresh = sentinel_plan(), again = sentinel_plan();
  status s1 = status::success, s2 = status::success;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    s1 = make_plan(sz, opt, cost, fresh);
    s2 = reused.run(sz, opt, again);
  } catch (const std::exception& e) {
    GM_FUZZ_CHECK(false, "exception across the planner API: %s", e.what());
  } catch (...) {
    GM_FUZZ_CHECK(false, "exception across the planner API");
  }
  if (std::getenv("GM_FUZZ_VERBOSE")) {  // replaying one input: what ran and how long it took
    std::int64_t total = 0;
    index_t maxw = 0;
    for (index_t w : sizes) total += w > 0 ? w : 0, maxw = std::max(maxw, w);
    std::fprintf(stderr, "%-10s G %-8d n %-4zu max %-8d sum %-10lld work %-11lld search %-6lld exact %-3d dp %-4d table %d: %-18s %.3f s\n",
                 strategy_name(opt.strat), opt.group_size, sizes.size(), maxw, static_cast<long long>(total),
                 static_cast<long long>(opt.work_budget), static_cast<long long>(opt.search_budget), opt.exact_max_windows,
                 opt.paper_dp_max_windows, opt.table_dp, status_string(s1),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  GM_FUZZ_CHECK(s1 == s2, "fresh %d vs reused planner %d", static_cast<int>(s1), static_cast<int>(s2));
  GM_FUZZ_CHECK(static_cast<int>(s1) >= 0 && static_cast<int>(s1) <= static_cast<int>(status::workspace_too_small),
                "status %d", static_cast<int>(s1));
  if (s1 != status::success) {
    GM_FUZZ_CHECK(same_plan(fresh, sentinel_plan()) && same_plan(again, sentinel_plan()),
                  "a refusal (%s) changed the output plan", status_string(s1));
    return r;
  }
  GM_FUZZ_CHECK(same_plan(fresh, again), "reused planner differs from a fresh one");
  const plan& p = fresh;
  GM_FUZZ_CHECK(validate_plan(sz, p) == status::success, "invalid plan: %s (strategy %s)",
                status_string(validate_plan(sz, p)), strategy_name(opt.strat));
  GM_FUZZ_CHECK(p.strat == opt.strat, "strategy");
  GM_FUZZ_CHECK(p.cost == cost(p.group_size, p.num_groups()), "cost %.17g != model %.17g", p.cost,
                cost(p.group_size, p.num_groups()));
  GM_FUZZ_CHECK(p.cost >= p.lower_bound * (1 - 1e-12), "cost %.17g < lower bound %.17g", p.cost, p.lower_bound);
  GM_FUZZ_CHECK(p.lower_bound > 0, "lower bound %.17g", p.lower_bound);
  std::int64_t total = 0;
  index_t maxw = 0, nonzero = 0;
  for (index_t w : sizes) {
    total += w;
    maxw = std::max(maxw, w);
    nonzero += w > 0;
  }
  if (opt.strat == strategy::per_window)
    GM_FUZZ_CHECK(p.group_size == maxw && p.num_groups() == nonzero, "per_window G %d groups %d", p.group_size,
                  p.num_groups());
  if (opt.strat == strategy::single)
    GM_FUZZ_CHECK(p.group_size == total && p.num_groups() == 1, "single G %d groups %d", p.group_size, p.num_groups());
  if (opt.group_size > 0)
    GM_FUZZ_CHECK(p.group_size == std::min<std::int64_t>(opt.group_size, total), "fixed G %d -> %d", opt.group_size,
                  p.group_size);
  r.ok = true;
  r.p = p;
  return r;
}

template <class Cost>
void fuzz_with(FuzzedDataProvider& in, const Cost& cost) {
  static planner<Cost> reused;  // kept across inputs: its scratch must never leak into a result
  reused = planner<Cost>(cost);

  planner_options base;
  base.table_dp = in.ConsumeBool();
  base.exact_max_windows = in.ConsumeIntegralInRange<index_t>(-2, 24);
  base.paper_dp_max_windows = in.ConsumeIntegralInRange<index_t>(-2, 600);
  base.search_budget = in.ConsumeIntegralInRange<std::int64_t>(-1, 50000);
  const int budget_kind = in.ConsumeIntegralInRange<int>(0, 3);
  index_t fixed_g = in.ConsumeBool() ? gm_fuzz::size_like(in, 256) : 0;
  const int bad_strategy = in.ConsumeIntegralInRange<int>(0, 15);
  const bool huge_ok = in.ConsumeIntegralInRange<int>(0, 255) == 0;

  std::vector<index_t> sizes;
  const int shape = in.ConsumeIntegralInRange<int>(0, 3);
  while (in.remaining_bytes() > 0 && sizes.size() < 400) {
    if (shape == 0) sizes.push_back(in.ConsumeIntegralInRange<index_t>(0, 49));  // real windows
    else if (shape == 1) sizes.push_back(in.ConsumeIntegralInRange<index_t>(0, 300));
    else sizes.push_back(gm_fuzz::size_like(in, 64));
  }
  // Sizes in (2^14, 2^20] are valid but cost O(max w) per call: up to seconds each under the
  // coverage instrumentation. One input in 256 keeps them (and plans them once); the others
  // scale them down (the unit tests cover huge sizes with work budgets).
  if (!huge_ok)
    for (index_t& w : sizes)
      if (w > (1 << 14) && w <= max_window_size) w >>= 7;
  std::int64_t total = 0;
  index_t maxw = 0, nonzero = 0;
  bool negative = false;
  for (index_t w : sizes) {
    negative |= w < 0;
    if (w > 0) total += w, nonzero++;
    maxw = std::max(maxw, w);
  }
  // Work budget: unlimited only for small sizes (where a sweep is quick), else up to ~4 ms.
  switch (budget_kind) {
    case 0: base.work_budget = in.ConsumeIntegralInRange<std::int64_t>(1, 1 << 12); break;
    case 1: base.work_budget = in.ConsumeIntegralInRange<std::int64_t>(1, 1 << 22); break;
    case 2: base.work_budget = total <= 20000 ? planner_options{}.work_budget : (1 << 22); break;
    default: base.work_budget = maxw <= 256 && sizes.size() <= 300 ? 0 : (1 << 20); break;
  }

  std::vector<outcome> results;
  std::vector<planner_options> opts;
  auto go = [&](strategy s, index_t g) {
    planner_options o = base;
    o.strat = s;
    o.group_size = g;
    results.push_back(run_one(reused, cost, sizes, o));
    opts.push_back(o);
    return results.size() - 1;
  };
  // The paper's sweep has no work budget of its own: run it only when it is quick (its own guard
  // refuses sweeps above 4e10 word operations, i.e. tens of seconds).
  const double sweep = static_cast<double>(total - maxw + 1) * nonzero *
                       (base.table_dp ? static_cast<double>(total) : total / 64.0 + 1.0);
  const bool paper_quick = sweep < 3e5 && static_cast<double>(total - maxw + 1) * total < 3e6;
  const bool paper_fixed_quick = static_cast<double>(nonzero) * nonzero *
                                     (base.table_dp ? std::max<double>(fixed_g, 1) : fixed_g / 64.0 + 1) < 3e6;

  const size_t fast_sweep = go(strategy::fast, 0);
  if (maxw > (1 << 14)) return;  // valid and checked above, but up to seconds per call
  const size_t per_window = go(strategy::per_window, 0);
  const size_t single = go(strategy::single, 0);
  size_t paper_sweep = SIZE_MAX, fast_fixed = SIZE_MAX, paper_fixed = SIZE_MAX;
  if (paper_quick) paper_sweep = go(strategy::paper, 0);
  if (fixed_g != 0) {
    fast_fixed = go(strategy::fast, fixed_g);
    if (paper_fixed_quick || fixed_g < 0) paper_fixed = go(strategy::paper, fixed_g);
    go(strategy::per_window, fixed_g);  // refused: G applies to fast and paper only
    GM_FUZZ_CHECK(!results.back().ok, "per_window accepted a group size");
  }
  {  // an out-of-range strategy value is refused, not undefined behaviour
    planner_options o = base;
    o.strat = static_cast<strategy>(4 + bad_strategy);
    results.push_back(run_one(reused, cost, sizes, o));
    opts.push_back(o);
    GM_FUZZ_CHECK(!results.back().ok, "strategy %d accepted", 4 + bad_strategy);
  }

  // Expected refusals.
  const bool valid_sizes = !sizes.empty() && !negative && nonzero > 0 && maxw <= max_window_size && total <= max_total_size;
  GM_FUZZ_CHECK(results[per_window].ok == valid_sizes, "per_window ok=%d, sizes valid=%d", results[per_window].ok,
                valid_sizes);
  GM_FUZZ_CHECK(results[single].ok == valid_sizes, "single ok=%d", results[single].ok);
  GM_FUZZ_CHECK(results[fast_sweep].ok == valid_sizes, "fast ok=%d", results[fast_sweep].ok);
  if (paper_sweep != SIZE_MAX) GM_FUZZ_CHECK(results[paper_sweep].ok == valid_sizes, "paper ok");
  if (fast_fixed != SIZE_MAX)
    GM_FUZZ_CHECK(results[fast_fixed].ok == (valid_sizes && fixed_g >= maxw), "fast G=%d ok=%d", fixed_g,
                  results[fast_fixed].ok);
  if (!valid_sizes) return;

  // Every plan costs at least every lower bound.
  double lb = 0;
  for (const auto& r : results)
    if (r.ok) lb = std::max(lb, r.p.lower_bound);
  for (size_t i = 0; i < results.size(); ++i)
    if (results[i].ok)
      GM_FUZZ_CHECK(results[i].p.cost >= lb * (1 - 1e-12), "plan %zu (%s, G option %d) costs %.17g < a bound %.17g", i,
                    strategy_name(opts[i].strat), opts[i].group_size, results[i].p.cost, lb);

  const plan& fs = results[fast_sweep].p;
  const bool dp_covers = nonzero <= base.paper_dp_max_windows;
  if (!fs.budget_exhausted) {
    // the paper's plans only where fast's packers include the paper's DP (as documented)
    for (size_t i = 0; i < results.size(); ++i)
      if (results[i].ok && (opts[i].strat != strategy::paper || dp_covers))
        GM_FUZZ_CHECK(results[i].p.cost >= fs.cost * (1 - 1e-12), "plan %zu (%s, G option %d) costs %.17g < the sweep's %.17g",
                      i, strategy_name(opts[i].strat), opts[i].group_size, results[i].p.cost, fs.cost);
    if (paper_sweep != SIZE_MAX && dp_covers)
      GM_FUZZ_CHECK(fs.cost <= results[paper_sweep].p.cost * (1 + 1e-12), "fast %.17g > paper %.17g", fs.cost,
                    results[paper_sweep].p.cost);
  }
  if (paper_sweep != SIZE_MAX && paper_fixed != SIZE_MAX && results[paper_fixed].ok)
    GM_FUZZ_CHECK(results[paper_fixed].p.cost >= results[paper_sweep].p.cost, "paper at G=%d %.17g < paper sweep %.17g",
                  fixed_g, results[paper_fixed].p.cost, results[paper_sweep].p.cost);
  if (fast_fixed != SIZE_MAX && paper_fixed != SIZE_MAX && results[fast_fixed].ok && results[paper_fixed].ok &&
      !results[fast_fixed].p.budget_exhausted && dp_covers)
    GM_FUZZ_CHECK(results[fast_fixed].p.cost <= results[paper_fixed].p.cost, "fast at G=%d %.17g > paper %.17g",
                  fixed_g, results[fast_fixed].p.cost, results[paper_fixed].p.cost);

  // max_group_size. Capped plans are kept out of `results`: their bounds hold only under the cap.
  auto capped = [&](strategy s, index_t cap) {
    planner_options o = base;
    o.strat = s;
    o.max_group_size = cap;
    return run_one(reused, cost, sizes, o);
  };
  if (maxw > 1) GM_FUZZ_CHECK(!capped(strategy::fast, maxw - 1).ok, "a cap below the largest window accepted");
  GM_FUZZ_CHECK(!capped(strategy::single, maxw).ok, "single accepted a cap");
  std::vector<index_t> caps{maxw};
  if (fs.group_size > maxw) caps.push_back(fs.group_size - 1);  // binds: the sweep's own G is out
  for (index_t cap : caps) {
    const outcome f = capped(strategy::fast, cap);
    GM_FUZZ_CHECK(f.ok, "fast refused the cap %d (largest window %d)", cap, maxw);
    GM_FUZZ_CHECK(f.p.group_size <= cap, "fast under cap %d chose G %d", cap, f.p.group_size);
    GM_FUZZ_CHECK(f.p.cost >= lb * (1 - 1e-12), "capped plan costs %.17g < an uncapped bound %.17g", f.p.cost, lb);
    if (!paper_quick) continue;
    const outcome p = capped(strategy::paper, cap);
    GM_FUZZ_CHECK(p.ok && p.p.group_size <= cap, "paper under cap %d", cap);
    GM_FUZZ_CHECK(p.p.cost >= results[paper_sweep].p.cost, "paper capped %.17g < paper free %.17g", p.p.cost,
                  results[paper_sweep].p.cost);
    if (!f.p.budget_exhausted && dp_covers)
      GM_FUZZ_CHECK(f.p.cost <= p.p.cost * (1 + 1e-12), "fast %.17g > paper %.17g under cap %d", f.p.cost, p.p.cost, cap);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const int model = in.ConsumeIntegralInRange<int>(0, 3);
  if (model == 0) fuzz_with(in, slots_cost{});
  else fuzz_with(in, flops_cost{in.ConsumeIntegralInRange<index_t>(1, 1024)});
  return 0;
}
