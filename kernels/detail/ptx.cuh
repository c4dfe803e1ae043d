//! \file ptx.cuh
//! Private: the inline-PTX helpers of the CUDA-core kernels (the tensor-core instructions are in
//! mma_ptx.cuh). Each has a plain C++ branch under GREENMIM_CUDA_EMULATION (kernels/emu), with
//! the same values: the emulator runs the kernels as host code.
//! - ldg16_if: a predicated 16-byte read-only load into the registers of the value it replaces;
//! - opaque: a pointer the optimizer cannot see through (address arithmetic kept as written).
#pragma once

#include <cstdint>

#include "device_common.cuh"

namespace greenmim {
namespace detail {
namespace cuda {

//! The 16 bytes at p into (a, b, c, d) where `cond`, else (a, b, c, d) unchanged: one predicated
//! load into the registers that hold the value kept, so that a row kept from the token before and
//! the row loaded in its place share registers (in C++, ptxas gave the load registers of its own,
//! and dw_apply spilled 120 bytes).
__device__ __forceinline__ void ldg16_if(unsigned& a, unsigned& b, unsigned& c, unsigned& d, const void* p, bool cond) {
#if defined(GREENMIM_CUDA_EMULATION)
  if (cond) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    a = v.x; b = v.y; c = v.z; d = v.w;
  }
#else
  asm("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %5, 0;\n\t@q ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
      : "+r"(a), "+r"(b), "+r"(c), "+r"(d)
      : "l"(p), "r"(static_cast<unsigned>(cond)));
#endif
}

//! `p` unchanged, but opaque to the optimizer: dw_apply's per-sample base pointer stays one
//! register pair, so that each tap's address is a single wide multiply-add of its 32-bit offset
//! (ptxas otherwise recomputed sample * stride + offset in 64 bits at every tap: 4-6 instructions).
template <class P>
__device__ __forceinline__ P* opaque(P* p) {
#if !defined(GREENMIM_CUDA_EMULATION)
  asm("" : "+l"(p));
#endif
  return p;
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
