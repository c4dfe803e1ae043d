// Findings of the fuzzers in test/fuzz (see test/fuzz/README.md), kept as regression tests that
// run everywhere, with or without clang's libFuzzer.
#include <doctest/doctest.h>

#include <greenmim/greenmim.hpp>

#include <vector>

using namespace greenmim;

TEST_CASE("fuzz regression: a geometry beyond 32767 per side or window is invalid, not an overflow") {
  // fuzz_index: height 2045 * window, width 8421504: windows_h() * windows_w() overflowed int32
  // (UBSan) inside build_windows. Grids are addressed by pack_coord, 32767 per side at most.
  const window_geometry wide{16, 8421504, 7, 0};
  CHECK_FALSE(wide.valid());
  CHECK_FALSE((window_geometry{32768, 16, 7, 0}.valid()));
  CHECK_FALSE((window_geometry{16, 16, 32768, 0}.valid()));
  CHECK_FALSE((window_geometry{16, 16, 2147483647, 5}.valid()));
  CHECK((window_geometry{32767, 32767, 32767, 100}.valid()));
  window_list l;
  const std::vector<index_t> coords = {pack_coord(0, 0)};
  CHECK(build_windows(wide, span<const index_t>(coords), l) == status::invalid_argument);
  std::vector<index_t> sizes(4);
  CHECK(window_sizes(wide, span<const index_t>(coords), span<index_t>(sizes)) == status::invalid_argument);
}

TEST_CASE("fuzz regression: relative-position indices of a window above 23170 are refused, not overflowed") {
  // (2p-1)^2 rows overflow int32 for p > 23170: the row count and the index of two tokens of one
  // window far apart were signed overflows (UBSan) before the window bound was tightened.
  window_list l;
  const window_geometry g{1, 30000, 30000, 0};
  const std::vector<index_t> coords = {pack_coord(0, 0), pack_coord(0, 29999)};
  REQUIRE(build_windows(g, span<const index_t>(coords), l) == status::success);
  plan p;
  const std::vector<index_t> sizes = l.sizes();
  REQUIRE(make_plan(span<const index_t>(sizes), planner_options{}, 64, p) == status::success);
  partition_indices pi;
  REQUIRE(build_partition(p, l, pi) == status::success);
  std::vector<index_t> r(static_cast<size_t>(pi.num_groups) * pi.group_size * pi.group_size, 7);
  auto view = make_view(r.data(), pi.num_groups, pi.group_size, pi.group_size);
  CHECK(build_rel_pos_index(pi, 30000, view) == status::invalid_argument);
  CHECK(build_rel_pos_index(pi, max_rel_pos_window + 1, view) == status::invalid_argument);
  CHECK(r == std::vector<index_t>(r.size(), 7));
  const std::vector<float> table(4, 0.f);
  std::vector<float> bias(r.size(), 1.f);
  CHECK(build_rel_pos_bias<float>(pi, 30000, make_view(table.data(), 4, 1),
                                  make_view(bias.data(), pi.num_groups, 1, pi.group_size, pi.group_size)) ==
        status::invalid_argument);
  // the largest window still works (tokens 29999 apart do not share a 23170 window: out_of_range)
  CHECK(build_rel_pos_index(pi, max_rel_pos_window, view) == status::out_of_range);
}
