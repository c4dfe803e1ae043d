// The one-call encoder plans: every stage of Swin-B at 224 px (encoder_plan.hpp: both shifts,
// merges, positions, per-sample offsets) and of Twins-L (twins_plan.hpp: LSA partitions, PEG
// neighbour tables, GSA key and patch-embedding block tables, padded per-sample layouts), for one
// shared mask and for per-sample batches of 8, 32 and 128, mask ratio 0.75, masks cycling through a
// fixed set. `prepare` plans and lays out; `write` fills the caller's arena (the PyTorch package
// writes straight into a torch tensor). Counters: arena entries, and images per second.
#include <benchmark/benchmark.h>

#include <greenmim/encoder_plan.hpp>
#include <greenmim/random_masks.hpp>
#include <greenmim/twins_plan.hpp>

#include <vector>

using namespace greenmim;

namespace {

std::vector<std::vector<std::uint8_t>> unit_masks(index_t batch, int count) {
  mask_config cfg;  // 7 x 7 units, ratio 0.75
  std::vector<std::vector<std::uint8_t>> out;
  for (int i = 0; i < count; ++i) {
    std::vector<std::uint8_t> m;
    for (index_t b = 0; b < batch; ++b) {
      const std::vector<std::uint8_t> one = random_mask(cfg, static_cast<std::uint64_t>(i), static_cast<std::uint64_t>(b));
      m.insert(m.end(), one.begin(), one.end());
    }
    out.push_back(std::move(m));
  }
  return out;
}

//! prepare + write of `Planner` (encoder_planner, twins_planner) for geometry `geo`; range(0) is
//! 0 for one shared mask, B > 0 for a per-sample batch of B.
template <class Planner, class Layout, class Geometry>
void plan_loop(benchmark::State& st, const Geometry& geo) {
  const index_t batch = static_cast<index_t>(st.range(0));
  const bool per_sample = batch > 0;
  const index_t M = per_sample ? batch : 1;
  const auto masks = unit_masks(M, 8);
  Planner planner;
  Layout layout;
  std::vector<index_t> arena;
  size_t i = 0;
  for (auto _ : st) {
    const auto& m = masks[i++ % masks.size()];
    if (planner.prepare(span<const std::uint8_t>(m), M, 7, 7, per_sample, geo, {}, layout) != status::success) {
      st.SkipWithError("prepare failed");
      break;
    }
    if (arena.size() < static_cast<size_t>(planner.arena_size())) arena.resize(static_cast<size_t>(planner.arena_size()));
    planner.write(arena.data());
    benchmark::DoNotOptimize(arena.data());
  }
  st.counters["arena_entries"] = static_cast<double>(planner.arena_size());
  st.counters["images/s"] = benchmark::Counter(static_cast<double>(M) * st.iterations(), benchmark::Counter::kIsRate);
}

void BM_encoder_plan(benchmark::State& st) {
  plan_loop<encoder_planner, encoder_plan>(st, encoder_geometry{56, 7, 4, 128});  // Swin-B at 224 px
}

void BM_twins_plan(benchmark::State& st) {
  plan_loop<twins_planner, twins_plan>(st, twins_geometry{});  // Twins-L at 224 px
}

}  // namespace

// 0: one shared mask; B > 0: a per-sample batch of B
BENCHMARK(BM_twins_plan)->ArgName("per_sample_batch")->Arg(0)->Arg(8)->Arg(32)->Arg(128)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_encoder_plan)->ArgName("per_sample_batch")->Arg(0)->Arg(8)->Arg(32)->Arg(128)->Unit(benchmark::kMicrosecond);
