//! \file cub_emu.hpp
//! Sequential host stand-ins for the three CUB device algorithms kernels/index_build.cu calls,
//! for its emulation build (kernels/emu). They keep CUB's two-phase temporary-storage protocol
//! (a null d_temp_storage asks for the size; too little storage is refused) so that the
//! builder's own carving of one allocation is exercised; the algorithms themselves are CUB's
//! business and are only verified on a GPU.
#pragma once

#include "cuda_emu.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

namespace thrust {
template <class T>
struct counting_iterator {
  T base;
  explicit counting_iterator(T b) : base(b) {}
  T operator[](std::int64_t i) const { return static_cast<T>(base + static_cast<T>(i)); }
};
}  // namespace thrust

namespace cub {
namespace emu_detail {
constexpr std::size_t temp_bytes = 512;  // any non-zero size: the protocol is what matters
inline bool phase(void* tmp, std::size_t& bytes, cudaError_t& e) {
  e = cudaSuccess;
  if (tmp == nullptr) {
    bytes = temp_bytes;
    return false;
  }
  if (bytes < temp_bytes) {
    e = cudaErrorInvalidValue;
    return false;
  }
  std::fill_n(static_cast<unsigned char*>(tmp), temp_bytes, static_cast<unsigned char>(0xA5));  // scribble
  return true;
}
}  // namespace emu_detail

struct DeviceSelect {
  template <class In, class Flags, class Out, class Num, class Offset>
  static cudaError_t Flagged(void* tmp, std::size_t& bytes, In in, Flags flags, Out out, Num num, Offset n,
                             cudaStream_t = nullptr) {
    cudaError_t e;
    if (!emu_detail::phase(tmp, bytes, e)) return e;
    std::int64_t k = 0;
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(n); ++i)
      if (flags[i]) out[k++] = in[i];
    *num = static_cast<std::remove_reference_t<decltype(*num)>>(k);
    return cudaSuccess;
  }
};

struct DeviceScan {
  template <class In, class Out, class Offset>
  static cudaError_t ExclusiveSum(void* tmp, std::size_t& bytes, In in, Out out, Offset n, cudaStream_t = nullptr) {
    cudaError_t e;
    if (!emu_detail::phase(tmp, bytes, e)) return e;
    std::remove_cv_t<std::remove_reference_t<decltype(in[0])>> acc{};
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(n); ++i) {
      const auto x = in[i];
      out[i] = acc;
      acc = acc + x;
    }
    return cudaSuccess;
  }
};

struct DeviceRadixSort {
  template <class K, class V, class Offset>
  static cudaError_t SortPairs(void* tmp, std::size_t& bytes, const K* keys_in, K* keys_out, const V* vals_in,
                               V* vals_out, Offset n, int begin_bit = 0, int end_bit = sizeof(K) * 8,
                               cudaStream_t = nullptr) {
    cudaError_t e;
    if (!emu_detail::phase(tmp, bytes, e)) return e;
    const std::int64_t count = static_cast<std::int64_t>(n);
    std::vector<std::int64_t> idx(static_cast<std::size_t>(count));
    std::iota(idx.begin(), idx.end(), 0);
    const int width = end_bit - begin_bit;
    const std::uint64_t m = width >= 64 ? ~0ull : ((1ull << width) - 1);
    auto key = [&](std::int64_t i) { return (static_cast<std::uint64_t>(keys_in[i]) >> begin_bit) & m; };
    std::stable_sort(idx.begin(), idx.end(), [&](std::int64_t a, std::int64_t b) { return key(a) < key(b); });
    std::vector<K> ko(static_cast<std::size_t>(count));
    std::vector<V> vo(static_cast<std::size_t>(count));
    for (std::int64_t i = 0; i < count; ++i) {
      ko[static_cast<std::size_t>(i)] = keys_in[idx[static_cast<std::size_t>(i)]];
      vo[static_cast<std::size_t>(i)] = vals_in[idx[static_cast<std::size_t>(i)]];
    }
    std::copy(ko.begin(), ko.end(), keys_out);
    std::copy(vo.begin(), vo.end(), vals_out);
    return cudaSuccess;
  }
};
}  // namespace cub
