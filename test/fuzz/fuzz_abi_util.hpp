// Shared pieces of the C ABI fuzzer (fuzz_abi*.cpp): pointer arguments described before they
// have memory, their mutations, exactly-sized emulated device buffers, and the refusal invariant.
#pragma once

#include <greenmim/kernels.h>

#include "cuda_emu.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <vector>

#include "fuzz_util.hpp"

namespace gm_fuzz_abi {

//! One pointer argument before it has memory: a strided tensor (gm_tensor), or a plain array
//! (`raw`: a rank-1 dense view of the documented length, passed as a bare pointer).
struct desc {
  int buffer = 0;           // which buffer: arguments with the same id alias; -1 = null pointer
  std::int64_t offset = 0;  // bytes from the buffer's start (misalignment when not a multiple)
  gm_tensor t{};
  bool raw = false;         // a bare pointer: only null / offset / aliasing are mutated
};

inline bool verbose() {
  static const bool v = std::getenv("GM_FUZZ_VERBOSE") != nullptr;
  return v;
}

//! Elements between the lowest and the highest address of an argument (0 when empty, -1 when
//! absurd: no memory for it, or more than 2^24 elements); `neg` = how far below `data` the
//! lowest one lies.
inline std::int64_t footprint_elems(const desc& a, std::int64_t& neg) {
  const gm_tensor& t = a.t;
  const std::int64_t max_extent = a.raw ? (1 << 20) : 4096;
  std::int64_t lo = 0, hi = 0;
  neg = 0;
  for (int i = 0; i < std::min(std::max(t.rank, 0), 4); ++i) {
    if (t.extent[i] <= 0) return 0;
    if (t.extent[i] > max_extent || t.stride[i] > (1 << 20) || t.stride[i] < -(1 << 20)) return -1;
    const std::int64_t d = (t.extent[i] - 1) * t.stride[i];
    (d < 0 ? lo : hi) += d;
  }
  neg = -lo;
  return hi - lo + 1 > (1 << 24) ? -1 : hi - lo + 1;
}

inline gm_tensor dense(std::initializer_list<std::int64_t> ext) {
  gm_tensor t{};
  t.rank = static_cast<int>(ext.size());
  int i = 0;
  for (auto e : ext) t.extent[i++] = e;
  std::int64_t s = 1;
  for (int k = t.rank - 1; k >= 0; --k) t.stride[k] = s, s *= t.extent[k];
  return t;
}

//! A bare array of n elements (n < 0: too long to allocate; fuzz_abi_index.cpp checks such calls
//! with null pointers only).
inline desc array(int buffer, std::int64_t n) {
  desc d{buffer, 0, dense({n}), true};
  return d;
}

//! A bare pointer: null, misaligned or aligned offset, or another argument's buffer.
inline void mutate_pointer(FuzzedDataProvider& in, desc& d) {
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0: d.buffer = -1; break;
    case 1: d.offset = in.ConsumeIntegralInRange<int>(1, 64); break;
    case 2: d.offset = 16 * in.ConsumeIntegralInRange<int>(1, 4); break;
    default: d.buffer = in.ConsumeIntegralInRange<int>(0, 12); break;
  }
}

inline void mutate(FuzzedDataProvider& in, desc& d) {
  if (d.raw) return mutate_pointer(in, d);
  switch (in.ConsumeIntegralInRange<int>(0, 9)) {
    case 0: d.buffer = -1; break;
    case 1: d.offset = in.ConsumeIntegralInRange<int>(0, 64); break;
    case 2: d.buffer = in.ConsumeIntegralInRange<int>(0, 12); break;  // alias another tensor
    case 3: d.t.rank = in.ConsumeIntegralInRange<int>(-1, 5); break;
    case 4: d.t.extent[in.ConsumeIntegralInRange<int>(0, 3)] = in.ConsumeIntegralInRange<int>(-2, 80); break;
    case 5: d.t.stride[in.ConsumeIntegralInRange<int>(0, 3)] = in.ConsumeIntegralInRange<int>(-80, 400); break;
    case 6: d.t.extent[in.ConsumeIntegralInRange<int>(0, 3)] = in.ConsumeIntegral<std::int64_t>(); break;
    case 7: d.t.stride[in.ConsumeIntegralInRange<int>(0, 3)] = in.ConsumeIntegral<std::int64_t>(); break;
    case 8: std::swap(d.t.stride[0], d.t.stride[1]); break;
    default: {  // a multiple of a stride (the factor is drawn first, as C++17 orders `s *= k`)
      const int k = in.ConsumeIntegralInRange<int>(0, 3);
      std::int64_t& s = d.t.stride[in.ConsumeIntegralInRange<int>(0, 3)];
      if (s <= INT64_MAX / 3 && s >= INT64_MIN / 3) s *= k;  // a huge one stays (no signed overflow)
      break;
    }
  }
}

