// The C++ snippet of README.md, compiled and run as a test (ctest: readme_example).
#include <cstdio>
#include <vector>

// example-begin
#include <greenmim/greenmim.hpp>

int main() {
  using namespace greenmim;
  // One shared mask for the micro-batch: 12 of 49 mask units visible (ratio 0.75).
  mask_config cfg;                                        // 224 px, 32 px units, ratio 0.75
  std::vector<std::uint8_t> units = random_mask(cfg, /*seed=*/0, /*stream=rank*/ 0);

  // Stage 1 of Swin-B: 56x56 tokens, windows of 7x7, not shifted.
  const model_shape& swin = *find_model("swin-b");
  std::vector<index_t> coords;                            // visible (h, w), row-major, packed
  check(visible_coords(span<const std::uint8_t>(units), cfg.grid(), swin.grid(0), coords));
  std::vector<index_t> sizes = window_sizes(swin.geometry(0, /*shifted=*/false), span<const index_t>(coords));

  // Plan: group size and groups, with the cost and a lower bound on any plan's cost.
  planner<flops_cost> pl(flops_cost{swin.channels[0]});  // reuse across steps: no allocation
  plan p;
  if (pl.run(span<const index_t>(sizes), planner_options{}, p) != status::success) return 1;
  std::printf("G = %d, %d groups, %.1f MFLOPs (within %.2f%% of the bound)\n", p.group_size,
              p.num_groups(), p.cost / 1e6, 100 * p.gap());
  return validate_plan(span<const index_t>(sizes), p) == status::success ? 0 : 1;
}
// example-end
