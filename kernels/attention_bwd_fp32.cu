//! \file attention_bwd_fp32.cu
//! The backward attention kernels for float32 (SIMT kernels only), head_dim 32 and 64: one
//! instantiation file per element type, as FlashAttention's, so that the backward compiles in
//! parallel (detail/attention_bwd_run.cuh; the entry points are in attention_bwd.cu).
#include "detail/attention_bwd_run.cuh"

namespace greenmim {
namespace detail {
namespace cuda {

template cudaError_t run_bwd_d<float>(const gm_attention_bwd_args& a, const attn_dims& d, const bwd_layout& ws, bool use_mma,
                      void* workspace, cudaStream_t stream);

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
