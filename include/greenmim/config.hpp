//! \file config.hpp
//! Version, portability macros and the basic index type shared by host and device code.
#pragma once

#include <cstdint>

#define GREENMIM_VERSION_MAJOR 0
#define GREENMIM_VERSION_MINOR 1
#define GREENMIM_VERSION_PATCH 0

#if defined(__CUDACC__) || defined(__HIPCC__)
#define GREENMIM_HOST_DEVICE __host__ __device__
#define GREENMIM_DEVICE __device__
#else
#define GREENMIM_HOST_DEVICE
#define GREENMIM_DEVICE
#endif

#if defined(__CUDACC__)
#define GREENMIM_FORCEINLINE __forceinline__
#elif defined(__GNUC__) || defined(__clang__)
#define GREENMIM_FORCEINLINE inline __attribute__((always_inline))
#else
#define GREENMIM_FORCEINLINE inline
#endif

namespace greenmim {

//! Index type of every token/slot/window index array (int32: a batch of 256 images at 224 px
//! holds 256 * 3136 = 802,816 tokens per stage, far below 2^31).
using index_t = std::int32_t;

//! Sentinel written into gather indices and window ids for padded slots.
constexpr index_t pad_index = -1;

}  // namespace greenmim
