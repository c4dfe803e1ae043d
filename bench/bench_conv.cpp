// Index tables of convolutions on visible tokens (sparse_conv.hpp) at Twins-L shapes, 224 px,
// mask ratio 0.75, 32 px mask units, fixed seeds: the 3x3 submanifold neighbour table of PEG and
// the kernel = stride block tables of GSA sub-sampling (sr 8/4/2) and patch embedding (s = 2).
// Shared mask (batch 1: the same table serves the whole batch) and a per-sample batch of 64
// (cu_seqlens). Items = visible input tokens.
#include <benchmark/benchmark.h>

#include <greenmim/masking.hpp>
#include <greenmim/sparse_conv.hpp>

#include <vector>

using namespace greenmim;

namespace {

constexpr int kMasks = 8;
const index_t kGrid[4] = {56, 28, 14, 7};
const index_t kSr[3] = {8, 4, 2};

struct conv_case {
  std::vector<index_t> coords, cu;
};

//! `batch` samples with their own masks (batch 1 = the shared mask), at stage `stage`.
std::vector<conv_case> make_cases(int stage, int batch) {
  mask_config cfg;
  std::vector<conv_case> out(kMasks);
  for (int i = 0; i < kMasks; ++i) {
    out[i].cu = {0};
    for (int b = 0; b < batch; ++b) {
      const auto um = random_mask(cfg, 2022, static_cast<std::uint64_t>(i * 1000 + b));
      std::vector<index_t> c;
      check(visible_coords(span<const std::uint8_t>(um), cfg.grid(), kGrid[stage], c));
      out[i].coords.insert(out[i].coords.end(), c.begin(), c.end());
      out[i].cu.push_back(static_cast<index_t>(out[i].coords.size()));
    }
  }
  return out;
}

void BM_neighbor_table(benchmark::State& state) {
  const int stage = static_cast<int>(state.range(0)), batch = static_cast<int>(state.range(1));
  const auto cases = make_cases(stage, batch);
  neighbor_table t;
  size_t i = 0;
  std::int64_t items = 0;
  for (auto _ : state) {
    const conv_case& c = cases[i++ % kMasks];
    const status s = batch == 1
                         ? build_neighbor_table(kGrid[stage], kGrid[stage], 3, span<const index_t>(c.coords), t)
                         : build_neighbor_table_per_sample(kGrid[stage], kGrid[stage], 3, span<const index_t>(c.cu),
                                                           span<const index_t>(c.coords), t);
    if (s != status::success) state.SkipWithError(status_string(s));
    benchmark::DoNotOptimize(t.nbr.data());
    items += static_cast<std::int64_t>(c.coords.size());
  }
  state.SetItemsProcessed(items);
  state.counters["tokens"] = static_cast<double>(cases[0].coords.size());
}

void BM_block_table(benchmark::State& state) {
  const int stage = static_cast<int>(state.range(0)), batch = static_cast<int>(state.range(1));
  const index_t s = static_cast<index_t>(state.range(2));
  const auto cases = make_cases(stage, batch);
  block_table t;
  size_t i = 0;
  std::int64_t items = 0;
  for (auto _ : state) {
    const conv_case& c = cases[i++ % kMasks];
    const status st = batch == 1
                          ? build_block_table(kGrid[stage], kGrid[stage], s, span<const index_t>(c.coords), t)
                          : build_block_table_per_sample(kGrid[stage], kGrid[stage], s, span<const index_t>(c.cu),
                                                         span<const index_t>(c.coords), t);
    if (st != status::success) state.SkipWithError(status_string(st));
    benchmark::DoNotOptimize(t.gather.data());
    items += static_cast<std::int64_t>(c.coords.size());
  }
  state.SetItemsProcessed(items);
  state.counters["tokens"] = static_cast<double>(cases[0].coords.size());
  state.counters["outputs"] = static_cast<double>(t.num_outputs());
}

// args: stage (0-based), batch (1 = shared mask), [stride]
BENCHMARK(BM_neighbor_table)->ArgNames({"stage", "batch"})->Args({0, 1})->Args({1, 1})->Args({2, 1})->Args({0, 64});
BENCHMARK(BM_block_table)
    ->ArgNames({"stage", "batch", "s"})
    ->Args({0, 1, kSr[0]})
    ->Args({0, 1, 2})
    ->Args({1, 1, kSr[1]})
    ->Args({2, 1, kSr[2]})
    ->Args({0, 64, kSr[0]})
    ->Args({0, 64, 2});

}  // namespace
