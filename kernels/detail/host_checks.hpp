//! \file host_checks.hpp
//! Private, host only: argument checks shared by the C entry points (no device access, no
//! allocation, no exceptions), the thread-local refusal message, and conversions from the C
//! structs to the kernel parameter structs.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

#include <greenmim/kernels.h>

#include <greenmim/config.hpp>
#include <greenmim/partition_types.hpp>

namespace greenmim {
namespace detail {
namespace cuda {

//! Records why arguments were refused (a string literal) and returns cudaErrorInvalidValue.
cudaError_t refuse(const char* why) noexcept;
//! Clears the refusal message (called on entry of each checking function).
void clear_refusal() noexcept;

#define GM_REFUSE_IF(cond, why) \
  do {                          \
    if (cond) return ::greenmim::detail::cuda::refuse(why); \
  } while (0)

#define GM_TRY(expr)                        \
  do {                                      \
    const cudaError_t gm_err_ = (expr);     \
    if (gm_err_ != cudaSuccess) return gm_err_; \
  } while (0)

//! f() with every exception turned into cudaErrorUnknown: nothing throws across the C ABI.
template <class F>
cudaError_t no_throw(F&& f) noexcept {
  try {
    return f();
  } catch (...) {
    return cudaErrorUnknown;
  }
}

inline bool valid_dtype(gm_dtype d) { return d == GM_FLOAT32 || d == GM_FLOAT16 || d == GM_BFLOAT16; }
inline std::size_t dtype_bytes(gm_dtype d) {
  switch (d) {
    case GM_FLOAT32: return 4;
    case GM_FLOAT16:
    case GM_BFLOAT16: return 2;
  }
  return 0;
}

//! Product of the extents; extents are caller data (any int64), so a product beyond 9e18
//! saturates to the int64 maximum instead of overflowing (UB).
inline std::int64_t numel(const gm_tensor& t) {
  for (int i = 0; i < t.rank && i < 4; ++i)
    if (t.extent[i] == 0) return 0;
  std::int64_t n = 1;
  for (int i = 0; i < t.rank && i < 4; ++i) {
    if (static_cast<double>(n) * static_cast<double>(t.extent[i]) > 9.0e18 ||
        static_cast<double>(n) * static_cast<double>(t.extent[i]) < -9.0e18)
      return std::numeric_limits<std::int64_t>::max();
    n *= t.extent[i];
  }
  return n;
}

//! a * b for non-negative a, b, saturating at int64's maximum (extents are caller data: a plain
//! product can overflow).
inline std::int64_t mul_sat(std::int64_t a, std::int64_t b) {
  constexpr std::int64_t max = 0x7fffffffffffffff;
  return a != 0 && b > max / a ? max : a * b;
}

//! A bare int32 / float array pointer is element-aligned (a misaligned one faults on the device).
inline bool aligned4(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 4 == 0; }

//! No two index tuples address the same element (sorted by stride, each stride spans the
//! dimensions below it). Same test as the CPU reference.
inline bool is_injective(const gm_tensor& t) {
  if (numel(t) == 0) return true;
  int order[4] = {0, 1, 2, 3};
  const int r = t.rank < 0 ? 0 : (t.rank > 4 ? 4 : t.rank);
  for (int i = 1; i < r; ++i)  // insertion sort by stride (std::sort on 4 ints trips GCC 12's -Warray-bounds)
    for (int j = i; j > 0 && t.stride[order[j]] < t.stride[order[j - 1]]; --j) std::swap(order[j], order[j - 1]);
  std::int64_t below = 1;
  for (int i = 0; i < r; ++i) {
    const int d = order[i];
    if (t.extent[d] == 1) continue;
    if (t.extent[d] < 0 || t.stride[d] < below) return false;
    if (static_cast<double>(t.stride[d]) * static_cast<double>(t.extent[d] - 1) + static_cast<double>(below) > 9.0e18)
      return false;  // offsets beyond int64: refused (check_tensor's span test says the same)
    below = t.stride[d] * (t.extent[d] - 1) + below;
  }
  return true;
}

//! [lo, hi] byte range of a tensor (lo > hi when empty). Strides are non-negative (checked first).
inline void byte_range(const gm_tensor& t, std::size_t esize, std::uintptr_t& lo, std::uintptr_t& hi) {
  if (numel(t) == 0 || t.data == nullptr) { lo = 1; hi = 0; return; }
  std::int64_t mx = 0;
  for (int i = 0; i < t.rank; ++i) mx += (t.extent[i] - 1) * t.stride[i];
  lo = reinterpret_cast<std::uintptr_t>(t.data);
  hi = lo + static_cast<std::uintptr_t>(mx) * esize + esize - 1;
}

inline bool overlap(const gm_tensor& a, std::size_t ea, const gm_tensor& b, std::size_t eb) {
  std::uintptr_t alo, ahi, blo, bhi;
  byte_range(a, ea, alo, ahi);
  byte_range(b, eb, blo, bhi);
  if (alo > ahi || blo > bhi) return false;
  return alo <= bhi && blo <= ahi;
}

//! Rank, extents (exactly `ext`), non-negative strides, element alignment, non-null data when
//! non-empty, unit stride on the last dimension when `unit_last`, injective when `output`.
inline cudaError_t check_tensor(const gm_tensor& t, int rank, const std::int64_t* ext, std::size_t esize,
                                bool unit_last, bool output, const char* why) {
  GM_REFUSE_IF(t.rank != rank, why);
  for (int i = 0; i < rank; ++i) {
    GM_REFUSE_IF(t.extent[i] != ext[i], why);
    GM_REFUSE_IF(t.stride[i] < 0, why);
  }
  if (numel(t) == 0) return cudaSuccess;
  GM_REFUSE_IF(t.data == nullptr, why);
  GM_REFUSE_IF(reinterpret_cast<std::uintptr_t>(t.data) % esize != 0, why);
  GM_REFUSE_IF(unit_last && t.extent[rank - 1] > 1 && t.stride[rank - 1] != 1, why);
  GM_REFUSE_IF(output && !is_injective(t), why);
  // every offset must fit in int64 (and the byte range in the address space)
  double span = 0;
  for (int i = 0; i < rank; ++i) span += static_cast<double>(t.extent[i] - 1) * static_cast<double>(t.stride[i]);
  GM_REFUSE_IF(span * static_cast<double>(esize) > 9.0e18, why);
  return cudaSuccess;
}

//! Every row (all but the last dimension) starts 16-byte aligned.
inline bool rows_aligned16(const gm_tensor& t, std::size_t esize) {
  if (numel(t) == 0) return true;
  if (reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0) return false;
  for (int i = 0; i + 1 < t.rank; ++i)
    if (t.extent[i] > 1 && (static_cast<std::uint64_t>(t.stride[i]) * esize) % 16 != 0) return false;
  return true;
}

inline partition_view to_view(const gm_partition& p) {
  return partition_view{p.gather, p.scatter, p.slot_window, p.slot_coord, p.group_size, p.num_groups, p.num_tokens};
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
