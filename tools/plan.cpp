// `greenmim plan`: groups window sizes (given, on stdin, or those of a random mask on a model's
// stage) with the planner and prints the plan (text, or one JSON object with --json).
#include <greenmim/greenmim.hpp>
#include <greenmim/kernel_limits.hpp>

#include <chrono>
#include <istream>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "cli_common.hpp"
#include "commands.hpp"
#include "model_flags.hpp"

namespace greenmim::cli {
namespace {

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

}  // namespace

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
         swin_model_names_wrapped(20) + "\n" + geometry_usage() +
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

int cmd_plan(int argc, char** argv, std::istream& in, std::ostream& cout, const limits& lim) {
  args a(argc, argv,
              with_geometry_flags({"--sizes", "--channels", "--strategy", "--group-size", "--max-group", "--model", "--stage", "--seed"}),
              {"--json", "--shifted"});
  // Model mode: the windows of one random mask on a model's stage instead of given sizes.
  bool model_mode = a.has("--model") || a.has("--stage") || a.has("--seed") || a.has("--shifted");
  for (const auto& f : geometry_flags()) model_mode = model_mode || a.has(f);
  if (model_mode && a.has("--sizes"))
    throw usage_error("--sizes excludes --model and its flags: give window sizes or a model, not both");
  model_choice mc;
  int stage = 0;
  index_t shift = 0, visible = 0;
  std::uint64_t seed = 0;
  std::vector<index_t> model_sizes;
  if (model_mode) {
    mc = parse_model(a, "swin-b", lim);
    stage = static_cast<int>(parse_int(a.get("--stage", "1"), "--stage", 1, 4)) - 1;
    seed = parse_seed(a.get("--seed", "0"));
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
  const index_t channels = static_cast<index_t>(parse_int(
      a.get("--channels", model_mode ? std::to_string(mc.shape.channels[stage]) : "128"), "--channels", 1, 65536));
  planner_options opt;
  opt.strat = parse_strategy(a.get("--strategy", "fast"));
  if (a.has("--group-size")) {
    opt.group_size = static_cast<index_t>(parse_int(a.get("--group-size"), "--group-size", 1, max_total_size));
    if (opt.strat != strategy::fast && opt.strat != strategy::paper)
      throw usage_error("--group-size applies to --strategy fast or paper only");
  }
  if (a.has("--max-group")) {
    opt.max_group_size = static_cast<index_t>(parse_int(a.get("--max-group"), "--max-group", 1, max_total_size));
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
    auto v = parse_int_list(a.get("--sizes"), "--sizes", 0, max_window_size);
    lists.emplace_back(v.begin(), v.end());
  } else {
    std::string line;
    while (std::getline(in, line)) {
      auto v = parse_int_list(line, "stdin sizes", 0, max_window_size);
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
    out << "],\"fills\":" << json_list(p.fills, 0, p.fills.size()) << ",\"cost\":" << num(p.cost, 17)
        << ",\"lower_bound\":" << num(p.lower_bound, 17)
        << ",\"budget_exhausted\":" << (p.budget_exhausted ? "true" : "false");
    if (batch) out << ",\"sample_offsets\":" << json_list(sample_offsets, 0, sample_offsets.size());
    if (model_mode)
      out << ",\"model\":\"" << m.name << "\",\"image\":" << m.image_size << ",\"patch\":" << m.patch_size
          << ",\"mask_unit\":" << m.unit_size() << ",\"ratio\":" << num(mc.ratio) << ",\"seed\":" << seed
          << ",\"stage\":" << stage + 1 << ",\"grid\":" << m.grid(stage)
          << ",\"window\":" << m.geometry(stage, false).window << ",\"shift\":" << shift
          << ",\"visible_tokens\":" << visible << ",\"sizes\":" << json_list(sizes, 0, sizes.size())
          << ",\"cuda\":\"" << (cuda.empty() ? "accepted" : cuda) << "\"";
    out << ",\"plan_us\":" << num(us, 6) << "}\n";
  } else {
    if (model_mode) {
      out << "model        " << m.name << ", image " << m.image_size << ", patch " << m.patch_size << ", window "
          << m.window << ", mask unit " << m.unit_size() << ", ratio " << mc.ratio << ", seed " << seed << "\n"
          << "stage        " << stage + 1 << ": grid " << m.grid(stage) << ", window " << m.geometry(stage, false).window
          << ", shift " << shift << ", " << visible << " of " << m.grid(stage) * m.grid(stage) << " tokens visible\n";
      const std::string note = window_note(m, stage, a.has("--shifted"));
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
    out << "cost         " << num(p.cost / 1e6, 6) << " MFLOPs (C = " << channels << ")\n"
        << "lower bound  " << num(p.lower_bound / 1e6, 6) << " MFLOPs (gap " << num(100 * p.gap(), 3) << "%)\n"
        << (p.budget_exhausted ? "note         the planner's work budget ran out (sizes far beyond real windows): "
                                 "a valid plan, the gap above holds\n"
                               : "")
        << "planned in   " << num(us, 4) << " us\n";
    if (model_mode) out << "attention    " << path_note(m, stage, p.group_size) << "\n";
  }
  cout << out.str();
  return 0;
}

}  // namespace greenmim::cli
