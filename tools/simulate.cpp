// `greenmim simulate`: the cost of one attention module per stage (MFLOPs, one image), mean over
// random masks, for the paper's Algorithm 1 and its variants, per-window, single group, the fast
// planner and its lower bound (the paper's appendix table "Influence of the optimal grouping");
// with --per-sample, every sample its own mask and a batch planned together; --curve writes the
// cost against G (the paper's figure). Twins models: simulate_twins.cpp.
#include <greenmim/greenmim.hpp>
#include <greenmim/kernel_limits.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "cli_common.hpp"
#include "commands.hpp"
#include "model_flags.hpp"

namespace greenmim::cli {
namespace {

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

//! The parsed flags and what follows from them.
struct setup {
  model_choice mc;
  const model_shape* m = nullptr;
  bool paper_setup = false;  // the paper's appendix set-up: Swin-B, 224 px, patch 4, window 7, 32 px units
  int masks = 0, batch = 1, num_stages = 3;
  std::uint64_t seed = 0;
  index_t shift = 0;
  mask_config cfg;
  bool per_sample = false, json = false;
  std::ofstream curve;
  bool show_paper() const { return paper_setup && shift == 0 && cfg.ratio == 0.75; }
};

//! Every statistic of one stage over the masks.
struct stage_stats {
  index_t C = 0, max_group = 0;  // max_group: largest G of the fast plans, what the CUDA kernels would be given
  window_geometry geo;
  double all_tokens = 0, ps_us = 0;
  stat_acc paper, pxp, maxw, per_window, single, fast, lb, vis, fast_us, shared_cost, ps_cost, ps_lb;
};

void parse(int argc, char** argv, const limits& lim, const args& a, setup& su) {
  su.mc = parse_model(a, "swin-b", lim, ", twins-b, twins-l");
  su.m = &su.mc.shape;
  const model_shape* m = su.m;
  su.paper_setup = a.get("--model", "swin-b") == "swin-b" && m->image_size == 224 && m->patch_size == 4 &&
                   m->window == 7 && m->unit_size() == 32;
  su.masks = static_cast<int>(parse_int(a.get("--masks", "100"), "--masks", 1, lim.max_masks));
  su.seed = parse_seed(a.get("--seed", "0"));
  su.shift = static_cast<index_t>(parse_int(a.get("--shift", "0"), "--shift", 0, m->window - 1));
  su.cfg = su.mc.masking();
  {  // the planner's total: stage 1's visible tokens (the fuzzer lowers the bound)
    const std::int64_t per_unit = m->unit_size() / m->patch_size;
    if (static_cast<std::int64_t>(su.cfg.num_keep()) * per_unit * per_unit > lim.max_total)
      throw usage_error("stage 1 has more visible tokens than " + std::to_string(lim.max_total));
  }
  su.per_sample = a.has("--per-sample");
  su.batch = static_cast<int>(parse_int(a.get("--batch", su.per_sample ? "256" : "1"), "--batch", 1, lim.max_batch));
  if (a.has("--batch") && !su.per_sample) throw usage_error("--batch applies to --per-sample only");
  if (su.per_sample && a.has("--curve")) throw usage_error("--curve is not available with --per-sample");
  if (su.cfg.num_keep() == 0) throw usage_error("--ratio leaves no visible mask unit");
  su.json = a.has("--json");
  const std::string curve_path = a.get("--curve");
  if (a.has("--curve")) {
    if (curve_path.empty()) throw usage_error("--curve needs a file name");
    su.curve.open(lim.write_files ? curve_path : std::string("/dev/null"));
    if (!su.curve) throw usage_error("--curve: cannot write '" + curve_path + "'");
    su.curve << "stage,group_size,masks,mean_mflops,std_mflops,fast_mean_mflops\n";
  }
  // Stages 1-3 (stage 4 is one window at every preset); stage 4 too when it has several windows.
  su.num_stages = m->geometry(3, false).num_windows() > 1 ? 4 : 3;
  (void)argc;
  (void)argv;
}

//! SimMIM's baseline cost of a stage: every token, every (unshifted: SimMIM rolls) window full.
double all_tokens_cost(const model_shape& m, int stage, index_t C) {
  std::vector<index_t> full;
  for (index_t h = 0; h < m.grid(stage); ++h)
    for (index_t w = 0; w < m.grid(stage); ++w) full.push_back(pack_coord(h, w));
  double cost = 0;
  for (index_t w : window_sizes(m.geometry(stage, false), span<const index_t>(full))) cost += flops_cost{C}(w, 1) / 1e6;
  return cost;
}

//! One mask per micro-batch (stream = mask index), the paper's batch-wise masking: every strategy
//! on each mask's window sizes, and the --curve rows.
void shared_masks(setup& su, int stage, planner<flops_cost>& pl, stage_stats& st) {
  const model_shape* m = su.m;
  std::vector<stat_acc> curve_paper, curve_fast;
  plan p;
  planner_options opt;
  for (int i = 0; i < su.masks; ++i) {
    const auto um = random_mask(su.cfg, su.seed, static_cast<std::uint64_t>(i));
    std::vector<index_t> coords;
    check(visible_coords(span<const std::uint8_t>(um), su.cfg.grid(), m->grid(stage), coords));
    const auto sizes = window_sizes(st.geo, span<const index_t>(coords));
    const span<const index_t> sz(sizes);
    st.vis.add(static_cast<double>(coords.size()));
    auto run = [&](strategy s, index_t g) {
      opt.strat = s;
      opt.group_size = g;
      const status r = pl.run(sz, opt, p);
      // the paper's sweep refuses sizes beyond its work guard (a custom geometry): n/a
      if (r == status::invalid_argument && s == strategy::paper && g == 0) return std::numeric_limits<double>::quiet_NaN();
      check(r, "plan");
      return p.cost / 1e6;
    };
    index_t mx = 0;
    std::int64_t S = 0;
    for (auto w : sizes) { mx = std::max(mx, w); S += w; }
    if (!su.per_sample) {
      st.paper.add(run(strategy::paper, 0));
      st.pxp.add(run(strategy::paper, std::max(mx, m->window * m->window)));
      st.maxw.add(run(strategy::paper, mx));
      st.per_window.add(run(strategy::per_window, 0));
      st.single.add(run(strategy::single, 0));
    }
    const auto t0 = std::chrono::steady_clock::now();
    st.fast.add(run(strategy::fast, 0));
    st.max_group = std::max(st.max_group, p.group_size);
    if (!su.per_sample) st.fast_us.add(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    st.lb.add(p.lower_bound / 1e6);
    st.shared_cost.add(p.cost / 1e6);
    if (su.curve.is_open()) {
      if (curve_paper.empty()) { curve_paper.resize(static_cast<size_t>(S) + 1); curve_fast.resize(static_cast<size_t>(S) + 1); }
      for (index_t g = 1; g <= static_cast<index_t>(curve_paper.size()) - 1; ++g) {
        if (g < mx) continue;
        curve_paper[g].add(run(strategy::paper, g));
        curve_fast[g].add(run(strategy::fast, g));
      }
    }
  }
  if (su.curve.is_open()) {
    for (size_t g = 1; g < curve_paper.size(); ++g) {
      if (!curve_paper[g].n) continue;
      su.curve << stage + 1 << "," << g << "," << curve_paper[g].n << "," << num(curve_paper[g].mean()) << ","
               << num(curve_paper[g].std()) << "," << num(curve_fast[g].mean()) << "\n";
    }
  }
}

//! Per-sample masks: `batch` samples, each its own mask, planned together as one batch, `masks`
//! rounds; a trainer reuses its planner every step: the warm planner is timed, median of 5 runs.
void per_sample_masks(const setup& su, int stage, planner<flops_cost>& pl, stage_stats& st) {
  plan p;
  planner_options opt;
  std::vector<index_t> batch_sizes;
  double total_us = 0;
  for (int r = 0; r < su.masks; ++r) {
    batch_sizes.clear();
    for (int b = 0; b < su.batch; ++b) {
      const auto um = random_mask(su.cfg, su.seed, static_cast<std::uint64_t>(1000003) * (r + 1) + b);
      std::vector<index_t> coords;
      check(visible_coords(span<const std::uint8_t>(um), su.cfg.grid(), su.m->grid(stage), coords));
      const auto sizes = window_sizes(st.geo, span<const index_t>(coords));
      batch_sizes.insert(batch_sizes.end(), sizes.begin(), sizes.end());
    }
    opt.strat = strategy::fast;
    opt.group_size = 0;
    double runs[5];
    for (double& t : runs) {
      const auto t0 = std::chrono::steady_clock::now();
      check(pl.run(span<const index_t>(batch_sizes), opt, p), "plan");
      t = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    }
    std::nth_element(runs, runs + 2, runs + 5);
    total_us += runs[2];
    st.ps_cost.add(p.cost / 1e6 / su.batch);
    st.ps_lb.add(p.lower_bound / 1e6 / su.batch);
  }
  st.ps_us = total_us / su.masks;
}

void json_stage(const setup& su, int stage, const stage_stats& st, const std::string& cuda, std::ostream& js) {
  const model_shape* m = su.m;
  js << (stage ? "," : "") << "{\"stage\":" << stage + 1 << ",\"grid\":" << m->grid(stage) << ",\"channels\":" << st.C
     << ",\"windows\":" << st.geo.num_windows() << ",\"window\":" << st.geo.window << ",\"shift\":" << st.geo.shift
     << ",\"visible_tokens\":" << num(st.vis.mean()) << ",\"max_group_size\":" << st.max_group << ",\"cuda\":\""
     << (cuda.empty() ? "accepted" : cuda) << "\"";
  if (su.per_sample) {
    js << ",\"mflops_per_image\":{\"shared\":" << num(st.shared_cost.mean()) << ",\"per_sample\":" << num(st.ps_cost.mean())
       << ",\"lower_bound\":" << num(st.ps_lb.mean()) << ",\"all_tokens\":" << num(st.all_tokens)
       << "},\"plan_us\":" << num(st.ps_us, 6) << "}";
  } else {
    js << ",\"mflops\":{\"paper\":" << num(st.paper.mean()) << ",\"paper_pxp\":" << num(st.pxp.mean())
       << ",\"paper_max\":" << num(st.maxw.mean()) << ",\"per_window\":" << num(st.per_window.mean())
       << ",\"single\":" << num(st.single.mean()) << ",\"fast\":" << num(st.fast.mean())
       << ",\"lower_bound\":" << num(st.lb.mean()) << ",\"all_tokens\":" << num(st.all_tokens)
       << "},\"fast_plan_us\":" << num(st.fast_us.mean(), 6) << "}";
  }
}

void text_stage(const setup& su, int stage, const stage_stats& st, const std::string& cuda, std::ostream& out) {
  const model_shape* m = su.m;
  char buf[512];
  std::snprintf(buf, sizeof buf, "stage %d: grid %d, C %d, %d windows, %.0f visible tokens", stage + 1, m->grid(stage),
                st.C, st.geo.num_windows(), st.vis.mean());
  out << buf;
  if (st.geo.window != m->window || st.geo.shift != su.shift)
    out << " (window " << st.geo.window << ", shift " << st.geo.shift << ": small-stage rule)";
  out << "\n";
  if (!cuda.empty()) out << "  note: " << path_note(*m, stage, st.max_group) << "\n";
  if (su.per_sample) {
    std::snprintf(buf, sizeof buf,
                  "  shared mask       %8.2f MFLOPs/image\n  per-sample masks  %8.2f MFLOPs/image (batch %d, lower bound %.2f, gap %.3f%%)\n"
                  "  planning          %8.1f us per batch plan (warm planner, median of 5)\n",
                  st.shared_cost.mean(), st.ps_cost.mean(), su.batch, st.ps_lb.mean(),
                  100 * (st.ps_cost.mean() - st.ps_lb.mean()) / st.ps_lb.mean(), st.ps_us);
    out << buf;
    return;
  }
  const bool show = su.show_paper();
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
  row("paper (Algorithm 1, sweep G)", st.paper.mean(), pr.paper);
  row("paper DP at G = p*p", st.pxp.mean(), pr.pxp);
  row("paper DP at G = max w", st.maxw.mean(), pr.maxw);
  row("per-window (no DP)", st.per_window.mean(), pr.per_window);
  row("single group (G = sum w)", st.single.mean(), pr.single);
  row("fast (ours)", st.fast.mean(), 0);
  row("lower bound", st.lb.mean(), 0);
  const double lb = st.lb.mean();
  if (std::isnan(st.paper.mean()))
    std::snprintf(buf, sizeof buf, "  fast vs bound %+.2f%%, fast plans in %.1f us\n\n", 100 * (st.fast.mean() - lb) / lb,
                  st.fast_us.mean());
  else
    std::snprintf(buf, sizeof buf, "  fast vs bound %+.2f%%, paper vs bound %+.2f%%, fast plans in %.1f us\n\n",
                  100 * (st.fast.mean() - lb) / lb, 100 * (st.paper.mean() - lb) / lb, st.fast_us.mean());
  out << buf;
}

void text_header(const setup& su, std::ostream& out) {
  const model_shape* m = su.m;
  out << "greenmim simulate: " << m->name << ", image " << m->image_size << ", window " << m->window
      << (m->patch_size != 4 || m->unit_size() != 32
              ? ", patch " + std::to_string(m->patch_size) + ", mask unit " + std::to_string(m->unit_size())
              : std::string())
      << ", shift " << su.shift << ", ratio " << su.cfg.ratio << ", " << su.masks << " masks, seed " << su.seed << "\n"
      << "cost of one attention module, one image, mean over masks, in MFLOPs"
      << (!su.per_sample && su.show_paper() ? "; (paper) = the paper's appendix table" : "") << "\n";
  for (int stage = 0; stage < su.num_stages; ++stage) {
    const std::string note = window_note(*m, stage, su.shift > 0);
    if (!note.empty()) out << "note: " << note << "\n";
  }
  out << "\n";
}

}  // namespace

std::string simulate_usage() {
  return std::string(
             "usage: greenmim simulate [flags]\n"
             "Cost of one attention module per stage (MFLOPs, one image), mean over random masks: the\n"
             "paper's Algorithm 1 and its variants, per-window, single group, the fast planner, the bound.\n"
             "\n"
             "  --model NAME      default swin-b; ") +
         swin_model_names_wrapped(20) +
         "\n"
         "                    twins-b, twins-l: Twins encoder cost (--masks --seed --ratio --json only)\n" +
         geometry_usage() +
         "  --masks N         random masks (default 100)\n"
         "  --seed N          mask seed (default 0)\n"
         "  --shift S         window shift in tokens, 0..P-1 (default 0)\n"
         "  --curve FILE      also write the cost against G per stage as CSV (not with --per-sample)\n"
         "  --per-sample      every sample its own mask, a batch planned together\n"
         "  --batch N         samples per batch with --per-sample (default 256)\n"
         "  --json            one JSON object on one line\n"
         "  --help            this text\n";
}


int cmd_simulate(int argc, char** argv, std::ostream& cout, const limits& lim) {
  args a(argc, argv, with_geometry_flags({"--model", "--masks", "--seed", "--shift", "--curve", "--batch"}),
         {"--json", "--per-sample"});
  if (find_twins_model(a.get("--model", "swin-b").c_str())) {
    for (const char* swin_only : {"--image", "--patch", "--window", "--mask-unit"})
      if (a.has(swin_only))
        throw usage_error(std::string(swin_only) + " applies to the Swin models only (Twins: --masks, --seed, --ratio, --json)");
    return simulate_twins(argc, argv, cout, lim);
  }
  setup su;
  parse(argc, argv, lim, a, su);
  const model_shape* m = su.m;
  std::ostringstream out, js;
  js << "{\"model\":\"" << m->name << "\",\"masks\":" << su.masks << ",\"seed\":" << su.seed << ",\"shift\":" << su.shift
     << (su.per_sample ? ",\"batch\":" + std::to_string(su.batch) : std::string()) << ",\"image\":" << m->image_size
     << ",\"patch\":" << m->patch_size << ",\"window\":" << m->window << ",\"mask_unit\":" << m->unit_size()
     << ",\"ratio\":" << num(su.cfg.ratio) << ",\"stages\":[";
  if (!su.json) text_header(su, out);
  planner<flops_cost> pl;
  for (int stage = 0; stage < su.num_stages; ++stage) {
    stage_stats st;
    st.C = m->channels[stage];
    st.geo = make_window_geometry(m->grid(stage), m->grid(stage), m->window, su.shift);
    st.all_tokens = all_tokens_cost(*m, stage, st.C);
    pl = planner<flops_cost>(flops_cost{st.C});
    shared_masks(su, stage, pl, st);
    if (su.per_sample) per_sample_masks(su, stage, pl, st);
    const std::string cuda = cuda_attention_refusal(st.geo.window, st.max_group, m->head_dim);
    json_stage(su, stage, st, cuda, js);
    if (!su.json) text_stage(su, stage, st, cuda, out);
  }
  js << "]}\n";
  cout << (su.json ? js.str() : out.str());
  return 0;
}

}  // namespace greenmim::cli
