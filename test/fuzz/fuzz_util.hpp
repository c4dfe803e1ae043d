// Shared helpers of the libFuzzer targets in test/fuzz: a check that stops the run with a message
// (libFuzzer then saves the input as a crash-* file), and bounded readers of the fuzz input.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define GM_FUZZ_CHECK(cond, ...)                                                   \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      std::fprintf(stderr, "%s:%d: invariant failed: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                           \
      std::fprintf(stderr, "\n");                                                  \
      std::abort();                                                                \
    }                                                                              \
  } while (0)

namespace gm_fuzz {

//! A size-like integer: mostly small, sometimes at or around a boundary, sometimes anything.
inline std::int32_t size_like(FuzzedDataProvider& in, std::int32_t small_max = 64) {
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0: return in.ConsumeIntegral<std::int32_t>();
    case 1: {
      static const std::int32_t edge[] = {0, 1, -1, 2, 48, 49, 64, 255, 256, 1 << 16, (1 << 20) - 1, 1 << 20,
                                          (1 << 20) + 1, 1 << 28, (1 << 30) + 1, 2147483647, -2147483647 - 1,
                                          23170, 23171, 32767, 32768};
      return edge[in.ConsumeIntegralInRange<size_t>(0, sizeof edge / sizeof edge[0] - 1)];
    }
    case 2: return in.ConsumeIntegralInRange<std::int32_t>(0, 4096);
    default: return in.ConsumeIntegralInRange<std::int32_t>(0, small_max);
  }
}

}  // namespace gm_fuzz
