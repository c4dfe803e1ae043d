// `greenmim demo`: the project's main job end to end on the CPU. On one random masked batch with a
// model's stage 1-3 shapes, for both blocks of each stage (window shift 0 and p/2):
//   plan (make_plan, fast) -> partition indices (partition.hpp) -> grouped window attention
//   forward + backward in float (reference/attention.hpp) -> check against the window-by-window
//   oracle (double, same float inputs) -> time against the baseline the paper beats: SimMIM-style
//   window attention over ALL tokens (masked ones included: the full grid, every window full; the
//   shifted block as SimMIM's cyclic roll, i.e. the same full windows).
// Prints per stage the errors, both times, the speed-up and the attention FLOPs saved (the
// paper's cost model, cost_model.hpp). `--json` prints one JSON object and nothing else.
//
// This file: demo::run and what it calls; the flags and the command are demo.cpp (demo.hpp).
#include <greenmim/config.hpp>
#include <greenmim/cost_model.hpp>
#include <greenmim/random_masks.hpp>
#include <greenmim/kernel_limits.hpp>
#include <greenmim/models.hpp>
#include <greenmim/partition.hpp>
#include <greenmim/planner.hpp>
#include <greenmim/status.hpp>
#include <greenmim/view.hpp>
#include <greenmim/windows.hpp>
#include <greenmim/reference/attention.hpp>
#include <greenmim/reference/oracle.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include "cli_common.hpp"
#include "demo.hpp"
#include "model_flags.hpp"

namespace greenmim {
namespace demo {

//! One stage's results (both blocks added up; errors: the larger of the two blocks).
struct stage_result {
  int stage = 0;
  index_t grid = 0, window = 0, channels = 0, heads = 0, head_dim = 0;
  index_t tokens = 0, visible = 0;
  index_t groups[2] = {0, 0}, group_size[2] = {0, 0}, windows[2] = {0, 0};
  double err_fwd = 0, err_bwd = 0;
  double plan_ms = 0;
  double grouped_fwd_ms = 0, grouped_bwd_ms = 0, all_fwd_ms = 0, all_bwd_ms = 0;
  double flops_grouped = 0, flops_all = 0;  // cost model, per batch, both blocks
  double core_grouped = 0, core_all = 0;    // attention core the reference runs: 4*G^2*C per group
  std::string window_note, path_note, cuda;  // small-stage rule; which attention path can run it
};

using steady = std::chrono::steady_clock;
inline double ms_since(steady::time_point t0) {
  return std::chrono::duration<double, std::milli>(steady::now() - t0).count();
}

//! Windows + plan + partition of one block; returns the plan in `pl`.
inline void build_block(const window_geometry& g, const std::vector<index_t>& coords, strategy strat,
                        index_t channels, window_list& wl, plan& pl, partition_indices& part) {
  check(build_windows(g, span<const index_t>(coords), wl), "build_windows");
  const std::vector<index_t> sizes = wl.sizes();
  planner_options opt;
  opt.strat = strat;
  check(make_plan(span<const index_t>(sizes), opt, flops_cost{channels}, pl), "make_plan");
  check(build_partition(pl, wl, part), "build_partition");
}

//! Float tensors of one attention problem: packed qkv and dqkv [B, N, 3, H, D] (as a qkv
//! projection produces them), out and dout [B, N, H, D], lse [B, N, H], bias table and its grad.
struct float_problem {
  index_t B = 0, N = 0, H = 0, D = 0, p = 0;
  std::vector<float> qkv, out, lse, dout, dqkv, bias, dbias;

