// Benchmarks of the CPU reference of grouped window attention (reference/attention.hpp) on
// Swin-B stage 1-3 shapes: one random 75% mask (seed 0) shared by a batch of 4, unshifted
// windows, the fast plan. Counter `FLOP/s`: the paper's cost model (cost_model.hpp,
// n_g * (4*G*C^2 + 2*G^2*C) per image, projections included although the reference runs only the
// attention core) over the measured time; the backward is counted as twice the forward.
// Counter `attn_FLOP/s`: the FLOPs the reference really does (QK^T and PV: 4*G^2*C per group
// forward, 2.5x that backward). The `all_tokens` variants run the same code over every token of the grid (the
// SimMIM baseline: every window full, one window per group, G = p^2).
#if defined(GREENMIM_HAVE_REFERENCE)

#include <benchmark/benchmark.h>

#include <greenmim/cost_model.hpp>
#include <greenmim/random_masks.hpp>
#include <greenmim/models.hpp>
#include <greenmim/partition.hpp>
#include <greenmim/planner.hpp>
#include <greenmim/reference/attention.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace {

namespace gm = greenmim;
namespace ref = greenmim::reference;
using gm::index_t;

constexpr index_t kBatch = 4;

// One stage's problem, built once and cached.
struct stage_problem {
  index_t B = kBatch, N = 0, H = 0, D = 0, p = 0, C = 0;
  gm::partition_indices part;
  double cost = 0;  // cost model of the plan, whole batch
  double attn = 0;  // FLOPs the reference's forward really does: QK^T and PV, 4*G^2*C per group
  std::vector<float> qkv, out, lse, dout, dqkv, bias, dbias;
  ref::attention_args<float> fwd;
  ref::attention_backward_args<float> bwd;
  std::string label;
};

std::unique_ptr<stage_problem> build(int stage, bool all_tokens) {
  const gm::model_shape& m = *gm::find_model("swin-b");
  auto sp = std::make_unique<stage_problem>();
  stage_problem& P = *sp;
  const gm::window_geometry g = m.geometry(stage, false);
  gm::mask_config cfg{m.image_size, m.patch_size << 3, all_tokens ? 0.0 : 0.75};
  const std::vector<std::uint8_t> mask = gm::random_mask(cfg, 0);
  std::vector<index_t> coords;
  gm::check(gm::visible_coords(gm::span<const std::uint8_t>(mask), cfg.grid(), m.grid(stage), coords));
  gm::window_list wl;
  gm::check(gm::build_windows(g, gm::span<const index_t>(coords), wl));
  const std::vector<index_t> sizes = wl.sizes();
  gm::planner_options opt;
  opt.strat = all_tokens ? gm::strategy::per_window : gm::strategy::fast;
  gm::plan pl;
  P.C = m.channels[stage];
  gm::check(gm::make_plan(gm::span<const index_t>(sizes), opt, gm::flops_cost{P.C}, pl));
  gm::check(gm::build_partition(pl, wl, P.part));
  P.N = wl.num_tokens;
  P.H = m.heads[stage];
  P.D = m.head_dim;
  P.p = g.window;
  P.cost = static_cast<double>(P.B) * pl.cost;
  P.attn = static_cast<double>(P.B) * pl.num_groups() * 4.0 * pl.group_size * pl.group_size * P.C;
  P.label = "N=" + std::to_string(P.N) + " G=" + std::to_string(pl.group_size) + " groups=" + std::to_string(pl.num_groups());

  gm::rng r(1, static_cast<std::uint64_t>(stage));
  const std::int64_t rows = static_cast<std::int64_t>(P.B) * P.N * P.H, R = (2 * P.p - 1) * (2 * P.p - 1);
  auto fill = [&](std::vector<float>& x, std::int64_t n) {
    x.resize(static_cast<size_t>(n));
    for (auto& e : x) e = static_cast<float>(2.0 * r.uniform() - 1.0);
  };
  fill(P.qkv, 3 * rows * P.D);
  fill(P.dout, rows * P.D);
  fill(P.bias, R * P.H);
  P.out.assign(static_cast<size_t>(rows * P.D), 0.f);
  P.lse.assign(static_cast<size_t>(rows), 0.f);
  P.dqkv.assign(P.qkv.size(), 0.f);
  P.dbias.assign(P.bias.size(), 0.f);

  ref::attention_args<float>& a = P.fwd;
  gm::check(ref::split_qkv(gm::make_view(static_cast<const float*>(P.qkv.data()), P.B, P.N, 3, P.H, P.D), a.q, a.k, a.v));
  a.part = gm::make_partition_view(P.part);
  a.bias = gm::make_view(static_cast<const float*>(P.bias.data()), R, P.H);
  a.window = P.p;
  a.out = gm::make_view(P.out.data(), P.B, P.N, P.H, P.D);
  a.lse = gm::make_view(P.lse.data(), P.B, P.N, P.H);
  gm::check(ref::group_attention_forward(a));

  ref::attention_backward_args<float>& b = P.bwd;
  b.q = a.q;
  b.k = a.k;
  b.v = a.v;
  b.o = gm::make_view(static_cast<const float*>(P.out.data()), P.B, P.N, P.H, P.D);
  b.dout = gm::make_view(static_cast<const float*>(P.dout.data()), P.B, P.N, P.H, P.D);
  b.lse = gm::make_view(static_cast<const float*>(P.lse.data()), P.B, P.N, P.H);
  b.part = a.part;
  b.bias = a.bias;
  b.window = a.window;
  gm::check(ref::split_qkv(gm::make_view(P.dqkv.data(), P.B, P.N, 3, P.H, P.D), b.dq, b.dk, b.dv));
  b.dbias = gm::make_view(P.dbias.data(), R, P.H);
  return sp;
}

