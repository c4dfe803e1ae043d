//! \file test_fwd_heads_emu.cpp
//! The several-heads-per-CTA forward test (test/gpu/test_attention_heads_gpu.cpp) on the CPU
//! emulator (this folder's test_*.cpp are globbed into greenmim_emu_tests), once more under the
//! reverse and a random thread schedule: a race between the head loop's barriers would change
//! the bits.
#include "../gpu/test_attention_heads_gpu.cpp"

#include "cuda_emu.hpp"

TEST_CASE("emulated attention forward: several heads per CTA under reverse and random thread schedules") {
  struct restore {
    ~restore() { gm_emu::set_schedule(gm_emu::schedule::forward); }
  } guard;
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const auto fast = greenmim::strategy::fast;  // plans with G <= 64 (see the GPU test)
  const problem stage1 = shared_mask_problem(rng, 56, 7, 0, 1, fast, 0, 64);
  const problem shifted = shared_mask_problem(rng, 28, 7, 3, 1, fast, 0, 64);
  for (gm_emu::schedule s : {gm_emu::schedule::reverse, gm_emu::schedule::random}) {
    gm_emu::set_schedule(s, 12345);
    INFO("schedule " << static_cast<int>(s));
    check_heads(stage1, GM_BFLOAT16, 4, true, true, false, false, rng);
    check_heads(shifted, GM_FLOAT16, 3, true, true, true, false, rng);
  }
}
