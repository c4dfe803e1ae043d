//! \file row_io.cuh
//! Private: moving rows of elements between global memory and float registers, one vocabulary for
//! every kernel family (fp32 / fp16 / bf16 storage, fp32 arithmetic):
//! - `load(p, x)` / `store(p, x)`: a row's elements to / from a float array;
//! - the width is a template parameter where a kernel knows it (`row_io<T, V>`, V = 1, 2 or 8
//!   elements: the convolution kernels) or `seg_io<T>`'s 16 elements with a run-time `vec` where
//!   the alignment is known only at run time (the attention kernels' SIMT path);
//! - a load split in two, `fetch` (the row as loaded, `raw`) then `widen` (its floats), where a
//!   thread holds several rows in flight before it converts any, and `fetch_if`, a predicated
//!   fetch into the registers of the value it replaces (ptx.cuh's ldg16_if).
//! The two families keep their own conversion sequences: seg_io's bf16 goes through
//! __bfloat1622float2 and row_io's through bf16_lo / bf16_hi (the same values, one integer
//! instruction each), as each kernel's register count was measured with it
//! (docs/perf/registers/issue-40/).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "device_common.cuh"
#include "ptx.cuh"

namespace greenmim {
namespace detail {
namespace cuda {

// ---- 16-element row segments ------------------------------------------------------------------
// load_seg / store_seg move E = 16 consecutive elements between global memory and a float array.
// `vec` (warp-uniform in practice) says the segment start is 16-byte aligned: then 16-byte
// accesses are used, else element accesses. Inputs are read through the read-only path.

template <class T>
struct seg_io;

template <>
struct seg_io<float> {
  __device__ __forceinline__ static void load(const float* p, bool vec, float (&x)[16]) {
    if (vec) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 v = __ldg(reinterpret_cast<const float4*>(p) + i);
        x[4 * i] = v.x; x[4 * i + 1] = v.y; x[4 * i + 2] = v.z; x[4 * i + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) x[i] = __ldg(p + i);
    }
  }
  __device__ __forceinline__ static void store(float* p, bool vec, const float (&x)[16]) {
    if (vec) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        reinterpret_cast<float4*>(p)[i] = make_float4(x[4 * i], x[4 * i + 1], x[4 * i + 2], x[4 * i + 3]);
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) p[i] = x[i];
    }
  }
};

// 16 half-precision elements = 32 bytes = two uint4.
template <class T>
struct seg_io_16bit {
  using T2 = typename elem16<T>::pair;
  __device__ __forceinline__ static float2 to_f2(T2 v) { return elem16<T>::to_floats(v); }
  __device__ __forceinline__ static void load(const T* p, bool vec, float (&x)[16]) {
    if (vec) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint4 u = __ldg(reinterpret_cast<const uint4*>(p) + i);
        const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          T2 t;
          memcpy(static_cast<void*>(&t), &w[k], sizeof(t));
          const float2 f = to_f2(t);
          x[8 * i + 2 * k] = f.x;
          x[8 * i + 2 * k + 1] = f.y;
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) x[i] = to_float(p[i]);
    }
  }
  __device__ __forceinline__ static void store(T* p, bool vec, const float (&x)[16]) {
    if (vec) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        unsigned w[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const T2 t = elem16<T>::from_floats(x[8 * i + 2 * k], x[8 * i + 2 * k + 1]);
          memcpy(&w[k], &t, sizeof(t));
        }
        reinterpret_cast<uint4*>(p)[i] = make_uint4(w[0], w[1], w[2], w[3]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) p[i] = from_float<T>(x[i]);
    }
  }
};

template <>
struct seg_io<__half> : seg_io_16bit<__half> {};
template <>
struct seg_io<__nv_bfloat16> : seg_io_16bit<__nv_bfloat16> {};

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
      T e[8];
      std::memcpy(e, &v, sizeof v);
#pragma unroll
      for (int i = 0; i < 8; ++i) x[i] = to_float(e[i]);
    }
  }
  __device__ __forceinline__ static void load(const T* p, float (&x)[8]) { widen(fetch(p), x); }
  __device__ __forceinline__ static void store(T* p, const float (&x)[8]) {
    T e[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) e[i] = from_float<T>(x[i]);
    uint4 v;
    std::memcpy(&v, e, sizeof v);
    *reinterpret_cast<uint4*>(p) = v;
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

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
