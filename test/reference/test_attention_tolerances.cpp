// The largest errors the test_attention_*.cpp cases recorded, printed with GREENMIM_TEST_VERBOSE=1
// and checked: this file sorts after them, and doctest runs files in name order, so it runs last.
#include "attention_test_util.hpp"

using namespace gm_attention_test;

TEST_CASE("reference attention: measured tolerances (printed with GREENMIM_TEST_VERBOSE=1)") {
  // Runs last (file order); prints the largest errors recorded by the tests above.
  if (std::getenv("GREENMIM_TEST_VERBOSE") != nullptr)
    for (const auto& kv : measured()) std::printf("  %-32s max rel err %.3e\n", kv.first.c_str(), kv.second);
  for (const auto& kv : measured()) CHECK(kv.second < 1e-5);
}

