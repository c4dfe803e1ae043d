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
