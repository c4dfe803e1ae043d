// libFuzzer target: argument checks of the C ABI (kernels.h) on the CPU emulator (kernels/emu),
// every entry point, one family per file:
//   fuzz_abi_attention.cpp  gm_attention_fwd / _bwd (+ can_implement, workspace size),
//                           gm_partition_tokens / gm_unpartition_tokens (+ can_implement)
//   fuzz_abi_conv.cpp       gm_depthwise_conv_fwd / _bwd (+ can_implement, workspace size),
//                           gm_block_conv_fwd / _bwd (+ can_implement)
//   fuzz_abi_index.cpp      gm_select_visible, gm_token_windows, gm_build_partition (CUB-style
//                           temporary storage: size queries, too little, misaligned)
// Each input picks a family (its last byte), builds a small valid call and mutates its
// arguments: extents, strides, ranks, null / misaligned / aliased pointers, out-of-range enum
// and scalar values, workspace size and alignment. Invariants:
//  - no crash, no undefined behaviour in the checks (UBSan), whatever the arguments;
//  - whatever is refused (cudaErrorInvalidValue) is refused before any launch (the emulator's
//    block counter does not move) with a reason in gm_last_refusal(), and touches no memory
//    (refused calls get fake, unmapped addresses);
//  - the entry point refuses whatever its can_implement refuses and accepts whatever
//    can_implement accepts (workspace_size fails exactly like can_implement);
//  - whatever is accepted runs without a fault when the arguments describe memory that exists:
//    every buffer is an emulated cudaMalloc of exactly the documented footprint (guard pages
//    stop the run on any access past it), inputs are written first.
#include "fuzz_abi_util.hpp"

#include <cstdio>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, size_t size) {
  // The emulator stops the process with _exit(86) on a fault (a guard page hit), before
  // libFuzzer can save the input: scripts/fuzz names a file that always holds the current one.
  static const char* last = std::getenv("GM_FUZZ_LAST_INPUT");
  if (last)
    if (std::FILE* f = std::fopen(last, "wb")) {
      std::fwrite(data, 1, size, f);
      std::fclose(f);
    }
  FuzzedDataProvider in(data, size);
  // 0 and 3: partition, 1: attention forward, 2: backward (the values of the first version, whose
  // corpus used the last byte modulo 4), 4: depthwise conv, 5: block conv, 6: gm_select_visible or
  // gm_token_windows, 7: gm_build_partition
  const int which = in.ConsumeIntegralInRange<int>(0, 7);
  if (which < 4) gm_fuzz_abi::fuzz_attention_family(in, which);
  else if (which < 6) gm_fuzz_abi::fuzz_conv_family(in, which == 5);
  else gm_fuzz_abi::fuzz_index_family(in, which == 7);
  return 0;
}