stage_problem& problem(int stage, bool all_tokens) {
  static std::unique_ptr<stage_problem> cache[2][3];
  auto& slot = cache[all_tokens ? 1 : 0][stage];
  if (!slot) slot = build(stage, all_tokens);
  return *slot;
}

void run_forward(benchmark::State& state, int stage, bool all_tokens) {
  stage_problem& P = problem(stage, all_tokens);
  for (auto _ : state) {
    if (ref::group_attention_forward(P.fwd) != gm::status::success) state.SkipWithError("forward failed");
    benchmark::DoNotOptimize(P.out.data());
    benchmark::ClobberMemory();
  }
  const double it = static_cast<double>(state.iterations());
  state.counters["FLOP/s"] = benchmark::Counter(P.cost * it, benchmark::Counter::kIsRate);
  state.counters["attn_FLOP/s"] = benchmark::Counter(P.attn * it, benchmark::Counter::kIsRate);
  state.SetLabel(P.label);
}

void run_backward(benchmark::State& state, int stage, bool all_tokens) {
  stage_problem& P = problem(stage, all_tokens);
  for (auto _ : state) {
    if (ref::group_attention_backward(P.bwd) != gm::status::success) state.SkipWithError("backward failed");
    benchmark::DoNotOptimize(P.dqkv.data());
    benchmark::ClobberMemory();
  }
  const double it = static_cast<double>(state.iterations());
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * P.cost * it, benchmark::Counter::kIsRate);
  // the backward recomputes QK^T and does dout V^T, P^T dout, dS K, dS^T q: 2.5x the forward
  state.counters["attn_FLOP/s"] = benchmark::Counter(2.5 * P.attn * it, benchmark::Counter::kIsRate);
  state.SetLabel(P.label);
}

void BM_reference_forward(benchmark::State& state, int stage) { run_forward(state, stage, false); }
void BM_reference_backward(benchmark::State& state, int stage) { run_backward(state, stage, false); }
void BM_reference_all_tokens_forward(benchmark::State& state, int stage) { run_forward(state, stage, true); }
void BM_reference_all_tokens_backward(benchmark::State& state, int stage) { run_backward(state, stage, true); }

}  // namespace

BENCHMARK_CAPTURE(BM_reference_forward, stage1, 0)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_reference_forward, stage2, 1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_reference_forward, stage3, 2)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_reference_backward, stage1, 0)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_reference_backward, stage2, 1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_reference_backward, stage3, 2)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_reference_all_tokens_forward, stage1, 0)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_reference_all_tokens_forward, stage2, 1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_reference_all_tokens_forward, stage3, 2)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_reference_all_tokens_backward, stage1, 0)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_reference_all_tokens_backward, stage2, 1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_reference_all_tokens_backward, stage3, 2)->Unit(benchmark::kMillisecond);

#endif  // GREENMIM_HAVE_REFERENCE
