// Planner benchmarks: the literal appendix DP (full G sweep), the bitset paper-exact planner,
// and `fast`, on window-size vectors of simulated Swin-B masks (fixed seeds), one plan per
// iteration cycling through the vectors.
#include <benchmark/benchmark.h>

#include <greenmim/random_masks.hpp>
#include <greenmim/models.hpp>
#include <greenmim/planner.hpp>
#include <greenmim/windows.hpp>

#include <memory>
#include <string>
#include <vector>

using namespace greenmim;

namespace {

constexpr int kMasks = 16;

std::vector<std::vector<index_t>> stage_sizes(int stage, bool shifted) {
  const model_shape& m = *find_model("swin-b");
  mask_config cfg;
  std::vector<std::vector<index_t>> out;
  for (int i = 0; i < kMasks; ++i) {
    const auto um = random_mask(cfg, 2022, static_cast<std::uint64_t>(i));
    std::vector<index_t> coords;
    check(visible_coords(span<const std::uint8_t>(um), cfg.grid(), m.grid(stage), coords));
    out.push_back(window_sizes(m.geometry(stage, shifted), span<const index_t>(coords)));
  }
  return out;
}

//! Per-sample masks: every window of `batch` samples, each sample its own mask, one item list.
std::vector<std::vector<index_t>> batch_sizes(int stage, int batch, int rounds) {
  const model_shape& m = *find_model("swin-b");
  mask_config cfg;
  std::vector<std::vector<index_t>> out;
  for (int r = 0; r < rounds; ++r) {
    std::vector<index_t> all;
    for (int b = 0; b < batch; ++b) {
      const auto um = random_mask(cfg, 7 + r, static_cast<std::uint64_t>(b));
      std::vector<index_t> coords;
      check(visible_coords(span<const std::uint8_t>(um), cfg.grid(), m.grid(stage), coords));
      const auto s = window_sizes(m.geometry(stage, false), span<const index_t>(coords));
      all.insert(all.end(), s.begin(), s.end());
    }
    out.push_back(std::move(all));
  }
  return out;
}

void run_plans(benchmark::State& state, const std::vector<std::vector<index_t>>& inputs, planner_options opt,
               index_t channels) {
  planner<flops_cost> pl(flops_cost{channels});
  plan p;
  size_t i = 0;
  double cost = 0, bound = 0;
  for (auto _ : state) {
    const auto& s = inputs[i++ % inputs.size()];
    if (pl.run(span<const index_t>(s), opt, p) != status::success) {
      state.SkipWithError("plan failed");
      break;
    }
    cost += p.cost;
    bound += p.lower_bound;
    benchmark::DoNotOptimize(p.group_size);
  }
  state.counters["gap_pct"] = bound > 0 ? 100.0 * (cost - bound) / bound : 0.0;
  state.counters["windows"] = static_cast<double>(inputs[0].size());
}

const int kRegistered = [] {
  const model_shape& m = *find_model("swin-b");
  for (int stage = 0; stage < 3; ++stage) {
    const std::string suffix = "/swin_b_stage" + std::to_string(stage + 1);
    const index_t C = m.channels[stage];
    auto inputs = std::make_shared<std::vector<std::vector<index_t>>>(stage_sizes(stage, false));
    planner_options table;
    table.strat = strategy::paper;
    table.table_dp = true;
    planner_options bitset;
    bitset.strat = strategy::paper;
    planner_options fast;
    benchmark::RegisterBenchmark(("plan_paper_dp" + suffix).c_str(), [=](benchmark::State& s) { run_plans(s, *inputs, table, C); })
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("plan_paper" + suffix).c_str(), [=](benchmark::State& s) { run_plans(s, *inputs, bitset, C); })
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("plan_fast" + suffix).c_str(), [=](benchmark::State& s) { run_plans(s, *inputs, fast, C); })
        ->Unit(benchmark::kMicrosecond);
    auto shifted = std::make_shared<std::vector<std::vector<index_t>>>(stage_sizes(stage, true));
    benchmark::RegisterBenchmark(("plan_fast" + suffix + "_shifted").c_str(), [=](benchmark::State& s) { run_plans(s, *shifted, fast, C); })
        ->Unit(benchmark::kMicrosecond);
  }
  // Harder than Swin masks: 64 windows of uniform random sizes 1..49, at three search budgets
  // (docs/planner.md, item 3).
  auto rnd = std::make_shared<std::vector<std::vector<index_t>>>();
  {
    rng r(64);
    for (int i = 0; i < 20; ++i) {
      std::vector<index_t> v(64);
      for (auto& x : v) x = static_cast<index_t>(1 + r.below(49));
      rnd->push_back(std::move(v));
    }
  }
  for (std::int64_t budget : {std::int64_t{0}, std::int64_t{20000}, std::int64_t{100000}}) {
    planner_options o;
    o.search_budget = budget;
    benchmark::RegisterBenchmark(("plan_fast/random64_budget" + std::to_string(budget)).c_str(),
                                 [=](benchmark::State& s) { run_plans(s, *rnd, o, 128); })
        ->Unit(benchmark::kMicrosecond);
  }
  // Pathological sizes (not windows of any real model): 200 sizes uniform in 1..10^6. Every G
  // is a 15,000-word bitset and the sweep range is a million wide; planner_options::work_budget
  // (default 2^30) bounds the plan. Reports the gap it certifies when the budget runs out.
  auto huge = std::make_shared<std::vector<std::vector<index_t>>>();
  {
    rng r(1000000);
    std::vector<index_t> v(200);
    for (auto& x : v) x = static_cast<index_t>(1 + r.below(1000000));
    huge->push_back(std::move(v));
  }
  benchmark::RegisterBenchmark("plan_fast/huge_sizes_200", [=](benchmark::State& s) {
    run_plans(s, *huge, planner_options{}, 128);
  })->Unit(benchmark::kMillisecond)->Iterations(2);
  auto b256 = std::make_shared<std::vector<std::vector<index_t>>>(batch_sizes(0, 256, 32));
  benchmark::RegisterBenchmark("plan_fast/per_sample_b256", [=](benchmark::State& s) {
    run_plans(s, *b256, planner_options{}, m.channels[0]);
  })->Unit(benchmark::kMicrosecond);
  return 0;
}();

}  // namespace
