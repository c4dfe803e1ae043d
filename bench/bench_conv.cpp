// Index tables of convolutions on visible tokens (sparse_conv.hpp) at Twins-L shapes, 224 px,
// mask ratio 0.75, 32 px mask units, fixed seeds: the 3x3 submanifold neighbour table of PEG and
// the kernel = stride block tables of GSA sub-sampling (sr 8/4/2) and patch embedding (s = 2).
// Shared mask (batch 1: the same table serves the whole batch) and a per-sample batch of 64
// (cu_seqlens). Items = visible input tokens.
#include <benchmark/benchmark.h>

#include <greenmim/random_masks.hpp>
#include <greenmim/sparse_conv.hpp>

#include <vector>

#if defined(GREENMIM_HAVE_REFERENCE)
#include <greenmim/reference/conv.hpp>

#include <random>
#endif

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

// ---- CPU reference ops (Eigen) at Twins-L stage-1 sizes: PEG (depthwise 3x3, C = 128) forward and
// backward, GSA sub-sampling (block conv sr = 8, 128 -> 128) forward; batch 8, shared mask.
// FLOP/s counts multiply-adds x 2 over the visible tokens.
#if defined(GREENMIM_HAVE_REFERENCE)
namespace {

struct ref_case {
  std::vector<index_t> coords;
  neighbor_table nbr;
  block_table blocks;
  std::vector<float> x, w, bias, dy, wb;
};

ref_case make_ref_case(index_t B, index_t C, index_t sr) {
  ref_case r;
  mask_config cfg;
  check(visible_coords(span<const std::uint8_t>(random_mask(cfg, 2022)), cfg.grid(), kGrid[0], r.coords));
  check(build_neighbor_table(kGrid[0], kGrid[0], 3, span<const index_t>(r.coords), r.nbr));
  check(build_block_table(kGrid[0], kGrid[0], sr, span<const index_t>(r.coords), r.blocks));
  std::mt19937 g(1);
  std::normal_distribution<float> d;
  auto fill = [&](std::vector<float>& v, size_t n) { v.resize(n); for (auto& e : v) e = d(g); };
  const size_t N = r.coords.size();
  fill(r.x, B * N * C);
  fill(r.dy, B * N * C);
  fill(r.w, static_cast<size_t>(C) * 9);
  fill(r.bias, C);
  fill(r.wb, static_cast<size_t>(C) * C * sr * sr);
  return r;
}

void BM_ref_depthwise_fwd(benchmark::State& state) {
  const index_t B = static_cast<index_t>(state.range(0)), C = static_cast<index_t>(state.range(1));
  ref_case r = make_ref_case(B, C, 8);
  const index_t N = r.nbr.num_tokens;
  std::vector<float> y(r.x.size());
  for (auto _ : state) {
    check(reference::depthwise_conv_forward<float>(span<const index_t>(r.nbr.nbr), 3, make_view(r.x.data(), B, N, C),
                                                   make_view(r.w.data(), C, 9), span<const float>(r.bias), true,
                                                   make_view(y.data(), B, N, C)));
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * 9 * B * N * C, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens"] = N;
}

void BM_ref_depthwise_bwd(benchmark::State& state) {
  const index_t B = static_cast<index_t>(state.range(0)), C = static_cast<index_t>(state.range(1));
  ref_case r = make_ref_case(B, C, 8);
  const index_t N = r.nbr.num_tokens;
  std::vector<float> dx(r.x.size()), dw(r.w.size()), db(C);
  for (auto _ : state) {
    check(reference::depthwise_conv_backward<float>(span<const index_t>(r.nbr.nbr), 3, make_view(r.x.data(), B, N, C),
                                                    make_view(r.w.data(), C, 9), make_view(r.dy.data(), B, N, C), true,
                                                    make_view(dx.data(), B, N, C), make_view(dw.data(), C, 9),
                                                    span<float>(db)));
    benchmark::DoNotOptimize(dx.data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * 2 * 9 * B * N * C, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_ref_block_conv_fwd(benchmark::State& state) {
  const index_t B = static_cast<index_t>(state.range(0)), C = static_cast<index_t>(state.range(1));
  const index_t sr = static_cast<index_t>(state.range(2));
  ref_case r = make_ref_case(B, C, sr);
  const index_t N = r.blocks.num_inputs, Nn = r.blocks.num_outputs();
  std::vector<float> y(static_cast<size_t>(B) * Nn * C);
  for (auto _ : state) {
    check(reference::block_conv_forward<float>(span<const index_t>(r.blocks.gather), sr, make_view(r.x.data(), B, N, C),
                                               make_view(r.wb.data(), C, C, sr, sr), span<const float>(r.bias),
                                               make_view(y.data(), B, Nn, C)));
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * B * N * C * C, benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_ref_depthwise_fwd)->ArgNames({"batch", "C"})->Args({8, 128})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ref_depthwise_bwd)->ArgNames({"batch", "C"})->Args({8, 128})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ref_block_conv_fwd)->ArgNames({"batch", "C", "sr"})->Args({8, 128, 8})->Args({8, 128, 2})->Unit(benchmark::kMicrosecond);

}  // namespace
#endif  // GREENMIM_HAVE_REFERENCE
