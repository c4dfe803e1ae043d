// greenmim: the command-line program. Subcommands: plan, simulate, demo.
// Every user error: exit code 2 and one line on stderr, nothing on stdout.
#include <greenmim/greenmim.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "cli_common.hpp"
#include "cli_main.hpp"
#include "model_flags.hpp"
#include "simulate_twins.hpp"
#if defined(GREENMIM_HAVE_REFERENCE) && __has_include("demo.hpp")
#include "demo.hpp"
#define GREENMIM_HAVE_DEMO 1
#endif

using namespace greenmim;
using cli::usage_error;

namespace {

const char* kUsage =
    "usage: greenmim <command> [flags]\n"
    "\n"
    "commands:\n"
    "  plan      group windows: --sizes 12,30,0,7 (or sizes on stdin; one list per line = a batch),\n"
    "            or the windows of a random mask on a model's stage: --model NAME [--stage 1]\n"
    "  simulate  the paper's grouping table: attention cost per stage over random masks (--model NAME)\n"
    "  demo      plan, index, run grouped window attention fwd+bwd on the CPU, check and time it\n"
    "  help CMD  the flags of CMD with their defaults (also: greenmim CMD --help)\n"
    "\n"
    "models: swin-b swin-l swin-b-w14 swin-l-w14 swin-b-192w6 swin-l-192w6 swinv2_base_window8_256\n"
    "        swinv2_base_window16_256 swinv2_large_window12_192 (simulate also: twins-b twins-l);\n"
    "        any geometry on top: --image PX --patch PX --window P --mask-unit PX --ratio R\n"
    "\n"
    "greenmim --version prints the version. A bad flag: exit 2, one line on stderr.\n";

const char* kGeometryUsage =
    "  --image PX        image side in pixels (default: the model's: 224, 192 or 256)\n"
    "  --patch PX        patch size (default: the model's, 4)\n"
    "  --window P        window side in tokens (default: the model's; a stage grid <= P is one\n"
    "                    window of the grid's size, not shifted, as in Swin/timm)\n"
    "  --mask-unit PX    mask unit side (default: the largest patch stride, patch x 8 = 32)\n"
    "  --ratio R         mask ratio in [0, 1] (default 0.75)\n";

std::string plan_usage() {
  return std::string(
             "usage: greenmim plan (--sizes LIST | --model NAME | sizes on stdin) [flags]\n"
             "Groups windows of visible tokens into equal-size groups (the planner) and prints the plan.\n"
             "\n"
             "window sizes (one of):\n"
             "  --sizes LIST      window sizes, e.g. 12,30,0,7 (default: read stdin, one list per line = a batch)\n"
             "  --model NAME      the windows of one random mask on a model's stage (default swin-b when a\n"
             "                    flag below is given):\n"
             "                    ") +
         cli::swin_model_names_wrapped(20) + "\n" + kGeometryUsage +
         "  --stage S         stage 1..4 (default 1)\n"
         "  --shifted         the shifted block's windows (default: not shifted)\n"
         "  --seed N          mask seed (default 0)\n"
         "planning:\n"
         "  --channels C      C of the cost model (default 128; with a model: the stage's channels)\n"
         "  --strategy NAME   fast | paper | per-window | single (default fast)\n"
         "  --group-size G    fix G (fast and paper only; default: the planner sweeps G)\n"
         "  --max-group M     sweep only G <= M (fast and paper only; 256 keeps windows up to 16 on\n"
         "                    the tensor-core attention; default: no cap)\n"
         "  --json            one JSON object on one line\n"
         "  --help            this text\n";
}

std::string simulate_usage() {
  return std::string(
             "usage: greenmim simulate [flags]\n"
             "Cost of one attention module per stage (MFLOPs, one image), mean over random masks: the\n"
             "paper's Algorithm 1 and its variants, per-window, single group, the fast planner, the bound.\n"
             "\n"
             "  --model NAME      default swin-b; ") +
         cli::swin_model_names_wrapped(20) +
         "\n"
         "                    twins-b, twins-l: Twins encoder cost (--masks --seed --ratio --json only)\n" +
         kGeometryUsage +
         "  --masks N         random masks (default 100)\n"
         "  --seed N          mask seed (default 0)\n"
         "  --shift S         window shift in tokens, 0..P-1 (default 0)\n"
         "  --curve FILE      also write the cost against G per stage as CSV (not with --per-sample)\n"
         "  --per-sample      every sample its own mask, a batch planned together\n"
         "  --batch N         samples per batch with --per-sample (default 256)\n"
         "  --json            one JSON object on one line\n"
         "  --help            this text\n";
}

std::string demo_usage() {
  return std::string(
             "usage: greenmim demo [flags]\n"
             "One random masked batch through stages 1-3 of a model on the CPU reference (float): plan,\n"
             "indices, grouped window attention forward and backward for both blocks of each stage,\n"
             "checked against the window-by-window oracle and timed against attention over all tokens.\n"
             "\n"
             "  --model NAME      default swin-b; ") +
         cli::swin_model_names_wrapped(20) + "\n" + kGeometryUsage +
         "  --batch N         images, 1..64 (default 8)\n"
         "  --seed N          mask and data seed (default 0)\n"
         "  --json            one JSON object on one line\n"
         "  --help            this text\n";
}

//! The usage of `cmd`, or "" for an unknown command.
std::string usage_of(const std::string& cmd) {
  if (cmd == "plan") return plan_usage();
  if (cmd == "simulate") return simulate_usage();
  if (cmd == "demo") return demo_usage();
  if (cmd == "help") return "usage: greenmim help [plan | simulate | demo]\n";
  return {};
}

const std::vector<std::string> kCommands = {"plan", "simulate", "demo", "help", "--help", "--version"};

strategy parse_strategy(const std::string& s) {
  if (s == "fast") return strategy::fast;
  if (s == "paper") return strategy::paper;
  if (s == "per-window") return strategy::per_window;
  if (s == "single") return strategy::single;
  throw usage_error("--strategy: unknown strategy '" + s + "' (fast, paper, per-window, single)");
}

std::string plan_error(status s, const planner_options& opt) {
  switch (s) {
    case status::empty_input: return "no non-empty window to plan";
    case status::size_exceeds_group:
      return opt.group_size > 0 ? "a window is larger than the group size " + std::to_string(opt.group_size)
                                : "a window is larger than --max-group " + std::to_string(opt.max_group_size);
    case status::overflow: return "window sizes too large (a window <= 2^20 tokens, total <= 2^28)";
    case status::invalid_argument: return "invalid arguments (too large for the paper's sweep? use --strategy fast)";
    default: return status_string(s);
  }
}

std::string json_list(const std::vector<index_t>& v, size_t b, size_t e) {
  std::string s = "[";
  for (size_t i = b; i < e; ++i) s += (i > b ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// ---------------------------------------------------------------------------------------------
int cmd_plan(int argc, char** argv, std::istream& in, std::ostream& cout, const cli::limits& lim) {
  cli::args a(argc, argv,
              cli::with_geometry_flags({"--sizes", "--channels", "--strategy", "--group-size", "--max-group", "--model", "--stage", "--seed"}),
              {"--json", "--shifted"});
  // Model mode: the windows of one random mask on a model's stage instead of given sizes.
  bool model_mode = a.has("--model") || a.has("--stage") || a.has("--seed") || a.has("--shifted");
  for (const auto& f : cli::geometry_flags()) model_mode = model_mode || a.has(f);
  if (model_mode && a.has("--sizes"))
    throw usage_error("--sizes excludes --model and its flags: give window sizes or a model, not both");
  cli::model_choice mc;
  int stage = 0;
  index_t shift = 0, visible = 0;
  std::uint64_t seed = 0;
  std::vector<index_t> model_sizes;
  if (model_mode) {
    mc = cli::parse_model(a, "swin-b", lim);
    stage = static_cast<int>(cli::parse_int(a.get("--stage", "1"), "--stage", 1, 4)) - 1;
    seed = cli::parse_seed(a.get("--seed", "0"));
    const mask_config cfg = mc.masking();
    if (cfg.num_keep() == 0) throw usage_error("--ratio leaves no visible mask unit");
    const window_geometry geo = mc.shape.geometry(stage, a.has("--shifted"));
    shift = geo.shift;
    const std::int64_t per_unit = mc.shape.unit_size() / (mc.shape.patch_size << stage);  // tokens per unit side
    if (static_cast<std::int64_t>(cfg.num_keep()) * per_unit * per_unit > lim.max_total)
      throw usage_error("the stage has more visible tokens than " + std::to_string(lim.max_total));
    const auto um = random_mask(cfg, seed, 0);
    std::vector<index_t> coords;
    check(visible_coords(span<const std::uint8_t>(um), cfg.grid(), mc.shape.grid(stage), coords), "visible_coords");
    visible = static_cast<index_t>(coords.size());
    model_sizes = window_sizes(geo, span<const index_t>(coords));
  }
  const index_t channels = static_cast<index_t>(cli::parse_int(
      a.get("--channels", model_mode ? std::to_string(mc.shape.channels[stage]) : "128"), "--channels", 1, 65536));
  planner_options opt;
  opt.strat = parse_strategy(a.get("--strategy", "fast"));
  if (a.has("--group-size")) {
    opt.group_size = static_cast<index_t>(cli::parse_int(a.get("--group-size"), "--group-size", 1, max_total_size));
    if (opt.strat != strategy::fast && opt.strat != strategy::paper)
      throw usage_error("--group-size applies to --strategy fast or paper only");
  }
  if (a.has("--max-group")) {
    opt.max_group_size = static_cast<index_t>(cli::parse_int(a.get("--max-group"), "--max-group", 1, max_total_size));
    if (opt.strat != strategy::fast && opt.strat != strategy::paper)
      throw usage_error("--max-group applies to --strategy fast or paper only");
    if (opt.group_size > opt.max_group_size)
      throw usage_error("--group-size " + std::to_string(opt.group_size) + " > --max-group " +
                        std::to_string(opt.max_group_size));
  }
  // One list from --sizes, or one or more lists (one per line) from stdin: a batch.
  std::vector<std::vector<index_t>> lists;
  if (model_mode) {
    lists.push_back(model_sizes);
  } else if (a.has("--sizes")) {
    auto v = cli::parse_int_list(a.get("--sizes"), "--sizes", 0, max_window_size);
    lists.emplace_back(v.begin(), v.end());
  } else {
    std::string line;
    while (std::getline(in, line)) {
      auto v = cli::parse_int_list(line, "stdin sizes", 0, max_window_size);
      if (!v.empty()) lists.emplace_back(v.begin(), v.end());
    }
  }
  if (lists.empty()) throw usage_error("no window sizes: give --sizes 12,30,0,7 or sizes on stdin");
  std::vector<index_t> sizes, sample_offsets{0};
  for (auto& l : lists) {
    if (l.empty()) throw usage_error("an empty size list");
    sizes.insert(sizes.end(), l.begin(), l.end());
    sample_offsets.push_back(static_cast<index_t>(sizes.size()));
  }
  if (lim.max_total < max_total_size) {  // the fuzzer's bound on the paper's O(S^2 n) sweep
    std::int64_t total = 0;
    for (index_t w : sizes) total += w;
    if (total > lim.max_total) throw usage_error("sizes sum to more than " + std::to_string(lim.max_total));
  }
  plan p;
  const auto t0 = std::chrono::steady_clock::now();
  const status s = make_plan(span<const index_t>(sizes), opt, flops_cost{channels}, p);
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  if (s != status::success) throw usage_error(plan_error(s, opt));

  std::ostringstream out;
  const bool batch = lists.size() > 1;
  const model_shape& m = mc.shape;
  const std::string cuda = model_mode ? cuda_attention_refusal(m.geometry(stage, false).window, p.group_size, m.head_dim) : "";
  if (a.has("--json")) {
    out << "{\"strategy\":\"" << strategy_name(p.strat) << "\",\"group_size\":" << p.group_size << ",\"groups\":[";
    for (index_t g = 0; g < p.num_groups(); ++g)
      out << (g ? "," : "") << json_list(p.windows, p.group_offsets[g], p.group_offsets[g + 1]);
    out << "],\"fills\":" << json_list(p.fills, 0, p.fills.size()) << ",\"cost\":" << cli::num(p.cost, 17)
        << ",\"lower_bound\":" << cli::num(p.lower_bound, 17)
        << ",\"budget_exhausted\":" << (p.budget_exhausted ? "true" : "false");
    if (batch) out << ",\"sample_offsets\":" << json_list(sample_offsets, 0, sample_offsets.size());
    if (model_mode)
      out << ",\"model\":\"" << m.name << "\",\"image\":" << m.image_size << ",\"patch\":" << m.patch_size
          << ",\"mask_unit\":" << m.unit_size() << ",\"ratio\":" << cli::num(mc.ratio) << ",\"seed\":" << seed
          << ",\"stage\":" << stage + 1 << ",\"grid\":" << m.grid(stage)
          << ",\"window\":" << m.geometry(stage, false).window << ",\"shift\":" << shift
          << ",\"visible_tokens\":" << visible << ",\"sizes\":" << json_list(sizes, 0, sizes.size())
          << ",\"cuda\":\"" << (cuda.empty() ? "accepted" : cuda) << "\"";
    out << ",\"plan_us\":" << cli::num(us, 6) << "}\n";
  } else {
    if (model_mode) {
      out << "model        " << m.name << ", image " << m.image_size << ", patch " << m.patch_size << ", window "
          << m.window << ", mask unit " << m.unit_size() << ", ratio " << mc.ratio << ", seed " << seed << "\n"
          << "stage        " << stage + 1 << ": grid " << m.grid(stage) << ", window " << m.geometry(stage, false).window
          << ", shift " << shift << ", " << visible << " of " << m.grid(stage) * m.grid(stage) << " tokens visible\n";
      const std::string note = cli::window_note(m, stage, a.has("--shifted"));
      if (!note.empty()) out << "note         " << note << "\n";
    }
    out << "strategy     " << strategy_name(p.strat) << "\n"
        << "windows      " << sizes.size() << (batch ? " (" + std::to_string(lists.size()) + " samples; indices are flat, sample-major)" : "")
        << "\ngroup size   " << p.group_size << "\n"
        << "groups       " << p.num_groups() << "\n";
    for (index_t g = 0; g < p.num_groups() && g < 64; ++g)
      out << "  group " << g << ": windows " << json_list(p.windows, p.group_offsets[g], p.group_offsets[g + 1])
          << " fill " << p.fills[g] << "/" << p.group_size << "\n";
    if (p.num_groups() > 64) out << "  ... (" << p.num_groups() - 64 << " more; use --json)\n";
    out << "cost         " << cli::num(p.cost / 1e6, 6) << " MFLOPs (C = " << channels << ")\n"
        << "lower bound  " << cli::num(p.lower_bound / 1e6, 6) << " MFLOPs (gap " << cli::num(100 * p.gap(), 3) << "%)\n"
        << (p.budget_exhausted ? "note         the planner's work budget ran out (sizes far beyond real windows): "
                                 "a valid plan, the gap above holds\n"
                               : "")
        << "planned in   " << cli::num(us, 4) << " us\n";
    if (model_mode) out << "attention    " << cli::path_note(m, stage, p.group_size) << "\n";
  }
  cout << out.str();
  return 0;
}

// ---------------------------------------------------------------------------------------------
struct stat_acc {
  double sum = 0, sq = 0;
  std::int64_t n = 0;
  void add(double x) { sum += x; sq += x * x; ++n; }
  double mean() const { return n ? sum / n : 0; }
  double std() const { return n > 1 ? std::sqrt(std::max(0.0, (sq - sum * sum / n) / (n - 1))) : 0; }
};

// The paper's appendix table "Influence of the optimal grouping" (Swin-B, 224, p = 7): MFLOPs.
struct paper_row { double paper, pxp, maxw, per_window, single; };
const paper_row kPaperSwinB[3] = {{62.6, 65.0, 64.5, 137.5, 201.3}, {55.4, 58.5, 59.7, 113.3, 69.2}, {52.3, 52.7, 62.5, 75.7, 52.7}};

int cmd_simulate(int argc, char** argv, std::ostream& cout, const cli::limits& lim) {
  cli::args a(argc, argv, cli::with_geometry_flags({"--model", "--masks", "--seed", "--shift", "--curve", "--batch"}),
              {"--json", "--per-sample"});
  const std::string model_name = a.get("--model", "swin-b");
  if (find_twins_model(model_name.c_str())) {
    for (const char* swin_only : {"--image", "--patch", "--window", "--mask-unit"})
      if (a.has(swin_only))
        throw usage_error(std::string(swin_only) + " applies to the Swin models only (Twins: --masks, --seed, --ratio, --json)");
    return cli::simulate_twins(argc, argv, cout, lim);  // simulate_twins.hpp
  }
  const cli::model_choice mc = cli::parse_model(a, "swin-b", lim, ", twins-b, twins-l");
  const model_shape* m = &mc.shape;
  // the paper's appendix set-up: Swin-B, 224 px, patch 4, window 7, 32 px units
  const bool paper_setup = model_name == "swin-b" && m->image_size == 224 && m->patch_size == 4 && m->window == 7 &&
                           m->unit_size() == 32;
  const int masks = static_cast<int>(cli::parse_int(a.get("--masks", "100"), "--masks", 1, lim.max_masks));
  const std::uint64_t seed = cli::parse_seed(a.get("--seed", "0"));
  const index_t shift = static_cast<index_t>(cli::parse_int(a.get("--shift", "0"), "--shift", 0, m->window - 1));
  const mask_config cfg = mc.masking();
  {  // the planner's total: stage 1's visible tokens (the fuzzer lowers the bound)
    const std::int64_t per_unit = m->unit_size() / m->patch_size;
    if (static_cast<std::int64_t>(cfg.num_keep()) * per_unit * per_unit > lim.max_total)
      throw usage_error("stage 1 has more visible tokens than " + std::to_string(lim.max_total));
  }
  const bool per_sample = a.has("--per-sample");
  const int batch = static_cast<int>(cli::parse_int(a.get("--batch", per_sample ? "256" : "1"), "--batch", 1, lim.max_batch));
  if (a.has("--batch") && !per_sample) throw usage_error("--batch applies to --per-sample only");
  if (per_sample && a.has("--curve")) throw usage_error("--curve is not available with --per-sample");
  if (cfg.num_keep() == 0) throw usage_error("--ratio leaves no visible mask unit");
  const bool json = a.has("--json");
  std::string curve_path = a.get("--curve");
  std::ofstream curve;
  if (a.has("--curve")) {
    if (curve_path.empty()) throw usage_error("--curve needs a file name");
    curve.open(lim.write_files ? curve_path : std::string("/dev/null"));
    if (!curve) throw usage_error("--curve: cannot write '" + curve_path + "'");
    curve << "stage,group_size,masks,mean_mflops,std_mflops,fast_mean_mflops\n";
  }

  planner<flops_cost> pl;
  std::ostringstream out, js;
  js << "{\"model\":\"" << m->name << "\",\"masks\":" << masks << ",\"seed\":" << seed << ",\"shift\":" << shift
     << (per_sample ? ",\"batch\":" + std::to_string(batch) : std::string()) << ",\"image\":" << m->image_size
     << ",\"patch\":" << m->patch_size << ",\"window\":" << m->window << ",\"mask_unit\":" << m->unit_size()
     << ",\"ratio\":" << cli::num(cfg.ratio) << ",\"stages\":[";
  // Stages 1-3 (stage 4 is one window at every preset); stage 4 too when it has several windows.
  const int num_stages = m->geometry(3, false).num_windows() > 1 ? 4 : 3;
  if (!json) {
    out << "greenmim simulate: " << m->name << ", image " << m->image_size << ", window " << m->window
        << (m->patch_size != 4 || m->unit_size() != 32
                ? ", patch " + std::to_string(m->patch_size) + ", mask unit " + std::to_string(m->unit_size())
                : std::string())
        << ", shift " << shift << ", ratio " << cfg.ratio << ", " << masks << " masks, seed " << seed << "\n"
        << "cost of one attention module, one image, mean over masks, in MFLOPs"
        << (!per_sample && paper_setup && shift == 0 && cfg.ratio == 0.75 ? "; (paper) = the paper's appendix table" : "")
        << "\n";
    for (int stage = 0; stage < num_stages; ++stage) {
      const std::string note = cli::window_note(*m, stage, shift > 0);
      if (!note.empty()) out << "note: " << note << "\n";
    }
    out << "\n";
  }
  for (int stage = 0; stage < num_stages; ++stage) {
    const index_t C = m->channels[stage];
    const window_geometry geo = make_window_geometry(m->grid(stage), m->grid(stage), m->window, shift);
    index_t max_group = 0;  // largest G of the fast plans: what the CUDA kernels would be given
    // SimMIM's baseline: every token, every (unshifted: SimMIM rolls) window full, one per group
    double all_tokens = 0;
    {
      std::vector<index_t> full;
      for (index_t h = 0; h < m->grid(stage); ++h)
        for (index_t w = 0; w < m->grid(stage); ++w) full.push_back(pack_coord(h, w));
      const window_geometry g0 = m->geometry(stage, false);
      for (index_t w : window_sizes(g0, span<const index_t>(full))) all_tokens += flops_cost{C}(w, 1) / 1e6;
    }
    pl = planner<flops_cost>(flops_cost{C});
    stat_acc paper, pxp, maxw, per_window, single, fast, lb, vis, fast_us, shared_cost, ps_cost, ps_lb;
    std::vector<stat_acc> curve_paper, curve_fast;
    std::vector<std::vector<index_t>> all_sizes;
    plan p;
    planner_options opt;
    for (int i = 0; i < masks; ++i) {
      // One mask per micro-batch (stream = mask index): the paper's batch-wise masking.
      const auto um = random_mask(cfg, seed, static_cast<std::uint64_t>(i));
      std::vector<index_t> coords;
      check(visible_coords(span<const std::uint8_t>(um), cfg.grid(), m->grid(stage), coords));
      const auto sizes = window_sizes(geo, span<const index_t>(coords));
      const span<const index_t> sz(sizes);
      vis.add(static_cast<double>(coords.size()));
      auto run = [&](strategy s, index_t g) {
        opt.strat = s;
        opt.group_size = g;
        const status st = pl.run(sz, opt, p);
        // the paper's sweep refuses sizes beyond its work guard (a custom geometry): n/a
        if (st == status::invalid_argument && s == strategy::paper && g == 0)
          return std::numeric_limits<double>::quiet_NaN();
        check(st, "plan");
        return p.cost / 1e6;
      };
      index_t mx = 0;
      std::int64_t S = 0;
      for (auto w : sizes) { mx = std::max(mx, w); S += w; }
      if (!per_sample) {
        paper.add(run(strategy::paper, 0));
        pxp.add(run(strategy::paper, std::max(mx, m->window * m->window)));
        maxw.add(run(strategy::paper, mx));
        per_window.add(run(strategy::per_window, 0));
        single.add(run(strategy::single, 0));
      }
      const auto t0 = std::chrono::steady_clock::now();
      fast.add(run(strategy::fast, 0));
      max_group = std::max(max_group, p.group_size);
      if (!per_sample) fast_us.add(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      lb.add(p.lower_bound / 1e6);
      shared_cost.add(p.cost / 1e6);
      if (curve.is_open()) {
        if (curve_paper.empty()) { curve_paper.resize(static_cast<size_t>(S) + 1); curve_fast.resize(static_cast<size_t>(S) + 1); }
        for (index_t g = 1; g <= static_cast<index_t>(curve_paper.size()) - 1; ++g) {
          if (g < mx) continue;
          curve_paper[g].add(run(strategy::paper, g));
          curve_fast[g].add(run(strategy::fast, g));
        }
      }
      if (per_sample) all_sizes.push_back(sizes);
    }
    // Per-sample masks: `batch` samples, each its own mask, planned together as one batch.
    double ps_us = 0;
    if (per_sample) {
      const int rounds = masks;
      std::vector<index_t> batch_sizes;
      double total_us = 0;
      for (int r = 0; r < rounds; ++r) {
        batch_sizes.clear();
        for (int b = 0; b < batch; ++b) {
          const auto um = random_mask(cfg, seed, static_cast<std::uint64_t>(1000003) * (r + 1) + b);
          std::vector<index_t> coords;
          check(visible_coords(span<const std::uint8_t>(um), cfg.grid(), m->grid(stage), coords));
          const auto sizes = window_sizes(geo, span<const index_t>(coords));
          batch_sizes.insert(batch_sizes.end(), sizes.begin(), sizes.end());
        }
        opt.strat = strategy::fast;
        opt.group_size = 0;
        // a trainer reuses its planner every step: time the warm planner, median of 5 runs
        double runs[5];
        for (double& t : runs) {
          const auto t0 = std::chrono::steady_clock::now();
          check(pl.run(span<const index_t>(batch_sizes), opt, p), "plan");
          t = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
        }
        std::nth_element(runs, runs + 2, runs + 5);
        total_us += runs[2];
        ps_cost.add(p.cost / 1e6 / batch);
        ps_lb.add(p.lower_bound / 1e6 / batch);
      }
      ps_us = total_us / rounds;
    }
    if (curve.is_open()) {
      for (size_t g = 1; g < curve_paper.size(); ++g) {
        if (!curve_paper[g].n) continue;
        curve << stage + 1 << "," << g << "," << curve_paper[g].n << "," << cli::num(curve_paper[g].mean()) << ","
              << cli::num(curve_paper[g].std()) << "," << cli::num(curve_fast[g].mean()) << "\n";
      }
    }
    const std::string cuda = cuda_attention_refusal(geo.window, max_group, m->head_dim);
    js << (stage ? "," : "") << "{\"stage\":" << stage + 1 << ",\"grid\":" << m->grid(stage) << ",\"channels\":" << C
       << ",\"windows\":" << geo.num_windows() << ",\"window\":" << geo.window << ",\"shift\":" << geo.shift
       << ",\"visible_tokens\":" << cli::num(vis.mean()) << ",\"max_group_size\":" << max_group << ",\"cuda\":\""
       << (cuda.empty() ? "accepted" : cuda) << "\"";
    if (per_sample) {
      js << ",\"mflops_per_image\":{\"shared\":" << cli::num(shared_cost.mean()) << ",\"per_sample\":" << cli::num(ps_cost.mean())
         << ",\"lower_bound\":" << cli::num(ps_lb.mean()) << ",\"all_tokens\":" << cli::num(all_tokens) << "},\"plan_us\":" << cli::num(ps_us, 6) << "}";
    } else {
      js << ",\"mflops\":{\"paper\":" << cli::num(paper.mean()) << ",\"paper_pxp\":" << cli::num(pxp.mean())
         << ",\"paper_max\":" << cli::num(maxw.mean()) << ",\"per_window\":" << cli::num(per_window.mean())
         << ",\"single\":" << cli::num(single.mean()) << ",\"fast\":" << cli::num(fast.mean())
         << ",\"lower_bound\":" << cli::num(lb.mean()) << ",\"all_tokens\":" << cli::num(all_tokens)
         << "},\"fast_plan_us\":" << cli::num(fast_us.mean(), 6) << "}";
    }
    if (!json) {
      char buf[512];
      std::snprintf(buf, sizeof buf, "stage %d: grid %d, C %d, %d windows, %.0f visible tokens", stage + 1,
                    m->grid(stage), C, geo.num_windows(), vis.mean());
      out << buf;
      if (geo.window != m->window || geo.shift != shift)
        out << " (window " << geo.window << ", shift " << geo.shift << ": small-stage rule)";
      out << "\n";
      if (!cuda.empty()) out << "  note: " << cli::path_note(*m, stage, max_group) << "\n";
      if (per_sample) {
        std::snprintf(buf, sizeof buf,
                      "  shared mask       %8.2f MFLOPs/image\n  per-sample masks  %8.2f MFLOPs/image (batch %d, lower bound %.2f, gap %.3f%%)\n"
                      "  planning          %8.1f us per batch plan (warm planner, median of 5)\n",
                      shared_cost.mean(), ps_cost.mean(), batch, ps_lb.mean(),
                      100 * (ps_cost.mean() - ps_lb.mean()) / ps_lb.mean(), ps_us);
        out << buf;
      } else {
        const bool show = paper_setup && shift == 0 && cfg.ratio == 0.75;
        const paper_row& pr = kPaperSwinB[stage];
        auto row = [&](const char* name, double v, double ref) {
          if (std::isnan(v))
            std::snprintf(buf, sizeof buf, "  %-28s %8s   (the paper's sweep is too large here)\n", name, "n/a");
          else if (show && ref > 0)
            std::snprintf(buf, sizeof buf, "  %-28s %8.2f   (paper %6.1f, %+5.1f%%)\n", name, v, ref, 100 * (v - ref) / ref);
          else
            std::snprintf(buf, sizeof buf, "  %-28s %8.2f\n", name, v);
          out << buf;
        };
        row("paper (Algorithm 1, sweep G)", paper.mean(), pr.paper);
        row("paper DP at G = p*p", pxp.mean(), pr.pxp);
        row("paper DP at G = max w", maxw.mean(), pr.maxw);
        row("per-window (no DP)", per_window.mean(), pr.per_window);
        row("single group (G = sum w)", single.mean(), pr.single);
        row("fast (ours)", fast.mean(), 0);
        row("lower bound", lb.mean(), 0);
        if (std::isnan(paper.mean()))
          std::snprintf(buf, sizeof buf, "  fast vs bound %+.2f%%, fast plans in %.1f us\n\n",
                        100 * (fast.mean() - lb.mean()) / lb.mean(), fast_us.mean());
        else
          std::snprintf(buf, sizeof buf, "  fast vs bound %+.2f%%, paper vs bound %+.2f%%, fast plans in %.1f us\n\n",
                        100 * (fast.mean() - lb.mean()) / lb.mean(), 100 * (paper.mean() - lb.mean()) / lb.mean(),
                        fast_us.mean());
        out << buf;
      }
    }
  }
  js << "]}\n";
  cout << (json ? js.str() : out.str());
  return 0;
}

}  // namespace

int greenmim::cli::run(int argc, char** argv, std::istream& in, std::ostream& out, std::ostream& err,
                       const limits& lim) {
  if (argc < 2) {
    err << "greenmim: missing command (plan, simulate, demo); see greenmim --help\n";
    return 2;
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "--help" || cmd == "-h") {
      out << kUsage;
      return 0;
    }
    if (cmd == "help") {  // greenmim help [CMD]
      if (argc == 2) {
        out << kUsage;
        return 0;
      }
      if (argc > 3) throw usage_error("takes one command: greenmim help [plan | simulate | demo]");
      const std::string topic = argv[2];
      const std::string u = usage_of(topic);
      if (u.empty())
        throw usage_error("unknown command '" + topic + "'" + cli::did_you_mean(topic, {"plan", "simulate", "demo"}) +
                          " (plan, simulate, demo)");
      out << u;
      return 0;
    }
    if (cmd == "plan" || cmd == "simulate" || cmd == "demo") {  // greenmim CMD ... --help ...
      for (int i = 2; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--help" || arg == "-h") {
          out << usage_of(cmd);
          return 0;
        }
      }
    }
    if (cmd == "--version") {
      out << "greenmim " << GREENMIM_VERSION_MAJOR << "." << GREENMIM_VERSION_MINOR << "." << GREENMIM_VERSION_PATCH << "\n";
      return 0;
    }
    if (cmd == "plan") return cmd_plan(argc - 2, argv + 2, in, out, lim);
    if (cmd == "simulate") return cmd_simulate(argc - 2, argv + 2, out, lim);
    if (cmd == "demo") {
#if defined(GREENMIM_HAVE_DEMO)
      if (!lim.run_demo) {  // the fuzzer: the flags only (a demo run takes a second or more)
        greenmim::demo::parse(argc - 2, argv + 2, lim);
        return 0;
      }
      return greenmim_demo(argc - 2, argv + 2, lim);
#else
      throw usage_error("demo needs the CPU reference (Eigen); rebuild with libeigen3-dev installed");
#endif
    }
    throw usage_error("unknown command '" + cmd + "'" + cli::did_you_mean(cmd, kCommands) + " (plan, simulate, demo)");
  } catch (const usage_error& e) {
    err << "greenmim " << cli::one_line(cmd) << ": " << cli::one_line(e.what()) << "\n";
    return 2;
  } catch (const std::exception& e) {
    err << "greenmim " << cli::one_line(cmd) << ": error: " << cli::one_line(e.what()) << "\n";
    return 1;
  }
}

#if !defined(GREENMIM_CLI_NO_MAIN)  // defined by the fuzzer, which calls greenmim::cli::run
int main(int argc, char** argv) { return greenmim::cli::run(argc, argv, std::cin, std::cout, std::cerr); }
#endif
