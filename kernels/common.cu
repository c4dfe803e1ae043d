//! \file common.cu
//! Small C entry points shared by the kernels library: dtype names and sizes, and the
//! thread-local reason of the last refused call.
#include <greenmim/kernels.h>

#include "detail/host_checks.hpp"

namespace greenmim {
namespace detail {
namespace cuda {
namespace {
thread_local const char* last_refusal = "";
}  // namespace

cudaError_t refuse(const char* why) noexcept {
  last_refusal = why != nullptr ? why : "";
  return cudaErrorInvalidValue;
}
void clear_refusal() noexcept { last_refusal = ""; }

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim

extern "C" const char* gm_dtype_name(gm_dtype dtype) {
  switch (dtype) {
    case GM_FLOAT32: return "float32";
    case GM_FLOAT16: return "float16";
    case GM_BFLOAT16: return "bfloat16";
  }
  return "invalid";
}

extern "C" size_t gm_dtype_size(gm_dtype dtype) { return greenmim::detail::cuda::dtype_bytes(dtype); }

extern "C" const char* gm_last_refusal(void) { return greenmim::detail::cuda::last_refusal; }
