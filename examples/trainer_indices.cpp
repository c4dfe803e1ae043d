// Example: greenmim's headers inside a trainer (greenmim::greenmim, header-only, no CUDA).
//
// What a masked-image-modeling trainer does every step with a Swin-B encoder that attends to
// visible tokens only: draw the step's mask, then for each of the four stages take the visible
// tokens, build the windows of the plain and the shifted blocks, plan the grouping (the
// planner is reused across steps, so it allocates nothing once warm), build the partition
// indices the attention kernel reads, and the patch-merging indices to the next stage.
// It prints each plan's cost and its gap to the planner's lower bound, and checks every index
// array it builds; the last line says whether all checks passed.
//
//   build/bin/example_trainer_indices [steps]      (default 4 steps)
#include <greenmim/greenmim.hpp>

#include <cstdio>
#include <cstdlib>
#include <vector>

using namespace greenmim;

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 4;
  const model_shape& swin = *find_model("swin-b");  // 224 px, patch 4, window 7, C = 128..1024
  mask_config cfg;                                  // 32 px mask units, ratio 0.75: 12 of 49 visible
  const std::uint64_t rank = 0;                     // each data-parallel rank draws its own stream

  // One planner per stage (each has its own cost model, C channels), kept for the whole run.
  std::vector<planner<flops_cost>> planners;
  for (int s = 0; s < 4; ++s) planners.emplace_back(flops_cost{swin.channels[s]});

  int failures = 0;
  auto expect = [&](bool ok, const char* what) {
    if (!ok) {
      std::printf("CHECK FAILED: %s\n", what);
      ++failures;
    }
  };
  double worst_gap = 0;

  std::printf("step stage shift tokens windows   G groups  MFLOPs   bound    gap\n");
  for (int step = 0; step < steps; ++step) {
    // One mask shared by the micro-batch (the paper's setting): the same indices serve every
    // sample, so they are built once per step, not per sample.
    const std::vector<std::uint8_t> units = random_mask(cfg, /*seed=*/static_cast<std::uint64_t>(step), rank);

    // Visible tokens of stage 1 (56 x 56 grid), packed (h, w) in row-major order.
    std::vector<index_t> coords;
    check(visible_coords(span<const std::uint8_t>(units), cfg.grid(), swin.grid(0), coords));

    for (int stage = 0; stage < 4; ++stage) {
      const index_t N = static_cast<index_t>(coords.size());
      // Blocks alternate plain / shifted windows; indices depend only on (mask, stage, shift), so
      // a trainer builds these two sets once per stage and reuses them for all its blocks and
      // for the backward pass.
      for (int shifted = 0; shifted < 2; ++shifted) {
        const window_geometry geom = swin.geometry(stage, shifted != 0);
        if (shifted && geom.shift == 0) continue;  // stage 4: one 7x7 window, nothing to shift

        window_list windows;  // the visible tokens of each window (CSR)
        check(build_windows(geom, span<const index_t>(coords), windows));
        const std::vector<index_t> sizes = windows.sizes();

        plan p;  // group size G, windows per group, cost and a lower bound on any plan's cost
        check(planners[stage].run(span<const index_t>(sizes), planner_options{}, p));
        expect(validate_plan(span<const index_t>(sizes), p) == status::success, "plan covers every window once");

        partition_indices part;  // gather / scatter / slot_window / slot_coord for the kernel
        check(build_partition(p, windows, part));
        expect(validate_partition(part) == status::success, "partition indices valid");
        expect(part.num_tokens == N, "partition over every visible token");

        index_t nonempty = 0;
        for (index_t w : sizes) nonempty += w > 0;
        std::printf("%4d %5d %5s %6d %7d %3d %6d %7.2f %7.2f %5.2f%%\n", step, stage + 1, shifted ? "yes" : "no", N,
                    nonempty, p.group_size, p.num_groups(), p.cost / 1e6, p.lower_bound / 1e6, 100 * p.gap());
        if (p.gap() > worst_gap) worst_gap = p.gap();
        expect(p.cost >= p.lower_bound * (1 - 1e-12), "cost at least the lower bound");
      }
      if (stage == 3) break;

      // Patch merging (Swin's PatchMerging on visible tokens): every visible 2x2 block becomes one
      // token of the next stage; gather4[4j .. 4j+3] are the stage tokens of x0, x1, x2, x3.
      std::vector<index_t> gather4, next;
      check(merge_indices(swin.grid(stage), swin.grid(stage), span<const index_t>(coords), gather4, next));
      expect(gather4.size() == 4 * next.size(), "merging takes 4 tokens per next-stage token");
      expect(gather4.size() == coords.size(), "every visible token merged exactly once");
      // The next stage's tokens equal the visible tokens of the mask at that stage's grid.
      std::vector<index_t> direct;
      check(visible_coords(span<const std::uint8_t>(units), cfg.grid(), swin.grid(stage + 1), direct));
      expect(next == direct, "merged coordinates equal the next stage's visible tokens");
      std::printf("%*s merge: %d tokens -> %d tokens (stage %d)\n", 20, "", N, static_cast<index_t>(next.size()),
                  stage + 2);
      coords.swap(next);
    }
  }
  std::printf("largest gap to the lower bound: %.3f%%\n", 100 * worst_gap);
  if (failures) {
    std::printf("trainer_indices: %d checks FAILED\n", failures);
    return 1;
  }
  std::printf("trainer_indices: all checks passed\n");
  return 0;
}
