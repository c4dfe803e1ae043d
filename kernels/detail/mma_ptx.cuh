//! \file mma_ptx.cuh
//! Private: the tensor-core instructions (sm_80+) the attention kernels use, ldmatrix.x4 and
//! mma.sync m16n8k16 with fp32 accumulation, for fp16 and bf16, and the asynchronous copies that
//! feed them (cp.async.cg of 16 bytes, commit_group, wait_group). Under GREENMIM_CUDA_EMULATION
//! the emulator provides ldmatrix and mma as warp collectives written from the PTX ISA fragment
//! tables (kernels/emu), independently of the kernels' own layout maps (mma_layout.hpp), and
//! defers cp.async's shared-memory writes to wait_group as the device may.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "device_common.cuh"

namespace greenmim {
namespace detail {
namespace cuda {

#if defined(GREENMIM_CUDA_EMULATION)
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) { ::gm_emu::ldmatrix_x4(r, p, false); }
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  ::gm_emu::ldmatrix_x4(r, p, true);
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) { ::gm_emu::cp_async16(smem, gmem); }
__device__ __forceinline__ void cp_async_commit() { ::gm_emu::cp_async_commit(); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  ::gm_emu::cp_async_wait(N);
}
#else
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}
//! 16 bytes from global `gmem` to shared `smem` (both 16-byte aligned), bypassing L1; completes
//! asynchronously: visible to this thread after cp_async_wait retires its group, to the CTA after
//! that and a barrier.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" : : "r"(smem_addr(smem)), "l"(gmem) : "memory");
}
//! Closes this thread's open group of cp.async copies.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" : : : "memory"); }
//! Waits until at most the newest N committed groups of this thread's copies are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" : : "n"(N) : "memory");
}
#endif

//! d += a * b (m16n8k16, row.col), AB the PTX name of the input type.
#define GM_MMA_M16N8K16(AB)                                                                                  \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." AB "." AB                                            \
               ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"                      \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                              \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))

//! The tensor-core operations on 16-bit element type T (__half or __nv_bfloat16).
template <class T>
struct mma16 {
  static_assert(std::is_same<T, __half>::value || std::is_same<T, __nv_bfloat16>::value, "fp16 or bf16");
  //! d += a * b, m16n8k16, row.col, fp32 accumulate.
  __device__ __forceinline__ static void run(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
#if defined(GREENMIM_CUDA_EMULATION)
    ::gm_emu::mma_m16n8k16<T>(d, a, b0, b1);
#else
    if constexpr (std::is_same<T, __half>::value)
      GM_MMA_M16N8K16("f16");
    else
      GM_MMA_M16N8K16("bf16");
#endif
  }
  //! Two floats rounded to T and packed into one register (lo in the low half).
  __device__ __forceinline__ static unsigned pack(float lo, float hi) {
    const typename elem16<T>::pair v = elem16<T>::from_floats(lo, hi);
    unsigned u;
    memcpy(&u, &v, 4);
    return u;
  }
  //! True when neither 16-bit half of `w` is Inf or NaN (exponent all ones).
  __device__ __forceinline__ static bool finite2(unsigned w) {
    constexpr unsigned m = elem16<T>::exp_mask;
    return (w & m) != m && (w & (m << 16)) != (m << 16);
  }
  //! finite2 of the four words of a 16-byte chunk.
  __device__ __forceinline__ static bool finite8(uint4 u) {
    return finite2(u.x) && finite2(u.y) && finite2(u.z) && finite2(u.w);
  }
  //! acc + the 8 products of two 16-byte chunks of T, fused multiply-adds in element order.
  __device__ __forceinline__ static float dot8(uint4 a, uint4 b, float acc) {
    using T2 = typename elem16<T>::pair;
    const unsigned wa[4] = {a.x, a.y, a.z, a.w}, wb[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      T2 ta, tb;
      memcpy(static_cast<void*>(&ta), &wa[k], 4);
      memcpy(static_cast<void*>(&tb), &wb[k], 4);
      const float2 fa = elem16<T>::to_floats(ta), fb = elem16<T>::to_floats(tb);
      acc = fmaf(fa.x, fb.x, acc);
      acc = fmaf(fa.y, fb.y, acc);
    }
    return acc;
  }
};
#undef GM_MMA_M16N8K16

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
