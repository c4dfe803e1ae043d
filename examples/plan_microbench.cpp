// Example: microbenchmark the planner on your own mask distribution (greenmim::greenmim).
//
// Draws `--masks` random masks of the given image size and mask ratio, takes the visible tokens
// of one Swin stage, and plans every mask with each strategy: `fast` (ours, the default),
// `paper` (the paper's Algorithm 1), `per-window` (no grouping) and `single` (one group). For
// each it prints the mean cost (MFLOPs of one attention module, the paper's Eq. 6), the mean
// and worst gap to the best lower bound known for that mask (fast's a-posteriori bound), and the
// mean time per plan with a warm planner.
//
//   build/bin/example_plan_microbench [--image 224] [--ratio 0.75] [--unit 32] [--stage 1]
//       [--masks 100] [--window 7] [--channels C] [--shifted] [--seed 0] [--reps 3]
//
// e.g. --image 384 --ratio 0.6 for a larger, less masked input. `paper` sweeps every group size
// with a DP per size; above a work limit it refuses (shown as "refused"), as the library does.
#include <greenmim/greenmim.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace greenmim;

namespace {

struct args {
  index_t image = 224, unit = 32, window = 7, stage = 1, channels = 0;
  double ratio = 0.75;
  int masks = 100, reps = 3;
  std::uint64_t seed = 0;
  bool shifted = false;
};

bool parse(int argc, char** argv, args& a) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--shifted") { a.shifted = true; continue; }
    if (i + 1 >= argc) return false;
    const char* v = argv[++i];
    if (k == "--image") a.image = std::atoi(v);
    else if (k == "--ratio") a.ratio = std::atof(v);
    else if (k == "--unit") a.unit = std::atoi(v);
    else if (k == "--stage") a.stage = std::atoi(v);
    else if (k == "--window") a.window = std::atoi(v);
    else if (k == "--channels") a.channels = std::atoi(v);
    else if (k == "--masks") a.masks = std::atoi(v);
    else if (k == "--reps") a.reps = std::atoi(v);
    else if (k == "--seed") a.seed = std::strtoull(v, nullptr, 10);
    else return false;
  }
  return a.stage >= 1 && a.stage <= 4 && a.masks > 0 && a.reps > 0 && a.window > 0 && a.image > 0;
}

struct tally {
  double cost = 0, gap = 0, worst = 0, seconds = 0;
  int plans = 0, refused = 0;
};

}  // namespace

int main(int argc, char** argv) {
  args a;
  if (!parse(argc, argv, a)) {
    std::fprintf(stderr, "usage: %s [--image 224] [--ratio 0.75] [--unit 32] [--stage 1..4] [--masks 100] "
                         "[--window 7] [--channels C] [--shifted] [--seed 0] [--reps 3]\n", argv[0]);
    return 2;
  }
  // Swin-B's shape at the chosen image size: patch 4, channels 128 * 2^(stage-1) unless given.
  model_shape m = *find_model("swin-b");
  m.image_size = a.image;
  m.window = a.window;
  const int s = a.stage - 1;
  const index_t C = a.channels > 0 ? a.channels : m.channels[s];
  mask_config cfg{a.image, a.unit, a.ratio};
  if (cfg.validate() != status::success || m.grid(s) < 1 || m.grid(s) % cfg.grid() != 0) {
    std::fprintf(stderr, "image %d px: needs a multiple of the mask unit %d and a stage-%d grid the unit grid divides\n",
                 a.image, a.unit, a.stage);
    return 2;
  }
  const window_geometry geom = m.geometry(s, a.shifted);
  std::printf("image %d px, mask unit %d px, ratio %.2f, stage %d: %dx%d tokens, %d windows of %dx%d%s, C = %d, "
              "%d masks\n", a.image, a.unit, a.ratio, a.stage, m.grid(s), m.grid(s), geom.num_windows(), geom.window,
              geom.window, a.shifted ? " (shifted)" : "", C, a.masks);

  const strategy strategies[] = {strategy::fast, strategy::paper, strategy::per_window, strategy::single};
  planner<flops_cost> pl(flops_cost{C});  // one warm planner, reused: what a trainer does
  tally t[4];
  int failures = 0;
  for (int mask = 0; mask < a.masks; ++mask) {
    const std::vector<std::uint8_t> units = random_mask(cfg, a.seed + static_cast<std::uint64_t>(mask), 0);
    std::vector<index_t> coords;
    check(visible_coords(span<const std::uint8_t>(units), cfg.grid(), m.grid(s), coords));
    const std::vector<index_t> sizes = window_sizes(geom, span<const index_t>(coords));
    plan p[4];
    bool ok[4] = {};
    for (int k = 0; k < 4; ++k) {
      planner_options opt;
      opt.strat = strategies[k];
      const auto t0 = std::chrono::steady_clock::now();
      status st = status::success;
      for (int r = 0; r < a.reps && st == status::success; ++r) st = pl.run(span<const index_t>(sizes), opt, p[k]);
      const auto t1 = std::chrono::steady_clock::now();
      if (st == status::invalid_argument && opt.strat == strategy::paper) {  // sweep above the work guard
        ++t[k].refused;
        continue;
      }
      check(st);
      ok[k] = true;
      t[k].seconds += std::chrono::duration<double>(t1 - t0).count() / a.reps;
      if (validate_plan(span<const index_t>(sizes), p[k]) != status::success) ++failures;
    }
    const double bound = p[0].lower_bound;  // fast's a-posteriori bound: the tightest we have
    for (int k = 0; k < 4; ++k) {
      if (!ok[k]) continue;
      const double gap = bound > 0 ? p[k].cost / bound - 1 : 0;
      if (gap < -1e-12) ++failures;  // no plan may cost less than a lower bound
      t[k].cost += p[k].cost;
      t[k].gap += gap;
      t[k].worst = std::max(t[k].worst, gap);
      ++t[k].plans;
    }
    if (ok[1] && p[0].cost > p[1].cost * (1 + 1e-12)) ++failures;  // fast is never costlier than paper
  }

  std::printf("%-11s %12s %9s %9s %9s %10s\n", "strategy", "mean MFLOPs", "vs fast", "mean gap", "max gap", "us/plan");
  for (int k = 0; k < 4; ++k) {
    if (t[k].plans == 0) {
      std::printf("%-11s %12s   (refused: sweep above the work guard on %d masks)\n", strategy_name(strategies[k]),
                  "refused", t[k].refused);
      continue;
    }
    const double n = t[k].plans;
    std::printf("%-11s %12.2f %8.2fx %8.2f%% %8.2f%% %10.1f", strategy_name(strategies[k]), t[k].cost / n / 1e6,
                t[k].cost / t[0].cost * t[0].plans / n, 100 * t[k].gap / n, 100 * t[k].worst,
                1e6 * t[k].seconds / n);
    if (t[k].refused) std::printf("  (%d masks refused)", t[k].refused);
    std::printf("\n");
  }
  if (failures) {
    std::printf("plan_microbench: %d checks FAILED\n", failures);
    return 1;
  }
  std::printf("plan_microbench: checks passed (every plan valid, none below the bound, fast never above paper)\n");
  return 0;
}
