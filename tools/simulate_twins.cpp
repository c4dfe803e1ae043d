// `greenmim simulate --model twins-l|twins-b`: the encoder cost of Twins-SVT (alt_gvt) on the
// visible tokens of 32 px mask units (GreenMIM) against the same encoder on all tokens (the
// appendix's "MAE w/ all patches" baseline), stage by stage and part by part.
//
// Counts are multiply-adds, the paper's convention (its attention cost 4GC^2 + 2G^2C is one);
// LayerNorms, softmax, GELU, biases and residual adds are left out (linear in tokens and small).
// Per image, N tokens of a stage with C channels:
//   LSA  (ceil(depth/2) blocks): the planner's fast grouping of the visible windows (cost_model.hpp,
//        n_g (4GC^2 + 2G^2C)); all tokens: every p x p window full.
//   GSA  (floor(depth/2) blocks): q N C^2, sub-sampling conv (kernel = stride = sr, sr > 1) N C^2,
//        kv 2 M C^2, scores and weighted sum 2 N M C, proj N C^2, with M = N / sr^2 keys; on visible
//        tokens every key block is a whole visible mask unit (sparse_conv.hpp, block_table).
//   MLP  (every block): 2 * mlp_ratio * N C^2.
//   PEG  (once, after the first block): depthwise 3x3, 9 N C.
//   embed (before the stage): N C_in k^2 C, k = patch size at stage 1 (C_in = 3), else 2.
// Memory proxy: activations (sum over blocks of N C) and attention scores (heads x queries x keys,
// padding included for LSA groups), visible against all tokens.
#include <greenmim/random_masks.hpp>
#include <greenmim/models.hpp>
#include <greenmim/planner.hpp>
#include <greenmim/windows.hpp>

#include <cstdio>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "cli_common.hpp"
#include "cli_main.hpp"
#include "commands.hpp"

