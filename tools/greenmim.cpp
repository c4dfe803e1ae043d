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
#include <sstream>
#include <string>
#include <vector>

#include "cli_common.hpp"
#include "cli_main.hpp"
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
    "  plan      group windows: --sizes 12,30,0,7 (or sizes on stdin; one list per line = a batch)\n"
    "            [--channels 128] [--strategy fast|paper|per-window|single] [--group-size G] [--json]\n"
    "  simulate  the paper's grouping table: --model swin-b [--masks 100] [--seed 0] [--shift 0]\n"
    "            [--ratio 0.75] [--curve FILE.csv] [--per-sample --batch 256] [--json]\n"
    "            --model twins-l|twins-b: Twins encoder FLOPs, visible vs all tokens [--masks] [--seed] [--ratio] [--json]\n"
    "  demo      plan, index, run grouped window attention fwd+bwd on the CPU, check and time it\n"
    "            [--batch 8] [--seed 0] [--model swin-b] [--json]\n";

strategy parse_strategy(const std::string& s) {
  if (s == "fast") return strategy::fast;
  if (s == "paper") return strategy::paper;
  if (s == "per-window") return strategy::per_window;
  if (s == "single") return strategy::single;
  throw usage_error("--strategy: unknown strategy '" + s + "' (fast, paper, per-window, single)");
}

