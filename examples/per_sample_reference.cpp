// Example: per-sample masks end to end on the CPU reference (greenmim::reference, Eigen).
//
// Each sample of the batch draws its own mask, so samples keep different tokens and their
// windows hold different numbers of them. Instead of planning sample by sample, the windows of
// the whole batch go into ONE plan (groups may mix samples); the token axis is the batch's
// visible tokens concatenated (cu_seqlens style, batch extent 1). Grouped window attention
// forward then runs on that layout and is checked against the window-by-window oracle, which
// never groups or pads anything. Stage 1 of Swin-B: 56x56 tokens, windows of 7x7, 4 heads of 32.
//
//   build/bin/example_per_sample_reference [batch]     (default 8)
#include <greenmim/greenmim.hpp>
#include <greenmim/reference/attention.hpp>
#include <greenmim/reference/oracle.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

using namespace greenmim;
namespace ref = greenmim::reference;

int main(int argc, char** argv) {
  const index_t B = argc > 1 ? std::atoi(argv[1]) : 8;
  if (B < 1) return 2;
  const model_shape& swin = *find_model("swin-b");
  const index_t grid = swin.grid(0), p = swin.window, heads = swin.heads[0], D = swin.head_dim;
  mask_config cfg;  // 224 px, 32 px units, ratio 0.75
  rng r(2024, 0);   // the library's small PCG: inputs for q, k, v and the bias table

  // 1. Per-sample masks -> a keep mask [B, 56, 56] -> the batch's visible tokens, concatenated.
  std::vector<std::uint8_t> keep(static_cast<size_t>(B) * grid * grid);
  const index_t u = grid / cfg.grid();  // tokens per mask unit side (8)
  for (index_t b = 0; b < B; ++b) {
    const std::vector<std::uint8_t> units = random_mask(cfg, /*seed=*/7, /*stream=sample*/ static_cast<std::uint64_t>(b));
    for (index_t h = 0; h < grid; ++h)
      for (index_t w = 0; w < grid; ++w)
        keep[static_cast<size_t>((b * grid + h) * grid + w)] = units[static_cast<size_t>((h / u) * cfg.grid() + w / u)];
  }
  std::vector<index_t> cu_seqlens, coords;  // [B+1] token offsets per sample, packed (h, w) per token
  check(keep_mask_coords(span<const std::uint8_t>(keep), B, grid, grid, cu_seqlens, coords));
  const index_t N = static_cast<index_t>(coords.size());

  double worst_err = 0;
  int failures = 0;
  for (int shifted = 0; shifted < 2; ++shifted) {
    const window_geometry geom = swin.geometry(0, shifted != 0);

    // 2. Windows of every sample: window b * 64 + id holds sample b's tokens in window id.
    window_list windows;
    check(build_windows_per_sample(geom, span<const index_t>(cu_seqlens), span<const index_t>(coords), windows));
    const std::vector<index_t> sizes = windows.sizes();

    // 3. One plan over the whole batch's windows, and for comparison one plan per sample.
    planner<flops_cost> pl(flops_cost{swin.channels[0]});
    plan batch_plan;
    check(pl.run(span<const index_t>(sizes), planner_options{}, batch_plan));
    double per_sample_cost = 0;
    index_t per_sample_groups = 0;
    const index_t wps = geom.num_windows();
    for (index_t b = 0; b < B; ++b) {
      plan one;
      const span<const index_t> mine(sizes.data() + static_cast<size_t>(b) * wps, wps);
      if (pl.run(mine, planner_options{}, one) != status::success) continue;  // a sample with nothing visible
      per_sample_cost += one.cost;
      per_sample_groups += one.num_groups();
    }
    std::printf("%s windows: %d samples, %d visible tokens, %d windows\n", shifted ? "shifted" : "plain  ", B, N,
                static_cast<index_t>(sizes.size()));
    std::printf("  packed across the batch: G = %d, %d groups, %.1f MFLOPs (%.2f%% above its lower bound)\n",
                batch_plan.group_size, batch_plan.num_groups(), batch_plan.cost / 1e6, 100 * batch_plan.gap());
    std::printf("  each sample on its own : %d groups in all, %.1f MFLOPs\n", per_sample_groups, per_sample_cost / 1e6);

    // 4. Partition indices over the flattened token axis.
    partition_indices part;
    check(build_partition(batch_plan, windows, part));

    // 5. Attention inputs: q, k, v [1, N, heads, D] (batch extent 1: the samples are on the token
    //    axis) and a relative-position bias table [(2p-1)^2, heads].
    const size_t elems = static_cast<size_t>(N) * heads * D;
    std::vector<float> q(elems), k(elems), v(elems), bias(static_cast<size_t>((2 * p - 1) * (2 * p - 1) * heads));
    for (auto* x : {&q, &k, &v, &bias})
      for (float& e : *x) e = static_cast<float>(2 * r.uniform() - 1);
    std::vector<float> out(elems), want(elems), lse(static_cast<size_t>(N) * heads), want_lse(lse.size());

    ref::attention_args<float> a;  // grouped: what a kernel computes
    a.q = make_view(static_cast<const float*>(q.data()), 1, N, heads, D);
    a.k = make_view(static_cast<const float*>(k.data()), 1, N, heads, D);
    a.v = make_view(static_cast<const float*>(v.data()), 1, N, heads, D);
    a.part = make_partition_view(part);
    a.bias = make_view(static_cast<const float*>(bias.data()), (2 * p - 1) * (2 * p - 1), heads);
    a.window = p;
    a.out = make_view(out.data(), 1, N, heads, D);
    a.lse = make_view(lse.data(), 1, N, heads);
    check(ref::group_attention_forward(a));

    // 6. The oracle: dense attention window by window from the token axis, no groups, no padding.
    std::vector<index_t> token_window(static_cast<size_t>(N));
    for (index_t w = 0; w < windows.num_windows(); ++w)
      for (index_t t : windows.window(w)) token_window[static_cast<size_t>(t)] = w;
    ref::oracle_args<float> o;
    o.q = a.q;
    o.k = a.k;
    o.v = a.v;
    o.token_window = span<const index_t>(token_window);
    o.token_coord = span<const index_t>(windows.coords);
    o.bias = a.bias;
    o.window = p;
    o.out = make_view(want.data(), 1, N, heads, D);
    o.lse = make_view(want_lse.data(), 1, N, heads);
    check(ref::window_attention_oracle(o));

    double err = 0;
    for (size_t i = 0; i < elems; ++i) err = std::max(err, static_cast<double>(std::fabs(out[i] - want[i])));
    for (size_t i = 0; i < lse.size(); ++i) err = std::max(err, static_cast<double>(std::fabs(lse[i] - want_lse[i])));
    std::printf("  grouped forward vs window-by-window oracle: max abs error %.2e (out and lse, float)\n", err);
    worst_err = std::max(worst_err, err);
    if (!(err < 1e-4)) ++failures;  // float accumulation: a real mismatch is O(1)
    if (validate_plan(span<const index_t>(sizes), batch_plan) != status::success) ++failures;
  }
  if (failures) {
    std::printf("per_sample_reference: FAILED (max error %.2e)\n", worst_err);
    return 1;
  }
  std::printf("per_sample_reference: grouped attention matches the oracle (max error %.2e)\n", worst_err);
  return 0;
}
