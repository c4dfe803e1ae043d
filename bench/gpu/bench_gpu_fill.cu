// Device-side random fill for greenmim_gpu_bench (host-side generation of ~100 MB per tensor
// would dominate the run). Counter-based hash -> approximately normal values (sum of 4 uniforms).
#if defined(GREENMIM_CUDA_EMULATION)
#include "cuda_emu.hpp"  // kernels/emu: the bench's smoke run on the CPU emulator (ctest gpu_bench_emulated)
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

#include <cstddef>
#include <cstdint>

namespace {

__device__ __forceinline__ std::uint32_t hash32(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<std::uint32_t>(x);
}

__device__ __forceinline__ float approx_normal(std::uint64_t seed, std::size_t i) {
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < 4; ++k) s += hash32(seed * 0x9E3779B97F4A7C15ull + 4 * i + k) * (1.0f / 4294967296.0f);
  return (s - 2.0f) * 1.7320508f;  // mean 0, variance 1
}

template <class T>
__device__ __forceinline__ T cvt(float x);
template <>
__device__ __forceinline__ float cvt<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half cvt<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 cvt<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <class T>
__global__ void fill_kernel(T* p, std::size_t n, std::uint64_t seed, float scale) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[i] = cvt<T>(scale * approx_normal(seed, i));
}

}  // namespace

//! dtype: 0 float32, 1 float16, 2 bfloat16 (gm_dtype values).
extern "C" cudaError_t bench_fill_random(void* p, std::size_t n, int dtype, std::uint64_t seed, float scale,
                                         cudaStream_t stream) {
  const unsigned blocks = 1024;
#if defined(GREENMIM_CUDA_EMULATION)
  switch (dtype) {
    case 0: return gm_emu::launch(fill_kernel<float>, dim3(blocks), dim3(256), 0, stream, static_cast<float*>(p), n, seed, scale);
    case 1: return gm_emu::launch(fill_kernel<__half>, dim3(blocks), dim3(256), 0, stream, static_cast<__half*>(p), n, seed, scale);
    case 2:
      return gm_emu::launch(fill_kernel<__nv_bfloat16>, dim3(blocks), dim3(256), 0, stream,
                            static_cast<__nv_bfloat16*>(p), n, seed, scale);
    default: return cudaErrorInvalidValue;
  }
#else
  switch (dtype) {
    case 0: fill_kernel<float><<<blocks, 256, 0, stream>>>(static_cast<float*>(p), n, seed, scale); break;
    case 1: fill_kernel<__half><<<blocks, 256, 0, stream>>>(static_cast<__half*>(p), n, seed, scale); break;
    case 2: fill_kernel<__nv_bfloat16><<<blocks, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(p), n, seed, scale); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
#endif
}

namespace {
__global__ void spin_kernel(unsigned long long ns) {
#if !defined(GREENMIM_CUDA_EMULATION)
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
#else
  (void)ns;
#endif
}
}  // namespace

//! Keeps the GPU busy for about `ns` nanoseconds (one thread reading the global timer; no memory
//! traffic, so the caches are left as they are). A no-op on the emulator.
extern "C" cudaError_t bench_spin_ns(unsigned long long ns, cudaStream_t stream) {
#if defined(GREENMIM_CUDA_EMULATION)
  return gm_emu::launch(spin_kernel, dim3(1), dim3(1), 0, stream, ns);
#else
  spin_kernel<<<1, 1, 0, stream>>>(ns);
  return cudaGetLastError();
#endif
}