std::string plan_error(status s, std::int64_t group_size) {
  switch (s) {
    case status::empty_input: return "no non-empty window to plan";
    case status::size_exceeds_group:
      return "a window is larger than the group size " + std::to_string(group_size);
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
  cli::args a(argc, argv, {"--sizes", "--channels", "--strategy", "--group-size"}, {"--json"});
  const index_t channels = static_cast<index_t>(cli::parse_int(a.get("--channels", "128"), "--channels", 1, 65536));
  planner_options opt;
  opt.strat = parse_strategy(a.get("--strategy", "fast"));
  if (a.has("--group-size")) {
    opt.group_size = static_cast<index_t>(cli::parse_int(a.get("--group-size"), "--group-size", 1, max_total_size));
    if (opt.strat != strategy::fast && opt.strat != strategy::paper)
      throw usage_error("--group-size applies to --strategy fast or paper only");
  }
  // One list from --sizes, or one or more lists (one per line) from stdin: a batch.
  std::vector<std::vector<index_t>> lists;
  if (a.has("--sizes")) {
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
  if (s != status::success) throw usage_error(plan_error(s, opt.group_size));

  std::ostringstream out;
  const bool batch = lists.size() > 1;
  if (a.has("--json")) {
    out << "{\"strategy\":\"" << strategy_name(p.strat) << "\",\"group_size\":" << p.group_size << ",\"groups\":[";
    for (index_t g = 0; g < p.num_groups(); ++g)
      out << (g ? "," : "") << json_list(p.windows, p.group_offsets[g], p.group_offsets[g + 1]);
    out << "],\"fills\":" << json_list(p.fills, 0, p.fills.size()) << ",\"cost\":" << cli::num(p.cost, 17)
        << ",\"lower_bound\":" << cli::num(p.lower_bound, 17)
        << ",\"budget_exhausted\":" << (p.budget_exhausted ? "true" : "false");
    if (batch) out << ",\"sample_offsets\":" << json_list(sample_offsets, 0, sample_offsets.size());
    out << ",\"plan_us\":" << cli::num(us, 6) << "}\n";
  } else {
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
  cli::args a(argc, argv, {"--model", "--masks", "--seed", "--shift", "--ratio", "--curve", "--batch"},
              {"--json", "--per-sample"});
  const std::string model_name = a.get("--model", "swin-b");
  if (find_twins_model(model_name.c_str())) return cli::simulate_twins(argc, argv, cout, lim);  // simulate_twins.hpp
  const model_shape* m = find_model(model_name.c_str());
  if (!m) throw usage_error("--model: unknown model '" + model_name + "' (swin-b, swin-l, swin-b-w14, swin-l-w14, twins-b, twins-l)");
  const int masks = static_cast<int>(cli::parse_int(a.get("--masks", "100"), "--masks", 1, lim.max_masks));
  const std::uint64_t seed = cli::parse_seed(a.get("--seed", "0"));
  const index_t shift = static_cast<index_t>(cli::parse_int(a.get("--shift", "0"), "--shift", 0, m->window - 1));
  mask_config cfg;
  cfg.ratio = cli::parse_double(a.get("--ratio", "0.75"), "--ratio", 0.0, 1.0);
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
     << (per_sample ? ",\"batch\":" + std::to_string(batch) : std::string()) << ",\"stages\":[";
  if (!json) {
    out << "greenmim simulate: " << m->name << ", image " << m->image_size << ", window " << m->window
        << ", shift " << shift << ", ratio " << cfg.ratio << ", " << masks << " masks, seed " << seed << "\n"
        << "cost of one attention module, one image, mean over masks, in MFLOPs"
        << (!per_sample && model_name == "swin-b" && shift == 0 && m->window == 7 && cfg.ratio == 0.75 ? "; (paper) = the paper's appendix table" : "")
        << "\n\n";
  }
  for (int stage = 0; stage < 3; ++stage) {
    const index_t C = m->channels[stage];
    const window_geometry geo = make_window_geometry(m->grid(stage), m->grid(stage), m->window, shift);
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
        check(pl.run(sz, opt, p), "plan");
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
    js << (stage ? "," : "") << "{\"stage\":" << stage + 1 << ",\"grid\":" << m->grid(stage) << ",\"channels\":" << C
       << ",\"windows\":" << geo.num_windows() << ",\"visible_tokens\":" << cli::num(vis.mean());
    if (per_sample) {
      js << ",\"mflops_per_image\":{\"shared\":" << cli::num(shared_cost.mean()) << ",\"per_sample\":" << cli::num(ps_cost.mean())
         << ",\"lower_bound\":" << cli::num(ps_lb.mean()) << "},\"plan_us\":" << cli::num(ps_us, 6) << "}";
    } else {
      js << ",\"mflops\":{\"paper\":" << cli::num(paper.mean()) << ",\"paper_pxp\":" << cli::num(pxp.mean())
         << ",\"paper_max\":" << cli::num(maxw.mean()) << ",\"per_window\":" << cli::num(per_window.mean())
         << ",\"single\":" << cli::num(single.mean()) << ",\"fast\":" << cli::num(fast.mean())
         << ",\"lower_bound\":" << cli::num(lb.mean()) << "},\"fast_plan_us\":" << cli::num(fast_us.mean(), 6) << "}";
    }
    if (!json) {
      char buf[512];
      std::snprintf(buf, sizeof buf, "stage %d: grid %d, C %d, %d windows, %.0f visible tokens\n", stage + 1,
                    m->grid(stage), C, geo.num_windows(), vis.mean());
      out << buf;
      if (per_sample) {
        std::snprintf(buf, sizeof buf,
                      "  shared mask       %8.2f MFLOPs/image\n  per-sample masks  %8.2f MFLOPs/image (batch %d, lower bound %.2f, gap %.3f%%)\n"
                      "  planning          %8.1f us per batch plan (warm planner, median of 5)\n",
                      shared_cost.mean(), ps_cost.mean(), batch, ps_lb.mean(),
                      100 * (ps_cost.mean() - ps_lb.mean()) / ps_lb.mean(), ps_us);
        out << buf;
      } else {
        const bool show = model_name == "swin-b" && shift == 0 && cfg.ratio == 0.75;
        const paper_row& pr = kPaperSwinB[stage];
        auto row = [&](const char* name, double v, double ref) {
          if (show && ref > 0)
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
    if (cmd == "--help" || cmd == "-h" || cmd == "help") {
      out << kUsage;
      return 0;
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
        greenmim::demo::parse(argc - 2, argv + 2);
        return 0;
      }
      return greenmim_demo(argc - 2, argv + 2);
#else
      throw usage_error("demo needs the CPU reference (Eigen); rebuild with libeigen3-dev installed");
#endif
    }
    throw usage_error("unknown command '" + cmd + "' (plan, simulate, demo)");
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