  float_problem(index_t b, index_t n, index_t h, index_t d, index_t window, rng& r)
      : B(b), N(n), H(h), D(d), p(window) {
    const std::int64_t rows = static_cast<std::int64_t>(B) * N * H;
    auto fill = [&](std::vector<float>& x, std::int64_t size, float amp) {
      x.resize(static_cast<size_t>(size));
      for (auto& e : x) e = static_cast<float>(amp * (2.0 * r.uniform() - 1.0));
    };
    fill(qkv, 3 * rows * D, 1.0f);
    fill(dout, rows * D, 1.0f);
    fill(bias, static_cast<std::int64_t>(2 * p - 1) * (2 * p - 1) * H, 0.5f);
    out.assign(static_cast<size_t>(rows * D), 0.f);
    lse.assign(static_cast<size_t>(rows), 0.f);
    dqkv.assign(qkv.size(), 0.f);
    dbias.assign(bias.size(), 0.f);
  }
  tensor_view<const float, 2> bias_view() const {
    return make_view(static_cast<const float*>(bias.data()), (2 * p - 1) * (2 * p - 1), H);
  }
  reference::attention_args<float> forward_args(const partition_indices& part) {
    reference::attention_args<float> a;
    check(reference::split_qkv(make_view(static_cast<const float*>(qkv.data()), B, N, 3, H, D), a.q, a.k, a.v));
    a.part = make_partition_view(part);
    a.bias = bias_view();
    a.window = p;
    a.out = make_view(out.data(), B, N, H, D);
    a.lse = make_view(lse.data(), B, N, H);
    return a;
  }
  reference::attention_backward_args<float> backward_args(const partition_indices& part) {
    reference::attention_backward_args<float> g;
    const reference::attention_args<float> a = forward_args(part);
    g.q = a.q;
    g.k = a.k;
    g.v = a.v;
    g.o = make_view(static_cast<const float*>(out.data()), B, N, H, D);
    g.dout = make_view(static_cast<const float*>(dout.data()), B, N, H, D);
    g.lse = make_view(static_cast<const float*>(lse.data()), B, N, H);
    g.part = a.part;
    g.bias = a.bias;
    g.window = p;
    check(reference::split_qkv(make_view(dqkv.data(), B, N, 3, H, D), g.dq, g.dk, g.dv));
    g.dbias = make_view(dbias.data(), (2 * p - 1) * (2 * p - 1), H);
    return g;
  }
};

//! ||a - b||_inf / ||b||_inf over a strided float view against a contiguous double array.
inline double rel_err(const tensor_view<const float, 4>& a, const std::vector<double>& b) {
  double e = 0, m = 0;
  std::int64_t i = 0;
  for (std::int64_t x0 = 0; x0 < a.extent[0]; ++x0)
    for (std::int64_t x1 = 0; x1 < a.extent[1]; ++x1)
      for (std::int64_t x2 = 0; x2 < a.extent[2]; ++x2)
        for (std::int64_t x3 = 0; x3 < a.extent[3]; ++x3, ++i) {
          const double d = std::fabs(static_cast<double>(a(x0, x1, x2, x3)) - b[static_cast<size_t>(i)]);
          if (std::isnan(d)) return d;
          e = std::max(e, d);
          m = std::max(m, std::fabs(b[static_cast<size_t>(i)]));
        }
  return m > 0 ? e / m : e;
}
inline double rel_err(const std::vector<float>& a, const std::vector<double>& b) {
  return rel_err(make_view(a.data(), static_cast<std::int64_t>(a.size()), 1, 1, 1), b);
}

//! Copies a strided float view into a contiguous double array [B, N, H, D].
inline std::vector<double> to_double(const tensor_view<const float, 4>& a) {
  std::vector<double> x;
  x.reserve(static_cast<size_t>(a.numel()));
  for (std::int64_t x0 = 0; x0 < a.extent[0]; ++x0)
    for (std::int64_t x1 = 0; x1 < a.extent[1]; ++x1)
      for (std::int64_t x2 = 0; x2 < a.extent[2]; ++x2)
        for (std::int64_t x3 = 0; x3 < a.extent[3]; ++x3) x.push_back(a(x0, x1, x2, x3));
  return x;
}

//! Grouped forward + backward of `fp` over `part`, timed (best of `reps`); returns the times.
inline void time_fwd_bwd(float_problem& fp, const partition_indices& part, int reps, double& fwd_ms, double& bwd_ms) {
  const auto fa = fp.forward_args(part);
  const auto ba = fp.backward_args(part);
  fwd_ms = bwd_ms = 1e300;
  for (int r = 0; r < reps; ++r) {
    auto t0 = steady::now();
    check(reference::group_attention_forward(fa), "group_attention_forward");
    fwd_ms = std::min(fwd_ms, ms_since(t0));
    std::fill(fp.dbias.begin(), fp.dbias.end(), 0.f);
    t0 = steady::now();
    check(reference::group_attention_backward(ba), "group_attention_backward");
    bwd_ms = std::min(bwd_ms, ms_since(t0));
  }
}

//! Checks the grouped float results held in `fp` against the double oracle on the same inputs.
inline void check_against_oracle(float_problem& fp, const partition_indices& part, const window_list& wl,
                                 double& err_fwd, double& err_bwd) {
  const auto fa = fp.forward_args(part);
  const auto ba = fp.backward_args(part);
  const index_t B = fp.B, N = fp.N, H = fp.H, D = fp.D;
  std::vector<double> q = to_double(fa.q), k = to_double(fa.k), v = to_double(fa.v);
  std::vector<double> dout(fp.dout.begin(), fp.dout.end()), bias(fp.bias.begin(), fp.bias.end());
  std::vector<index_t> token_window(static_cast<size_t>(N));
  for (index_t w = 0; w < wl.num_windows(); ++w)
    for (index_t t : wl.window(w)) token_window[static_cast<size_t>(t)] = w;
  std::vector<double> out(q.size()), lse(static_cast<size_t>(B) * N * H), dq(q.size()), dk(q.size()), dv(q.size()),
      dbias(bias.size(), 0.0);
  reference::oracle_args<double> o;
  o.q = make_view(static_cast<const double*>(q.data()), B, N, H, D);
  o.k = make_view(static_cast<const double*>(k.data()), B, N, H, D);
  o.v = make_view(static_cast<const double*>(v.data()), B, N, H, D);
  o.token_window = span<const index_t>(token_window);
  o.token_coord = span<const index_t>(wl.coords);
  o.bias = make_view(static_cast<const double*>(bias.data()), (2 * fp.p - 1) * (2 * fp.p - 1), H);
  o.window = fp.p;
  o.out = make_view(out.data(), B, N, H, D);
  o.lse = make_view(lse.data(), B, N, H);
  check(reference::window_attention_oracle(o), "window_attention_oracle");
  reference::oracle_backward_args<double> g;
  g.q = o.q;
  g.k = o.k;
  g.v = o.v;
  g.dout = make_view(static_cast<const double*>(dout.data()), B, N, H, D);
  g.token_window = o.token_window;
  g.token_coord = o.token_coord;
  g.bias = o.bias;
  g.window = o.window;
  g.dq = make_view(dq.data(), B, N, H, D);
  g.dk = make_view(dk.data(), B, N, H, D);
  g.dv = make_view(dv.data(), B, N, H, D);
  g.dbias = make_view(dbias.data(), (2 * fp.p - 1) * (2 * fp.p - 1), H);
  check(reference::window_attention_oracle_backward(g), "window_attention_oracle_backward");
  err_fwd = std::max(rel_err(tensor_view<const float, 4>(fa.out), out), rel_err(fp.lse, lse));
  err_bwd = std::max({rel_err(tensor_view<const float, 4>(ba.dq), dq), rel_err(tensor_view<const float, 4>(ba.dk), dk),
                      rel_err(tensor_view<const float, 4>(ba.dv), dv), rel_err(fp.dbias, dbias)});
}

//! Runs stage `s` (0-based) of model `m`: both blocks, grouped vs all tokens.
inline stage_result run_stage(const model_shape& m, int s, const std::vector<std::uint8_t>& unit_mask,
                              index_t unit_grid, const options& opt, rng& r) {
  stage_result res;
  res.stage = s + 1;
  res.grid = m.grid(s);
  res.channels = m.channels[s];
  res.heads = m.heads[s];
  res.head_dim = m.head_dim;
  res.tokens = res.grid * res.grid;
  std::vector<index_t> visible, all;
  check(visible_coords(span<const std::uint8_t>(unit_mask), unit_grid, res.grid, visible), "visible_coords");
  const std::vector<std::uint8_t> full(unit_mask.size(), 1);
  check(visible_coords(span<const std::uint8_t>(full), unit_grid, res.grid, all), "visible_coords");
  res.visible = static_cast<index_t>(visible.size());
  const int reps = opt.reps;
  for (int blk = 0; blk < 2; ++blk) {
    const window_geometry g = m.geometry(s, blk == 1);
    res.window = g.window;
    // visible tokens, grouped by the fast plan
    window_list wl;
    plan pl;
    partition_indices part;
    const auto t0 = steady::now();
    build_block(g, visible, strategy::fast, res.channels, wl, pl, part);
    res.plan_ms += ms_since(t0);
    res.groups[blk] = pl.num_groups();
    res.group_size[blk] = pl.group_size;
    res.windows[blk] = g.num_windows();
    float_problem fp(opt.batch, res.visible, res.heads, res.head_dim, g.window, r);
    double f = 0, b = 0;
    time_fwd_bwd(fp, part, reps, f, b);
    res.grouped_fwd_ms += f;
    res.grouped_bwd_ms += b;
    double ef = 0, eb = 0;
    check_against_oracle(fp, part, wl, ef, eb);
    res.err_fwd = std::max(res.err_fwd, ef);
    res.err_bwd = std::max(res.err_bwd, eb);
    res.flops_grouped += static_cast<double>(opt.batch) * pl.cost;
    res.core_grouped += static_cast<double>(opt.batch) * pl.num_groups() * 4.0 * pl.group_size * pl.group_size * res.channels;
    // SimMIM-style baseline: all tokens, every window full, one window per group (no padding).
    // SimMIM shifts by a cyclic roll plus a mask, so its shifted block costs what the plain one
    // does (grid/p squared full windows): both blocks are timed on the unshifted partition.
    window_list wl_all;
    plan pl_all;
    partition_indices part_all;
    build_block(m.geometry(s, false), all, strategy::per_window, res.channels, wl_all, pl_all, part_all);
    float_problem fa(opt.batch, res.tokens, res.heads, res.head_dim, g.window, r);
    time_fwd_bwd(fa, part_all, reps, f, b);
    res.all_fwd_ms += f;
    res.all_bwd_ms += b;
    res.flops_all += static_cast<double>(opt.batch) * pl_all.cost;
    res.core_all += static_cast<double>(opt.batch) * pl_all.num_groups() * 4.0 * pl_all.group_size * pl_all.group_size * res.channels;
  }
  const index_t max_g = std::max(res.group_size[0], res.group_size[1]);
  res.window_note = cli::window_note(m, s, true);
  res.path_note = cli::path_note(m, s, max_g);
  res.cuda = cuda_attention_refusal(m.geometry(s, false).window, max_g, m.head_dim);
  return res;
}

//! Tolerances of the float check (max-norm relative error against the double oracle).
constexpr double forward_tolerance = 1e-4;
constexpr double backward_tolerance = 1e-4;

int run(const options& opt) {
  const model_shape& m = opt.mc.shape;
  const mask_config cfg = opt.mc.masking();  // 32 px units (the largest stride) unless --mask-unit
  const std::vector<std::uint8_t> unit_mask = random_mask(cfg, opt.seed);
  rng r(opt.seed, 1);
  std::vector<stage_result> stages;
  for (int s = 0; s < 3; ++s) stages.push_back(run_stage(m, s, unit_mask, cfg.grid(), opt, r));
  bool ok = true;
  for (const auto& st : stages)
    ok = ok && st.err_fwd <= forward_tolerance && st.err_bwd <= backward_tolerance;

  std::ostringstream os;
  if (opt.json) {
    using cli::num;
    os << "{\"model\": \"" << m.name << "\", \"image\": " << m.image_size << ", \"patch\": " << m.patch_size
       << ", \"mask_unit\": " << m.unit_size() << ", \"batch\": " << opt.batch << ", \"seed\": " << opt.seed << ", \"reps\": " << opt.reps
       << ", \"mask_ratio\": " << num(cfg.ratio) << ", \"precision\": \"float\", \"ok\": " << (ok ? "true" : "false")
       << ", \"stages\": [";
    for (size_t i = 0; i < stages.size(); ++i) {
      const stage_result& st = stages[i];
      const double grouped = st.grouped_fwd_ms + st.grouped_bwd_ms, all = st.all_fwd_ms + st.all_bwd_ms;
      os << (i ? ", " : "") << "{\"stage\": " << st.stage << ", \"grid\": " << st.grid << ", \"window\": " << st.window
         << ", \"channels\": " << st.channels << ", \"heads\": " << st.heads << ", \"tokens\": " << st.tokens
         << ", \"visible_tokens\": " << st.visible << ", \"blocks\": [";
      for (int b = 0; b < 2; ++b)
        os << (b ? ", " : "") << "{\"shift\": " << m.geometry(st.stage - 1, b == 1).shift
           << ", \"windows\": " << st.windows[b] << ", \"group_size\": " << st.group_size[b]
           << ", \"groups\": " << st.groups[b] << "}";
      os << "], \"max_rel_err_forward\": " << num(st.err_fwd, 4) << ", \"max_rel_err_backward\": " << num(st.err_bwd, 4)
         << ", \"plan_ms\": " << num(st.plan_ms, 4) << ", \"grouped_ms\": " << num(grouped, 5)
         << ", \"grouped_forward_ms\": " << num(st.grouped_fwd_ms, 5)
         << ", \"grouped_backward_ms\": " << num(st.grouped_bwd_ms, 5) << ", \"all_tokens_ms\": " << num(all, 5)
         << ", \"all_tokens_forward_ms\": " << num(st.all_fwd_ms, 5)
         << ", \"all_tokens_backward_ms\": " << num(st.all_bwd_ms, 5)
         << ", \"speedup\": " << num(grouped > 0 ? all / grouped : 0, 4)
         << ", \"flops_grouped\": " << num(st.flops_grouped, 12) << ", \"flops_all_tokens\": " << num(st.flops_all, 12)
         << ", \"flops_saved\": " << num(st.flops_all > 0 ? 1 - st.flops_grouped / st.flops_all : 0, 4)
         << ", \"core_flops_grouped\": " << num(st.core_grouped, 12) << ", \"core_flops_all_tokens\": " << num(st.core_all, 12)
         << ", \"cuda\": \"" << (st.cuda.empty() ? "accepted" : st.cuda) << "\", \"path\": \"cpu reference\""
         << ", \"ok\": " << (st.err_fwd <= forward_tolerance && st.err_bwd <= backward_tolerance ? "true" : "false")
         << "}";
    }
    os << "]}\n";
  } else {
    char line[512];
    std::snprintf(line, sizeof line,
                  "greenmim demo: %s, batch %d, seed %llu, mask ratio %.2f (%d of %d units visible), "
                  "CPU reference in float, both blocks (shift 0 and p/2) of stages 1-3\n",
                  m.name, static_cast<int>(opt.batch), static_cast<unsigned long long>(opt.seed), cfg.ratio,
                  static_cast<int>(cfg.num_keep()), static_cast<int>(cfg.num_units()));
    os << line;
    if (!opt.mc.preset_geometry) {
      std::snprintf(line, sizeof line, "geometry: image %d, patch %d, window %d, mask unit %d\n",
                    static_cast<int>(m.image_size), static_cast<int>(m.patch_size), static_cast<int>(m.window),
                    static_cast<int>(m.unit_size()));
      os << line;
    }
    for (const auto& st : stages) {
      const double grouped = st.grouped_fwd_ms + st.grouped_bwd_ms, all = st.all_fwd_ms + st.all_bwd_ms;
      std::snprintf(line, sizeof line, "stage %d: %dx%d tokens, %d visible, C=%d (%d heads x %d), window %d\n",
                    st.stage, st.grid, st.grid, st.visible, st.channels, st.heads, st.head_dim, st.window);
      os << line;
      if (!st.window_note.empty()) os << "  note: " << st.window_note << "\n";
      for (int b = 0; b < 2; ++b) {
        std::snprintf(line, sizeof line, "  shift %d: %d window(s) -> %d group(s) of G=%d\n",
                      m.geometry(st.stage - 1, b == 1).shift, st.windows[b], st.groups[b], st.group_size[b]);
        os << line;
      }
      os << "  attention path: " << st.path_note << (st.cuda.empty() ? "; this run: the CPU reference\n" : "\n");
      std::snprintf(line, sizeof line,
                    "  check vs window-by-window oracle: max rel err forward %.2e, backward %.2e  [%s]\n",
                    st.err_fwd, st.err_bwd,
                    st.err_fwd <= forward_tolerance && st.err_bwd <= backward_tolerance ? "ok" : "FAILED");
      os << line;
      std::snprintf(line, sizeof line, "  grouped (visible tokens): %8.2f ms  (fwd %.2f + bwd %.2f; plan+index %.3f ms)\n",
                    grouped, st.grouped_fwd_ms, st.grouped_bwd_ms, st.plan_ms);
      os << line;
      std::snprintf(line, sizeof line, "  all tokens (SimMIM):      %8.2f ms  (fwd %.2f + bwd %.2f)\n", all,
                    st.all_fwd_ms, st.all_bwd_ms);
      os << line;
      std::snprintf(line, sizeof line,
                    "  speed-up %.2fx; attention FLOPs saved %.1f%% (%.3g vs %.3g GFLOP, paper's cost model)\n",
                    grouped > 0 ? all / grouped : 0.0, 100.0 * (st.flops_all > 0 ? 1 - st.flops_grouped / st.flops_all : 0.0),
                    st.flops_grouped * 1e-9, st.flops_all * 1e-9);
      os << line;
      std::snprintf(line, sizeof line, "  attention core (QK^T, PV) forward: %.3g vs %.3g GFLOP (%.1f%% saved)\n",
                    st.core_grouped * 1e-9, st.core_all * 1e-9,
                    100.0 * (st.core_all > 0 ? 1 - st.core_grouped / st.core_all : 0.0));
      os << line;
    }
    os << (ok ? "all checks passed\n" : "CHECK FAILED\n");
  }
  std::fputs(os.str().c_str(), stdout);
  return ok ? 0 : 1;
}

}  // namespace demo
}  // namespace greenmim
