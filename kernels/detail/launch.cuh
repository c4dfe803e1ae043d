//! \file launch.cuh
//! Private: the one place kernels are launched. `launch(kernel, grid, block, smem, stream, args...)`
//! is a triple-chevron launch under nvcc; under GREENMIM_CUDA_EMULATION (the host build of the
//! kernel sources, kernels/emu, see docs/kernels.md "CPU emulation") it runs the kernel on
//! the emulator instead. Returns the launch's error (cudaGetLastError), so call sites read
//! `GM_TRY(launch(...))`. Also the entry points' dispatch on the element type.
#pragma once

#include <greenmim/kernels.h>

#include "device_common.cuh"
#include "host_checks.hpp"

namespace greenmim {
namespace detail {
namespace cuda {

template <class... Params, class... Args>
inline cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t stream,
                          Args&&... args) {
#if defined(GREENMIM_CUDA_EMULATION)
  return ::gm_emu::launch(kernel, grid, block, smem, stream, static_cast<Params>(args)...);
#else
  kernel<<<grid, block, smem, stream>>>(static_cast<Params>(args)...);
  return cudaGetLastError();
#endif
}

//! f(type_tag<T>{}) for the element type T of `dtype` (float, __half, __nv_bfloat16); an
//! invalid dtype is refused.
template <class T>
struct type_tag {
  using type = T;
};
template <class F>
cudaError_t with_element_type(gm_dtype dtype, F&& f) {
  switch (dtype) {
    case GM_FLOAT32: return f(type_tag<float>{});
    case GM_FLOAT16: return f(type_tag<__half>{});
    case GM_BFLOAT16: return f(type_tag<__nv_bfloat16>{});
  }
  return refuse("dtype");
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
