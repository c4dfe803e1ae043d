//! \file view.hpp
//! Non-owning views that cross every API boundary: `span<T>` (1-D, contiguous) and
//! `tensor_view<T, Rank>` (strided, strides in elements). Both are trivially copyable and can be
//! passed to CUDA kernels by value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "config.hpp"

namespace greenmim {

//! Contiguous 1-D view (a C++17 stand-in for std::span).
template <class T>
struct span {
  T* data_ = nullptr;
  std::int64_t size_ = 0;

  constexpr span() = default;
  GREENMIM_HOST_DEVICE constexpr span(T* d, std::int64_t n) : data_(d), size_(n) {}
  template <class U, class = std::enable_if_t<std::is_convertible<U (*)[], T (*)[]>::value>>
  GREENMIM_HOST_DEVICE constexpr span(span<U> o) : data_(o.data()), size_(o.size()) {}
  //! Views a std::vector (host only).
  template <class U, class A,
            class = std::enable_if_t<std::is_convertible<U (*)[], T (*)[]>::value>>
  span(std::vector<U, A>& v) : data_(v.data()), size_(static_cast<std::int64_t>(v.size())) {}
  template <class U, class A,
            class = std::enable_if_t<std::is_convertible<const U (*)[], T (*)[]>::value>>
  span(const std::vector<U, A>& v)
      : data_(v.data()), size_(static_cast<std::int64_t>(v.size())) {}

  GREENMIM_HOST_DEVICE constexpr T* data() const { return data_; }
  GREENMIM_HOST_DEVICE constexpr std::int64_t size() const { return size_; }
  GREENMIM_HOST_DEVICE constexpr bool empty() const { return size_ == 0; }
  GREENMIM_HOST_DEVICE constexpr T& operator[](std::int64_t i) const { return data_[i]; }
  GREENMIM_HOST_DEVICE constexpr T* begin() const { return data_; }
  GREENMIM_HOST_DEVICE constexpr T* end() const { return data_ + size_; }
  GREENMIM_HOST_DEVICE constexpr span subspan(std::int64_t off, std::int64_t n) const {
    return span(data_ + off, n);
  }
};

template <class T, class A>
span<T> make_span(std::vector<T, A>& v) { return span<T>(v); }
template <class T, class A>
span<const T> make_span(const std::vector<T, A>& v) { return span<const T>(v); }

//! Strided view of rank `Rank`; `stride` in elements. `extent[i] == 0` is allowed (empty view).
template <class T, int Rank>
struct tensor_view {
  static_assert(Rank >= 1, "rank must be positive");
  T* data = nullptr;
  std::int64_t extent[Rank] = {};
  std::int64_t stride[Rank] = {};

  GREENMIM_HOST_DEVICE constexpr std::int64_t numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < Rank; ++i) n *= extent[i];
    return n;
  }
  //! Element access; `idx` has exactly `Rank` entries.
  template <class... I>
  GREENMIM_HOST_DEVICE constexpr T& operator()(I... idx) const {
    static_assert(sizeof...(I) == Rank, "wrong number of indices");
    const std::int64_t ii[] = {static_cast<std::int64_t>(idx)...};
    std::int64_t off = 0;
    for (int i = 0; i < Rank; ++i) off += ii[i] * stride[i];
    return data[off];
  }
  //! True when the last dimension is unit-stride and each stride is the product of inner extents.
  GREENMIM_HOST_DEVICE constexpr bool is_contiguous() const {
    std::int64_t s = 1;
    for (int i = Rank - 1; i >= 0; --i) {
      if (extent[i] != 1 && stride[i] != s) return false;
      s *= extent[i];
    }
    return true;
  }
  //! Same extents (ignores strides).
  template <class U>
  GREENMIM_HOST_DEVICE constexpr bool same_extents(const tensor_view<U, Rank>& o) const {
    for (int i = 0; i < Rank; ++i)
      if (extent[i] != o.extent[i]) return false;
    return true;
  }
  operator tensor_view<const T, Rank>() const {
    tensor_view<const T, Rank> r;
    r.data = data;
    for (int i = 0; i < Rank; ++i) { r.extent[i] = extent[i]; r.stride[i] = stride[i]; }
    return r;
  }
};

//! Row-major contiguous view over `data` with the given extents.
template <class T, class... E>
tensor_view<T, sizeof...(E)> make_view(T* data, E... extents) {
  tensor_view<T, sizeof...(E)> v;
  v.data = data;
  const std::int64_t e[] = {static_cast<std::int64_t>(extents)...};
  std::int64_t s = 1;
  for (int i = static_cast<int>(sizeof...(E)) - 1; i >= 0; --i) {
    v.extent[i] = e[i];
    v.stride[i] = s;
    s *= e[i];
  }
  return v;
}

}  // namespace greenmim
