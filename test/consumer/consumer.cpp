// Consumes greenmim as an outside project would: plan a few windows and check the result.
#include <greenmim/greenmim.hpp>

#include <cstdio>
#include <vector>

int main() {
  const std::vector<greenmim::index_t> sizes = {12, 30, 0, 7, 49, 3};
  greenmim::plan p;
  const greenmim::status s = greenmim::make_plan(greenmim::span<const greenmim::index_t>(sizes),
                                                 greenmim::planner_options{}, greenmim::flops_cost{128}, p);
  if (s != greenmim::status::success) {
    std::printf("plan failed: %s\n", greenmim::status_string(s));
    return 1;
  }
  std::printf("group size %d, %d groups, cost %.0f, lower bound %.0f\n", p.group_size, p.num_groups(),
              p.cost, p.lower_bound);
  return p.cost >= p.lower_bound && p.num_groups() > 0 ? 0 : 1;
}
