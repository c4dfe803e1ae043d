//! \file common.cu
//! Small C entry points shared by the kernels library: dtype names and sizes, the thread-local
//! reason of the last refused call, the ABI version and the structs' layout table.
#include <greenmim/kernels.h>

#include <greenmim/detail/abi_table.hpp>

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

extern "C" int gm_kernels_abi_version(void) { return GM_KERNELS_ABI_VERSION; }

namespace {
// One line per struct of kernels.h: the struct and every field, in declaration order.
const gm_abi_entry abi_layout[] = {
    GREENMIM_ABI_STRUCT(gm_tensor, data, rank, extent, stride)
    GREENMIM_ABI_STRUCT(gm_partition, gather, scatter, slot_window, slot_coord, group_size, num_groups, num_tokens)
    GREENMIM_ABI_STRUCT(gm_window_geometry, height, width, window, shift)
    GREENMIM_ABI_STRUCT(gm_attention_fwd_args, dtype, q, k, v, o, lse, bias_table, part, window, scale, algo)
    GREENMIM_ABI_STRUCT(gm_attention_bwd_args, dtype, q, k, v, o, d_o, lse, bias_table, dq, dk, dv, d_bias_table,
                        part, window, scale, algo)
    GREENMIM_ABI_STRUCT(gm_partition_args, dtype, x, y, part)
    GREENMIM_ABI_STRUCT(gm_depthwise_conv_args, dtype, x, y, dy, dx, nbr, kernel, weight, bias, dweight, dbias,
                        residual)
    GREENMIM_ABI_STRUCT(gm_block_conv_args, dtype, x, y, dy, dx, gather, stride, weight, bias, dweight, dbias)
};
}  // namespace

extern "C" const gm_abi_entry* gm_abi_layout(size_t* count) {
  if (count != nullptr) *count = sizeof(abi_layout) / sizeof(abi_layout[0]);
  return abi_layout;
}