namespace greenmim::cli {

//! Cost parts of one stage, per image (multiply-adds) and memory proxies (elements).
struct twins_parts {
  double lsa = 0, gsa = 0, mlp = 0, peg = 0, embed = 0;
  double act = 0, scores = 0;
  double total() const { return lsa + gsa + mlp + peg + embed; }
  void add(const twins_parts& o, double w = 1) {
    lsa += w * o.lsa; gsa += w * o.gsa; mlp += w * o.mlp; peg += w * o.peg; embed += w * o.embed;
    act += w * o.act; scores += w * o.scores;
  }
};

//! One GSA module: n queries, m = n / sr^2 keys, C channels.
inline double twins_gsa_cost(double n, double m, double c, index_t sr) {
  return n * c * c + (sr > 1 ? n * c * c : 0.0) + 2 * m * c * c + 2 * n * m * c + n * c * c;
}

//! Everything of stage `s` but LSA's attention cost, for n tokens (n_in tokens before the patch
//! embedding: the previous stage's, or the image's patches at stage 1).
inline twins_parts twins_stage_parts(const twins_shape& m, int s, double n, double lsa_cost, double lsa_scores) {
  const double c = m.channels[s], sr2 = static_cast<double>(m.sr_ratios[s]) * m.sr_ratios[s];
  const int depth = m.depths[s], n_lsa = (depth + 1) / 2, n_gsa = depth / 2;
  twins_parts p;
  p.lsa = n_lsa * lsa_cost;
  p.gsa = n_gsa * twins_gsa_cost(n, n / sr2, c, m.sr_ratios[s]);
  p.mlp = depth * 2.0 * m.mlp_ratio * n * c * c;
  p.peg = 9 * n * c;
  const double c_in = s == 0 ? 3 : m.channels[s - 1], k = s == 0 ? m.patch_size : 2;
  p.embed = n * c_in * k * k * c;
  p.act = depth * n * c;
  p.scores = n_lsa * lsa_scores * m.heads[s] + n_gsa * n * (n / sr2) * m.heads[s];
  return p;
}

int simulate_twins(int argc, char** argv, std::ostream& cout, const limits& lim) {
  args a(argc, argv, {"--model", "--masks", "--seed", "--ratio", "--shift", "--curve", "--batch"},
         {"--json", "--per-sample"});
  for (const char* swin_only : {"--shift", "--curve", "--batch", "--per-sample"})
    if (a.has(swin_only))
      throw usage_error(std::string(swin_only) + " applies to the Swin models only (Twins: --masks, --seed, --ratio, --json)");
  const std::string name = a.get("--model", "twins-l");
  const twins_shape* m = find_twins_model(name.c_str());
  if (!m) throw usage_error("--model: unknown Twins model '" + name + "' (twins-b, twins-l)");
  const int masks = static_cast<int>(parse_int(a.get("--masks", "100"), "--masks", 1, lim.max_masks));
  const std::uint64_t seed = parse_seed(a.get("--seed", "0"));
  mask_config cfg;
  cfg.ratio = parse_double(a.get("--ratio", "0.75"), "--ratio", 0.0, 1.0);
  if (cfg.num_keep() == 0) throw usage_error("--ratio leaves no visible mask unit");
  const bool json = a.has("--json");

  twins_parts vis[4], all[4], vis_total, all_total;
  double vis_tokens[4] = {0, 0, 0, 0};
  planner<flops_cost> pl;
  plan p;
  planner_options opt;
  opt.strat = strategy::fast;
  for (int s = 0; s < 4; ++s) {
    const window_geometry geo = m->geometry(s);
    const double n_all = static_cast<double>(m->grid(s)) * m->grid(s);
    // all tokens: every window full (the grids are multiples of p here; the general case by the
    // window sizes of the full grid)
    std::vector<index_t> full;
    for (index_t h = 0; h < m->grid(s); ++h)
      for (index_t w = 0; w < m->grid(s); ++w) full.push_back(pack_coord(h, w));
    const auto full_sizes = window_sizes(geo, span<const index_t>(full));
    double lsa_all = 0, scores_all = 0;
    for (index_t w : full_sizes) {
      lsa_all += flops_cost{m->channels[s]}(w, 1);
      scores_all += static_cast<double>(w) * w;
    }
    all[s] = twins_stage_parts(*m, s, n_all, lsa_all, scores_all);
    pl = planner<flops_cost>(flops_cost{m->channels[s]});
    for (int i = 0; i < masks; ++i) {
      const auto um = random_mask(cfg, seed, static_cast<std::uint64_t>(i));
      std::vector<index_t> coords;
      check(visible_coords(span<const std::uint8_t>(um), cfg.grid(), m->grid(s), coords));
      const auto sizes = window_sizes(geo, span<const index_t>(coords));
      check(pl.run(span<const index_t>(sizes), opt, p), "plan");
      const double slots2 = static_cast<double>(p.num_groups()) * p.group_size * p.group_size;
      vis[s].add(twins_stage_parts(*m, s, static_cast<double>(coords.size()), p.cost, slots2), 1.0 / masks);
      vis_tokens[s] += static_cast<double>(coords.size()) / masks;
    }
    vis_total.add(vis[s]);
    all_total.add(all[s]);
  }

  std::ostringstream out;
  auto mf = [](double v) { return num(v / 1e6); };
  auto parts_json = [&](const twins_parts& q) {
    return "{\"lsa\":" + mf(q.lsa) + ",\"gsa\":" + mf(q.gsa) + ",\"mlp\":" + mf(q.mlp) + ",\"peg\":" + mf(q.peg) +
           ",\"embed\":" + mf(q.embed) + ",\"total\":" + mf(q.total()) + ",\"activations\":" + num(q.act) +
           ",\"attention_scores\":" + num(q.scores) + "}";
  };
  if (json) {
    out << "{\"model\":\"" << m->name << "\",\"masks\":" << masks << ",\"seed\":" << seed << ",\"ratio\":"
        << num(cfg.ratio) << ",\"unit\":\"MFLOPs (multiply-adds) per image\",\"stages\":[";
    for (int s = 0; s < 4; ++s)
      out << (s ? "," : "") << "{\"stage\":" << s + 1 << ",\"grid\":" << m->grid(s) << ",\"channels\":"
          << m->channels[s] << ",\"depth\":" << m->depths[s] << ",\"sr\":" << m->sr_ratios[s]
          << ",\"visible_tokens\":" << num(vis_tokens[s]) << ",\"all_tokens\":" << m->grid(s) * m->grid(s)
          << ",\"visible\":" << parts_json(vis[s]) << ",\"all\":" << parts_json(all[s])
          << ",\"ratio\":" << num(all[s].total() / vis[s].total()) << "}";
    out << "],\"total\":{\"visible\":" << parts_json(vis_total) << ",\"all\":" << parts_json(all_total)
        << ",\"flops_ratio\":" << num(all_total.total() / vis_total.total())
        << ",\"activations_ratio\":" << num(all_total.act / vis_total.act)
        << ",\"attention_scores_ratio\":" << num(all_total.scores / vis_total.scores) << "}"
        << ",\"paper\":{\"speedup_text\":2.6,\"time_h\":[2.6,0.8],\"memory_gb\":[408.3,102.3]}}\n";
  } else {
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "greenmim simulate: %s, image %d, window %d, sr %d/%d/%d/%d, ratio %g, %d masks, seed %llu\n"
                  "encoder cost of one image in MFLOPs (multiply-adds, the paper's convention), mean over masks:\n"
                  "visible tokens (GreenMIM: grouped LSA, GSA on sub-sampled visible keys, sparse convs) vs all "
                  "tokens\n\n",
                  m->name, m->image_size, m->window, m->sr_ratios[0], m->sr_ratios[1], m->sr_ratios[2],
                  m->sr_ratios[3], cfg.ratio, masks, static_cast<unsigned long long>(seed));
    out << buf;
    auto row = [&](const char* what, double v, double w) {
      std::snprintf(buf, sizeof buf, "  %-14s %12.2f %12.2f %8.2fx\n", what, v / 1e6, w / 1e6, v > 0 ? w / v : 0.0);
      out << buf;
    };
    auto table = [&](const twins_parts& v, const twins_parts& w) {
      std::snprintf(buf, sizeof buf, "  %-14s %12s %12s %9s\n", "", "visible", "all tokens", "ratio");
      out << buf;
      row("LSA", v.lsa, w.lsa);
      row("GSA", v.gsa, w.gsa);
      row("MLP", v.mlp, w.mlp);
      row("PEG", v.peg, w.peg);
      row("patch embed", v.embed, w.embed);
      row("total", v.total(), w.total());
    };
    for (int s = 0; s < 4; ++s) {
      std::snprintf(buf, sizeof buf, "stage %d: grid %d, C %d, %d blocks (%d LSA, %d GSA sr %d), %.0f of %d tokens visible\n",
                    s + 1, m->grid(s), m->channels[s], m->depths[s], (m->depths[s] + 1) / 2, m->depths[s] / 2,
                    m->sr_ratios[s], vis_tokens[s], m->grid(s) * m->grid(s));
      out << buf;
      table(vis[s], all[s]);
      out << "\n";
    }
    out << "encoder:\n";
    table(vis_total, all_total);
    std::snprintf(buf, sizeof buf,
                  "\nmemory proxies (all / visible): activations %.2fx, attention scores %.2fx\n"
                  "paper (appendix, Twins-L, whole pre-training incl. decoder): 2.6 h -> 0.8 h (text: 2.6x "
                  "speed-up), 408.3 GB -> 102.3 GB (%.2fx)\n",
                  all_total.act / vis_total.act, all_total.scores / vis_total.scores, 408.3 / 102.3);
    out << buf;
  }
  cout << out.str();
  return 0;
}

}  // namespace greenmim::cli
