//! \file device_common.cuh
//! Private device helpers of greenmim::kernels: element conversions, 16-element row loads and
//! stores (16-byte vectorized when aligned), warp helpers. Index math is NOT here: kernels call
//! include/greenmim/geometry.hpp (attends, rel_pos_index, coord_h/coord_w).
#pragma once

#if defined(GREENMIM_CUDA_EMULATION)
#include "cuda_emu.hpp"  // test/emu: the kernels compiled as host code and run on the CPU emulator
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

#include <cstdint>
#include <cstring>

#include <greenmim/config.hpp>
#include <greenmim/geometry.hpp>
#include <greenmim/partition_types.hpp>

namespace greenmim {
namespace detail {
namespace cuda {

constexpr unsigned full_mask = 0xffffffffu;

//! The kernel's dynamic shared memory as a `float4` array named `name` (16-byte aligned).
#if defined(GREENMIM_CUDA_EMULATION)
#define GM_DYNAMIC_SMEM(name) float4* const name = ::gm_emu::dynamic_smem<float4>()
#else
#define GM_DYNAMIC_SMEM(name) extern __shared__ float4 name[]
#endif

// ---- element conversions --------------------------------------------------------------------
//! exp for softmax in element type T: the accurate expf for fp32 (fp32 promises 1e-5 against the
//! reference, and __expf's 2 + 1.17|x| ulp would spend much of that margin before the backward's
//! cancellations), the fast __expf for fp16/bf16, whose storage rounding dwarfs it. The forward's
//! lse and the backward's recomputed P use the same one.
template <class T>
__device__ __forceinline__ float softmax_exp(float x) { return __expf(x); }
template <>
__device__ __forceinline__ float softmax_exp<float>(float x) { return expf(x); }

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

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
template <class T, class T2>
struct seg_io_16bit {
  __device__ __forceinline__ static float2 to_f2(T2 v);
  __device__ __forceinline__ static T2 from_f2(float a, float b);
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
          const T2 t = from_f2(x[8 * i + 2 * k], x[8 * i + 2 * k + 1]);
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
__device__ __forceinline__ float2 seg_io_16bit<__half, __half2>::to_f2(__half2 v) { return __half22float2(v); }
template <>
__device__ __forceinline__ __half2 seg_io_16bit<__half, __half2>::from_f2(float a, float b) {
  return __floats2half2_rn(a, b);
}
template <>
__device__ __forceinline__ float2 seg_io_16bit<__nv_bfloat16, __nv_bfloat162>::to_f2(__nv_bfloat162 v) {
  return __bfloat1622float2(v);
}
template <>
__device__ __forceinline__ __nv_bfloat162 seg_io_16bit<__nv_bfloat16, __nv_bfloat162>::from_f2(float a, float b) {
  return __floats2bfloat162_rn(a, b);
}

template <>
struct seg_io<__half> : seg_io_16bit<__half, __half2> {};
template <>
struct seg_io<__nv_bfloat16> : seg_io_16bit<__nv_bfloat16, __nv_bfloat162> {};

// ---- shared-memory float rows (16-byte aligned: row stride a multiple of 4 floats) ----------------
__device__ __forceinline__ void smem_load16(const float* p, float (&x)[16]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float4 v = reinterpret_cast<const float4*>(p)[i];
    x[4 * i] = v.x; x[4 * i + 1] = v.y; x[4 * i + 2] = v.z; x[4 * i + 3] = v.w;
  }
}
__device__ __forceinline__ void smem_store16(float* p, const float (&x)[16]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
    reinterpret_cast<float4*>(p)[i] = make_float4(x[4 * i], x[4 * i + 1], x[4 * i + 2], x[4 * i + 3]);
}

//! Sum over a team of `Team` consecutive lanes (Team a power of two <= 32). Every lane of the
//! warp must call it (full-mask shuffles); the order of additions is fixed (xor butterfly), so
//! every lane of the team gets the same, reproducible value.
template <int Team>
__device__ __forceinline__ float team_sum(float v) {
#pragma unroll
  for (int o = Team / 2; o > 0; o /= 2) v += __shfl_xor_sync(full_mask, v, o);
  return v;
}

//! Bias of the pair (query coord cq, key coord ck) of head h, or NaN when the relative position
//! falls outside the table (a partition that does not match `window`: visible, never an
//! out-of-bounds read). Zero without a table.
__device__ __forceinline__ float pair_bias(const float* __restrict__ table, std::int64_t s0, std::int64_t s1,
                                           int rows, int h, index_t cq, index_t ck, int window) {
  if (table == nullptr) return 0.f;
  const index_t r = rel_pos_index(coord_h(cq), coord_w(cq), coord_h(ck), coord_w(ck), window);
  return static_cast<unsigned>(r) < static_cast<unsigned>(rows) ? __ldg(table + r * s0 + h * s1) : __int_as_float(0x7fc00000);
}

//! Relative-position bucket of the pair, or -1 outside the table.
__device__ __forceinline__ int pair_bucket(index_t cq, index_t ck, int window, int rows) {
  const index_t r = rel_pos_index(coord_h(cq), coord_w(cq), coord_h(ck), coord_w(ck), window);
  return static_cast<unsigned>(r) < static_cast<unsigned>(rows) ? r : -1;
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
