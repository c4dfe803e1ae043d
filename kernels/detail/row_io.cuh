//! \file row_io.cuh
//! Private: moving rows of elements between global memory and float registers, one vocabulary for
//! every kernel family (fp32 / fp16 / bf16 storage, fp32 arithmetic):
//! - `load(p, x)` / `store(p, x)`: a row's elements to / from a float array;
//! - `row_io<T, V>`: V = 1, 2 or 8 elements, a compile-time width (8: one 16-byte access);
//! - a load split in two, `fetch` (the row as loaded, `raw`) then `widen` (its floats), where a
//!   thread holds several rows in flight before it converts any, and `fetch_if`, a predicated
//!   fetch into the registers of the value it replaces (ptx.cuh's ldg16_if): the convs;
//! - `seg_io<T>`: 16 elements with a run-time `vec` (16-byte aligned or not), two row_io<T, 8>
//!   rows when aligned: the attention kernels' SIMT path.
//! One conversion per type: bf16 widens by bit placement (bf16_lo / bf16_hi, one integer
//! instruction a value), fp16 through half2 pairs, and 16-bit stores pack pairs. Built this way,
//! every kernel that uses it kept its registers (docs/perf/registers/issue-40/).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "device_common.cuh"
#include "ptx.cuh"

namespace greenmim {
namespace detail {
namespace cuda {

// ---- V-element row access ----------------------------------------------------------------------
// load = widen(fetch): `fetch` is the row as loaded (raw), `widen` its V
// floats, so that a thread can hold several rows' loads in flight before it converts any of them.
template <class T, int V>
struct row_io {  // V = 1 (and the generic case): element accesses
  struct raw { T e[V]; };
  __device__ __forceinline__ static raw fetch(const T* p) {
    raw r;
#pragma unroll
    for (int i = 0; i < V; ++i) r.e[i] = __ldg(p + i);
    return r;
  }
  __device__ __forceinline__ static void widen(const raw& r, float (&x)[V]) {
#pragma unroll
    for (int i = 0; i < V; ++i) x[i] = to_float(r.e[i]);
  }
  __device__ __forceinline__ static void load(const T* p, float (&x)[V]) { widen(fetch(p), x); }
  //! r = the row at p where `cond`, else r unchanged
  __device__ __forceinline__ static void fetch_if(raw& r, const T* p, bool cond) {
    if (cond) r = fetch(p);
  }
  __device__ __forceinline__ static void store(T* p, const float (&x)[V]) {
#pragma unroll
    for (int i = 0; i < V; ++i) p[i] = from_float<T>(x[i]);
  }
};

template <>
struct row_io<float, 8> {
  struct raw { float4 a, b; };
  __device__ __forceinline__ static raw fetch(const float* p) {
    return raw{__ldg(reinterpret_cast<const float4*>(p)), __ldg(reinterpret_cast<const float4*>(p) + 1)};
  }
  __device__ __forceinline__ static void widen(const raw& r, float (&x)[8]) {
    x[0] = r.a.x; x[1] = r.a.y; x[2] = r.a.z; x[3] = r.a.w; x[4] = r.b.x; x[5] = r.b.y; x[6] = r.b.z; x[7] = r.b.w;
  }
  __device__ __forceinline__ static void load(const float* p, float (&x)[8]) { widen(fetch(p), x); }
  __device__ __forceinline__ static void fetch_if(raw& r, const float* p, bool cond) {
    unsigned u[8];
    std::memcpy(u, &r, sizeof u);
    ldg16_if(u[0], u[1], u[2], u[3], p, cond);
    ldg16_if(u[4], u[5], u[6], u[7], p + 4, cond);
    std::memcpy(&r, u, sizeof u);
  }
  __device__ __forceinline__ static void store(float* p, const float (&x)[8]) {
    reinterpret_cast<float4*>(p)[0] = make_float4(x[0], x[1], x[2], x[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(x[4], x[5], x[6], x[7]);
  }
};

//! bf16 -> fp32 of the low / high half of a 32-bit word: the bf16's bits are the float's top half
//! (what __bfloat162float does), one integer instruction each where the conversion through the
//! library made two for the high half (PRMT, then a shift).
__device__ __forceinline__ float bf16_lo(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }

template <class T>
struct row_io16 {  // 8 x 2-byte elements in one 16-byte access
  using raw = uint4;
  __device__ __forceinline__ static raw fetch(const T* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
  __device__ __forceinline__ static void fetch_if(raw& r, const T* p, bool cond) { ldg16_if(r.x, r.y, r.z, r.w, p, cond); }
  __device__ __forceinline__ static void widen(const raw& v, float (&x)[8]) {
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
#pragma unroll
      for (int i = 0; i < 4; ++i) { x[2 * i] = bf16_lo(w[i]); x[2 * i + 1] = bf16_hi(w[i]); }
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        typename elem16<T>::pair t;
        std::memcpy(static_cast<void*>(&t), &w[i], sizeof t);
        const float2 f = elem16<T>::to_floats(t);
        x[2 * i] = f.x; x[2 * i + 1] = f.y;
      }
    }
  }
  __device__ __forceinline__ static void load(const T* p, float (&x)[8]) { widen(fetch(p), x); }
  __device__ __forceinline__ static void store(T* p, const float (&x)[8]) {  // pairs: one pack each
    unsigned w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const typename elem16<T>::pair t = elem16<T>::from_floats(x[2 * i], x[2 * i + 1]);
      std::memcpy(&w[i], &t, sizeof t);
    }
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  }
};
template <>
struct row_io<__half, 8> : row_io16<__half> {};
template <>
struct row_io<__nv_bfloat16, 8> : row_io16<__nv_bfloat16> {};

// 2 elements in one access (4 bytes for fp16/bf16, 8 for fp32): the gradient kernel's rows
template <class T>
struct row_io_pair {
  using T2 = typename elem16<T>::pair;
  __device__ __forceinline__ static void load(const T* p, float (&x)[2]) {
    const float2 f = elem16<T>::to_floats(__ldg(reinterpret_cast<const T2*>(p)));
    x[0] = f.x; x[1] = f.y;
  }
};
template <>
struct row_io<__half, 2> : row_io_pair<__half> {};
template <>
struct row_io<__nv_bfloat16, 2> {
  __device__ __forceinline__ static void load(const __nv_bfloat16* p, float (&x)[2]) {  // bf16_lo/hi
    const unsigned w = __ldg(reinterpret_cast<const unsigned*>(p));
    x[0] = bf16_lo(w); x[1] = bf16_hi(w);
  }
};
template <>
struct row_io<float, 2> {
  __device__ __forceinline__ static void load(const float* p, float (&x)[2]) {
    const float2 f = __ldg(reinterpret_cast<const float2*>(p));
    x[0] = f.x; x[1] = f.y;
  }
};

// ---- 16-element row segments (the attention kernels' SIMT path) ----------------------------------
// seg_io<T>::load / store move 16 consecutive elements between global memory and a float array.
// `vec` (warp-uniform in practice) says the segment start is 16-byte aligned: then two 8-element
// rows of row_io<T, 8> (16-byte accesses), else element accesses. Inputs are read through the
// read-only path where aligned.
template <class T>
struct seg_io {
  using row8 = row_io<T, 8>;
  __device__ __forceinline__ static float (&half(float (&x)[16], int h))[8] {
    return *reinterpret_cast<float(*)[8]>(x + 8 * h);
  }
  __device__ __forceinline__ static const float (&half(const float (&x)[16], int h))[8] {
    return *reinterpret_cast<const float(*)[8]>(x + 8 * h);
  }
  __device__ __forceinline__ static void load(const T* p, bool vec, float (&x)[16]) {
    if (vec) {
      row8::load(p, half(x, 0));
      row8::load(p + 8, half(x, 1));
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) x[i] = element(p + i);
    }
  }
  __device__ __forceinline__ static void store(T* p, bool vec, const float (&x)[16]) {
    if (vec) {
      row8::store(p, half(x, 0));
      row8::store(p + 8, half(x, 1));
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) p[i] = from_float<T>(x[i]);
    }
  }
  // an unaligned element: fp32 through the read-only path, 16-bit types as plain loads (as before)
  __device__ __forceinline__ static float element(const T* p) {
    if constexpr (std::is_same<T, float>::value) return __ldg(p);
    else return to_float(*p);
  }
};


}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
