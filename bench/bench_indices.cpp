// Index building and host gather/scatter on Swin-B stages 1-3 (224 px, mask ratio 0.75, fixed
// seeds): window lists, partition indices (plan from make_plan with G = 49), dense mask and
// relative-position index, patch-merging indices, the per-sample flat layout, and the host
// reference of partition/unpartition of features (bytes/s).
#include <benchmark/benchmark.h>

#include <greenmim/attention_mask.hpp>
#include <greenmim/random_masks.hpp>
#include <greenmim/merging.hpp>
#include <greenmim/models.hpp>
#include <greenmim/partition.hpp>
#include <greenmim/planner.hpp>

#include <memory>
#include <string>
#include <vector>

using namespace greenmim;

namespace {

constexpr int kMasks = 8;  // the benchmarks cycle through this many masks
constexpr index_t kBatch = 8;

//! One stage of one mask: coordinates, window list, plan, partition.
struct stage_case {
  std::vector<index_t> coords;
  window_list list;
  plan pl;
  partition_indices pi;
};

std::vector<stage_case> make_cases(int stage, bool shifted) {
  const model_shape& m = *find_model("swin-b");
  mask_config cfg;
  planner_options opt;
  opt.group_size = m.window * m.window;  // G = 49, as the paper suggests
  std::vector<stage_case> out(kMasks);
  for (int i = 0; i < kMasks; ++i) {
    stage_case& c = out[i];
    const auto um = random_mask(cfg, 2022, static_cast<std::uint64_t>(i));
    check(visible_coords(span<const std::uint8_t>(um), cfg.grid(), m.grid(stage), c.coords));
    check(build_windows(m.geometry(stage, shifted), span<const index_t>(c.coords), c.list), "build_windows");
    const auto sizes = c.list.sizes();
    check(make_plan(span<const index_t>(sizes), opt, m.channels[stage], c.pl), "make_plan");
    check(build_partition(c.pl, c.list, c.pi), "build_partition");
  }
  return out;
}

void set_common(benchmark::State& state, const std::vector<stage_case>& cases) {
  state.counters["tokens"] = static_cast<double>(cases[0].list.num_tokens);
  state.counters["groups"] = static_cast<double>(cases[0].pi.num_groups);
  state.counters["G"] = static_cast<double>(cases[0].pi.group_size);
}

void bm_build_windows(benchmark::State& state, const std::vector<stage_case>& cases, window_geometry g) {
  window_list l;
  size_t i = 0;
  std::int64_t items = 0;
  for (auto _ : state) {
    const auto& c = cases[i++ % cases.size()];
    if (build_windows(g, span<const index_t>(c.coords), l) != status::success) {
      state.SkipWithError("build_windows failed");
      break;
    }
    items += l.num_tokens;
    benchmark::DoNotOptimize(l.tokens.data());
  }
  state.SetItemsProcessed(items);
  set_common(state, cases);
}

void bm_build_partition(benchmark::State& state, const std::vector<stage_case>& cases) {
  partition_indices pi;
  size_t i = 0;
  std::int64_t items = 0;
  for (auto _ : state) {
    const auto& c = cases[i++ % cases.size()];
    if (build_partition(c.pl, c.list, pi) != status::success) {
      state.SkipWithError("build_partition failed");
      break;
    }
    items += pi.num_slots();
    benchmark::DoNotOptimize(pi.gather.data());
  }
  state.SetItemsProcessed(items);  // slots per second
  set_common(state, cases);
}

void bm_mask(benchmark::State& state, const std::vector<stage_case>& cases) {
  const auto& pi = cases[0].pi;
  std::vector<float> m(static_cast<size_t>(pi.num_groups) * pi.group_size * pi.group_size);
  for (auto _ : state) {
    if (build_attention_mask<float>(pi, make_view(m.data(), pi.num_groups, pi.group_size, pi.group_size)) !=
        status::success) {
      state.SkipWithError("mask failed");
      break;
    }
    benchmark::DoNotOptimize(m.data());
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(m.size()));  // pairs per second
  set_common(state, cases);
}

void bm_rel_pos(benchmark::State& state, const std::vector<stage_case>& cases) {
  const auto& pi = cases[0].pi;
  const index_t p = cases[0].list.geometry.window;
  std::vector<index_t> idx(static_cast<size_t>(pi.num_groups) * pi.group_size * pi.group_size);
  for (auto _ : state) {
    if (build_rel_pos_index(pi, p, make_view(idx.data(), pi.num_groups, pi.group_size, pi.group_size)) !=
        status::success) {
      state.SkipWithError("rel_pos failed");
      break;
    }
    benchmark::DoNotOptimize(idx.data());
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(idx.size()));
  set_common(state, cases);
}

//! Host partition (forward = true) or unpartition of `[kBatch, N, C]` float features.
void bm_tokens(benchmark::State& state, const std::vector<stage_case>& cases, index_t C, bool forward) {
  const auto& pi = cases[0].pi;
  const index_t N = pi.num_tokens, S = pi.num_slots();
  std::vector<float> x(static_cast<size_t>(kBatch) * N * C, 1.f), y(static_cast<size_t>(kBatch) * S * C, 0.f);
  for (auto _ : state) {
    const status s =
        forward ? partition_tokens<float>(pi, make_view(x.data(), kBatch, N, C), make_view(y.data(), kBatch, S, C))
                : unpartition_tokens<float>(pi, make_view(y.data(), kBatch, S, C), make_view(x.data(), kBatch, N, C));
    if (s != status::success) {
      state.SkipWithError("gather/scatter failed");
      break;
    }
    benchmark::ClobberMemory();
  }
  // bytes moved: real rows read + written, plus padding rows written by the forward
  const std::int64_t rows = forward ? static_cast<std::int64_t>(N) * 2 + (S - N) : static_cast<std::int64_t>(N) * 2;
  state.SetBytesProcessed(state.iterations() * kBatch * rows * C * static_cast<std::int64_t>(sizeof(float)));
  state.SetItemsProcessed(state.iterations() * kBatch * static_cast<std::int64_t>(N));
  set_common(state, cases);
}

void bm_merge(benchmark::State& state, const std::vector<stage_case>& cases, index_t grid) {
  std::vector<index_t> g4, next;
  size_t i = 0;
  std::int64_t items = 0;
  for (auto _ : state) {
    const auto& c = cases[i++ % cases.size()];
    if (merge_indices(grid, grid, span<const index_t>(c.coords), g4, next) != status::success) {
      state.SkipWithError("merge failed");
      break;
    }
    items += static_cast<std::int64_t>(c.coords.size());
    benchmark::DoNotOptimize(g4.data());
  }
  state.SetItemsProcessed(items);
  set_common(state, cases);
}

//! Per-sample flat layout: `batch` samples, each with its own mask, windows + plan + partition.
void bm_per_sample(benchmark::State& state, int stage, index_t batch) {
  const model_shape& m = *find_model("swin-b");
  const window_geometry g = m.geometry(stage, false);
  mask_config cfg;
  std::vector<index_t> cu{0}, coords;
  for (index_t b = 0; b < batch; ++b) {
    const auto um = random_mask(cfg, 7, static_cast<std::uint64_t>(b));
    std::vector<index_t> c;
    check(visible_coords(span<const std::uint8_t>(um), cfg.grid(), m.grid(stage), c));
    coords.insert(coords.end(), c.begin(), c.end());
    cu.push_back(static_cast<index_t>(coords.size()));
  }
  window_list l;
  check(build_windows_per_sample(g, span<const index_t>(cu), span<const index_t>(coords), l));
  planner_options opt;
  opt.group_size = m.window * m.window;
  plan pl;
  const auto sizes = l.sizes();
  check(make_plan(span<const index_t>(sizes), opt, m.channels[stage], pl), "make_plan");
  partition_indices pi;
  for (auto _ : state) {
    if (build_windows_per_sample(g, span<const index_t>(cu), span<const index_t>(coords), l) != status::success ||
        build_partition(pl, l, pi) != status::success) {
      state.SkipWithError("per-sample build failed");
      break;
    }
    benchmark::DoNotOptimize(pi.gather.data());
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(coords.size()));
  state.counters["tokens"] = static_cast<double>(coords.size());
  state.counters["groups"] = static_cast<double>(pi.num_groups);
}

const int kRegistered = [] {
  const model_shape& m = *find_model("swin-b");
  for (int stage = 0; stage < 3; ++stage)
    for (bool shifted : {false, true}) {
      const std::string name = "/stage" + std::to_string(stage + 1) + (shifted ? "_shifted" : "");
      auto cases = std::make_shared<std::vector<stage_case>>(make_cases(stage, shifted));
      const window_geometry g = m.geometry(stage, shifted);
      const index_t C = m.channels[stage];
      benchmark::RegisterBenchmark(("BM_build_windows" + name).c_str(),
                                   [=](benchmark::State& s) { bm_build_windows(s, *cases, g); })
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("BM_build_partition" + name).c_str(),
                                   [=](benchmark::State& s) { bm_build_partition(s, *cases); })
          ->Unit(benchmark::kMicrosecond);
      if (shifted) continue;  // the rest does not depend on the shift
      benchmark::RegisterBenchmark(("BM_attention_mask" + name).c_str(), [=](benchmark::State& s) { bm_mask(s, *cases); })
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("BM_rel_pos_index" + name).c_str(), [=](benchmark::State& s) { bm_rel_pos(s, *cases); })
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("BM_partition_tokens" + name + "_b8").c_str(),
                                   [=](benchmark::State& s) { bm_tokens(s, *cases, C, true); })
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("BM_unpartition_tokens" + name + "_b8").c_str(),
                                   [=](benchmark::State& s) { bm_tokens(s, *cases, C, false); })
          ->Unit(benchmark::kMicrosecond);
      const index_t grid = m.grid(stage);
      benchmark::RegisterBenchmark(("BM_merge_indices" + name).c_str(),
                                   [=](benchmark::State& s) { bm_merge(s, *cases, grid); })
          ->Unit(benchmark::kMicrosecond);
    }
  benchmark::RegisterBenchmark("BM_build_partition_per_sample/stage1_b64",
                               [](benchmark::State& s) { bm_per_sample(s, 0, 64); })
      ->Unit(benchmark::kMicrosecond);
  return 0;
}();

}  // namespace
