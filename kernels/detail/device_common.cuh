//! \file device_common.cuh
//! Private device helpers of greenmim::kernels: element conversions, shared-memory float rows,
//! warp sums. Global-memory row loads and stores are in row_io.cuh, inline PTX in ptx.cuh and
//! mma_ptx.cuh. Index math lives in include/greenmim/geometry.hpp; masks and bias in mask.cuh.
#pragma once

#if defined(GREENMIM_CUDA_EMULATION)
#include "cuda_emu.hpp"  // kernels/emu: the kernels compiled as host code and run on the CPU emulator
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

#include <cstdint>
#include <cstring>
#include <type_traits>

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

//! The 16-bit element types (__half, __nv_bfloat16): the packed pair type, its float2
//! conversions, and the exponent mask of one element (all ones: Inf or NaN).
template <class T>
struct elem16 {
  static constexpr bool is_half = std::is_same<T, __half>::value;
  static_assert(is_half || std::is_same<T, __nv_bfloat16>::value, "fp16 or bf16");
  using pair = typename std::conditional<is_half, __half2, __nv_bfloat162>::type;
  static constexpr unsigned exp_mask = is_half ? 0x7c00u : 0x7f80u;
  __device__ __forceinline__ static float2 to_floats(pair v) {
    if constexpr (is_half) return __half22float2(v);
    else return __bfloat1622float2(v);
  }
  __device__ __forceinline__ static pair from_floats(float lo, float hi) {
    if constexpr (is_half) return __floats2half2_rn(lo, hi);
    else return __floats2bfloat162_rn(lo, hi);
  }
};

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

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
