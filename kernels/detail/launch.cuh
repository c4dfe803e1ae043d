//! \file launch.cuh
//! Private: the one place kernels are launched. `launch(kernel, grid, block, smem, stream, args...)`
//! is a triple-chevron launch under nvcc; under GREENMIM_CUDA_EMULATION (the host build of the
//! kernel sources used by test/emu, see docs/kernels.md "CPU emulation") it runs the kernel on
//! the emulator instead. Returns the launch's error (cudaGetLastError), so call sites read
//! `GM_TRY(launch(...))`.
#pragma once

#include "device_common.cuh"

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

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