// ---- device memory for the descriptors ---------------------------------------------------------
struct device_memory {
  std::vector<void*> bufs;
  std::vector<std::size_t> sizes;
  device_memory() = default;
  device_memory(const device_memory&) = delete;
  device_memory& operator=(const device_memory&) = delete;
  ~device_memory() {
    for (void* b : bufs) cudaFree(b);
  }
  void* alloc(std::size_t bytes, const void* init = nullptr, int fill = -1) {
    void* d = nullptr;
    if (cudaMalloc(&d, std::max<std::size_t>(bytes, 1)) != cudaSuccess) return nullptr;
    bufs.push_back(d);
    sizes.push_back(bytes);
    if (init) cudaMemcpy(d, init, bytes, cudaMemcpyHostToDevice);
    else if (fill >= 0) cudaMemset(d, fill, bytes);
    return d;
  }
  //! Every buffer's bytes (a refused call must leave them as they were).
  std::vector<std::vector<unsigned char>> snapshot() const {
    std::vector<std::vector<unsigned char>> s(bufs.size());
    for (size_t i = 0; i < bufs.size(); ++i) {
      s[i].resize(sizes[i]);
      if (sizes[i] > 0) cudaMemcpy(s[i].data(), bufs[i], sizes[i], cudaMemcpyDeviceToHost);
    }
    return s;
  }
};

//! Fake, never dereferenced, addresses far from each other (bit 36 and up): what refused calls
//! get, so that any access of a refused call is a crash.
inline char* fake_address(int k) { return reinterpret_cast<char*>((static_cast<std::uintptr_t>(k) + 1) << 36); }

//! Gives every descriptor a pointer: real memory (each buffer the largest footprint among the
//! arguments that share it, zero-filled: finite in every dtype) when `real`, else a fake
//! address. Returns false when some argument has no sensible footprint (then nothing is real).
inline bool place(const std::vector<desc*>& ds, const std::vector<std::size_t>& elem, bool real, device_memory& mem) {
  std::vector<std::int64_t> need(16, 0);
  std::vector<std::int64_t> neg(ds.size(), 0);
  bool ok = true;
  for (size_t i = 0; i < ds.size(); ++i) {
    if (ds[i]->buffer < 0) continue;
    const std::int64_t n = footprint_elems(*ds[i], neg[i]);
    if (n < 0) { ok = false; continue; }
    const std::int64_t bytes = ds[i]->offset + n * static_cast<std::int64_t>(elem[i]);
    need[ds[i]->buffer] = std::max(need[ds[i]->buffer], bytes);
  }
  std::vector<char*> base(16, nullptr);
  for (int b = 0; b < 16; ++b) {
    if (real && ok) base[b] = static_cast<char*>(mem.alloc(static_cast<std::size_t>(need[b]), nullptr, 0));
    else base[b] = fake_address(b);
  }
  for (size_t i = 0; i < ds.size(); ++i)
    ds[i]->t.data = ds[i]->buffer < 0 ? nullptr
                                      : base[ds[i]->buffer] + ds[i]->offset + neg[i] * static_cast<std::int64_t>(elem[i]);
  return ok;
}

//! Writes `v` (at most the array's length) into a placed bare array.
template <class T>
void upload(const desc& d, const std::vector<T>& v) {
  if (d.t.data == nullptr || v.empty()) return;
  const std::size_t n = std::min<std::size_t>(v.size(), static_cast<std::size_t>(std::max<std::int64_t>(d.t.extent[0], 0)));
  if (n > 0) cudaMemcpy(d.t.data, v.data(), n * sizeof(T), cudaMemcpyHostToDevice);
}

//! Refused with cudaErrorInvalidValue, a reason, and no block run since `blocks_before`.
inline bool refused_cleanly(cudaError_t e, std::uint64_t blocks_before) {
  return e == cudaErrorInvalidValue && gm_last_refusal()[0] != '\0' && gm_emu::blocks_run() == blocks_before;
}

// Element sizes are read after the mutations (a mutated dtype changes them); an invalid dtype
// sizes buffers as 4-byte elements (it is refused anyway).
inline std::size_t elem_bytes(gm_dtype d) { return d == GM_FLOAT16 || d == GM_BFLOAT16 ? 2 : 4; }

//! An accepted call on real memory: it must succeed and leave no fault behind.
inline void check_ran(cudaError_t e, const char* what) {
  GM_FUZZ_CHECK(e == cudaSuccess, "%s: accepted arguments failed to run: %d (%s) %s", what, static_cast<int>(e),
                gm_last_refusal(), gm_emu::last_fault().c_str());
  GM_FUZZ_CHECK(cudaDeviceSynchronize() == cudaSuccess, "%s: sync: %s", what, gm_emu::last_fault().c_str());
  if (verbose()) std::fprintf(stderr, "ran %s\n", what);
}

inline void print_descs(const std::vector<desc*>& ds) {
  for (const desc* t : ds)
    std::fprintf(stderr, "  buffer %d +%lld rank %d extent %lld %lld %lld %lld stride %lld %lld %lld %lld\n", t->buffer,
                 static_cast<long long>(t->offset), t->t.rank, static_cast<long long>(t->t.extent[0]),
                 static_cast<long long>(t->t.extent[1]), static_cast<long long>(t->t.extent[2]),
                 static_cast<long long>(t->t.extent[3]), static_cast<long long>(t->t.stride[0]),
                 static_cast<long long>(t->t.stride[1]), static_cast<long long>(t->t.stride[2]),
                 static_cast<long long>(t->t.stride[3]));
}

// The families (one file each); every one consumes the rest of the input.
void fuzz_attention_family(FuzzedDataProvider& in, int which);  // fuzz_abi_attention.cpp: 0..3
void fuzz_conv_family(FuzzedDataProvider& in, bool block);      // fuzz_abi_conv.cpp
void fuzz_index_family(FuzzedDataProvider& in, bool partition); // fuzz_abi_index.cpp

}  // namespace gm_fuzz_abi
