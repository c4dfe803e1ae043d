//! \file attention_bwd.cu
//! Backward entry points of group window attention (C ABI): checks, workspace size, the d(bias)
//! reduction, and the dispatch to the backward kernels, which are instantiated one file per
//! element type (attention_bwd_{fp32,fp16,bf16}.cu over detail/attention_bwd_run.cuh; SIMT:
//! {fp32, fp16, bf16} x head_dim {32, 64}; tensor-core: {fp16, bf16} x {32, 64}).
//!
//! Launch sequence (one stream, no host synchronization), SIMT:
//!   1. attention_bwd_dq_simt   delta = rowsum(dO*O) -> workspace, dq, per-CTA d(bias) partials
//!   2. attention_bwd_dkdv_simt dk, dv (reads delta)
//!   3. dbias_reduce            d_bias_table += fixed-order sum of the partials (if requested)
//! tensor-core (fp16/bf16, G <= GM_MMA_MAX_GROUP, 16-byte aligned rows; GM_ALGO_AUTO's choice
//! when it applies):
//!   one pass (G <= k_mma_one_pass_max_group):
//!             1. attention_bwd_mma             dq, dk, dv, per-CTA d(bias) partials (same layout)
//!   tiled:    1. attention_bwd_dq_mma_tiled    delta -> workspace, dq, per-CTA d(bias) partials
//!             2. attention_bwd_dkdv_mma_tiled  dk, dv (reads delta), key tiles of 64
//!   then dbias_reduce as above
#include <greenmim/kernels.h>

#include <type_traits>

#include "detail/attention_bwd_run.cuh"
#include "detail/attention_checks.hpp"
#include "detail/attention_traits.hpp"
#include "detail/launch.cuh"

namespace greenmim {
namespace detail {
namespace cuda {
namespace {

// =================================================================================================
// d(bias) reduction: dbias[r, h] += sum over CTAs c (in increasing order of c, in 32 fixed
// strided slices, each with 4 fixed sub-accumulators, combined in a fixed order) of
// partial[c][h][r]. Block (32 buckets, 32 slices); grid (ceil(rows/32), heads).
// =================================================================================================
__global__ void __launch_bounds__(1024) dbias_reduce(const float* __restrict__ partial, std::int64_t count,
                                                     int heads, int rows, table2f dbias) {
  __shared__ float red[32][33];
  const int r = blockIdx.x * 32 + threadIdx.x;
  const int h = blockIdx.y;
  float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
  if (r < rows) {
    const float* src = partial + static_cast<std::int64_t>(h) * rows + r;
    const std::int64_t step = static_cast<std::int64_t>(heads) * rows;
    std::int64_t c = threadIdx.y;
    for (; c + 96 < count; c += 128) {
      a0 += src[c * step];
      a1 += src[(c + 32) * step];
      a2 += src[(c + 64) * step];
      a3 += src[(c + 96) * step];
    }
    for (; c < count; c += 32) a0 += src[c * step];
  }
  red[threadIdx.y][threadIdx.x] = (a0 + a1) + (a2 + a3);
  __syncthreads();
  if (threadIdx.y == 0 && r < rows) {
    float sum = 0.f;
    for (int y = 0; y < 32; ++y) sum += red[y][threadIdx.x];
    dbias.data[r * dbias.s0 + h * dbias.s1] += sum;
  }
}

//! As query_smem_optin, or 0 when no device can be asked (the failed query's error is cleared,
//! so it does not surface at a later cudaGetLastError).
inline std::size_t device_smem_optin() {
  std::size_t bytes = 0;
  if (query_smem_optin(bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return bytes;
}

//! Dynamic shared memory of the tensor-core backward (tiled: the larger of its two kernels').
inline std::size_t mma_bwd_smem(std::int64_t D, int G, int bias_rows, bool want_dbias) {
  if (G <= k_mma_one_pass_max_group)
    return D == 32 ? mma_tile<32>::smem_bwd(bias_rows, want_dbias) : mma_tile<64>::smem_bwd(bias_rows, want_dbias);
  return D == 32 ? mma_tile<32>::smem_bwd_dq_tiled(bias_rows, want_dbias)
                 : mma_tile<64>::smem_bwd_dq_tiled(bias_rows, want_dbias);
}

//! Checks; on success `d` and `ws` describe the problem and `use_mma` the chosen implementation.
cudaError_t check_bwd(const gm_attention_bwd_args* a, attn_dims& d, bwd_layout& ws, bool& use_mma) {
  clear_refusal();
  GM_REFUSE_IF(a == nullptr, "args is null");
  GM_TRY(check_attention_core(a->dtype, a->q, a->bias_table, a->part, a->window, a->scale, a->algo, d));
  GM_TRY(check_like_q(a->k, d, a->dtype, false, "k: shape must equal q's; null, misaligned or non-unit last stride"));
  GM_TRY(check_like_q(a->v, d, a->dtype, false, "v: shape must equal q's; null, misaligned or non-unit last stride"));
  GM_TRY(check_like_q(a->o, d, a->dtype, false, "o: shape must equal q's; null, misaligned or non-unit last stride"));
  GM_TRY(check_like_q(a->d_o, d, a->dtype, false, "d_o: shape must equal q's; null, misaligned or non-unit last stride"));
  GM_TRY(check_like_q(a->dq, d, a->dtype, true, "dq: shape must equal q's; null, misaligned, non-unit last stride or self-overlapping"));
  GM_TRY(check_like_q(a->dk, d, a->dtype, true, "dk: shape must equal q's; null, misaligned, non-unit last stride or self-overlapping"));
  GM_TRY(check_like_q(a->dv, d, a->dtype, true, "dv: shape must equal q's; null, misaligned, non-unit last stride or self-overlapping"));
  GM_REFUSE_IF(a->lse.data == nullptr && d.B * d.N * d.H > 0, "lse is required by the backward");
  GM_TRY(check_lse(a->lse, d, false, "lse must be float32 [B, N, heads] with non-negative strides"));
  const bool want_dbias = a->d_bias_table.data != nullptr;
  if (want_dbias) {
    GM_REFUSE_IF(!d.with_bias, "d_bias_table needs a bias_table");
    const std::int64_t ext[2] = {a->bias_table.extent[0], a->bias_table.extent[1]};
    GM_TRY(check_tensor(a->d_bias_table, 2, ext, sizeof(float), false, true,
                        "d_bias_table must be float32 of the bias table's shape, not self-overlapping"));
  }
  const std::size_t es = dtype_bytes(a->dtype);
  const gm_tensor* ins[5] = {&a->q, &a->k, &a->v, &a->o, &a->d_o};
  const gm_tensor* outs[3] = {&a->dq, &a->dk, &a->dv};
  for (const gm_tensor* out : outs) {
    for (const gm_tensor* in : ins) GM_REFUSE_IF(overlap(*out, es, *in, es), "an output (dq, dk, dv) overlaps an input");
    GM_REFUSE_IF(overlap(*out, es, a->lse, 4), "an output (dq, dk, dv) overlaps lse");
    if (d.with_bias) GM_REFUSE_IF(overlap(*out, es, a->bias_table, 4), "an output overlaps the bias table");
    if (want_dbias) GM_REFUSE_IF(overlap(*out, es, a->d_bias_table, 4), "an output overlaps d_bias_table");
  }
  if (want_dbias) {
    for (const gm_tensor* in : ins) GM_REFUSE_IF(overlap(a->d_bias_table, 4, *in, es), "d_bias_table overlaps an input");
    GM_REFUSE_IF(overlap(a->d_bias_table, 4, a->lse, 4), "d_bias_table overlaps lse");
    GM_REFUSE_IF(overlap(a->d_bias_table, 4, a->bias_table, 4), "d_bias_table overlaps the bias table");
  }
  // tensor-core path: fp16/bf16, G <= GM_MMA_MAX_GROUP, every row of the eight tensors 16-byte
  // aligned, and its shared memory within the limits (the device's own opt-in limit when one can
  // be asked)
  bool vec = true;
  for (const gm_tensor* t : ins) vec = vec && rows_aligned16(*t, es);
  for (const gm_tensor* t : outs) vec = vec && rows_aligned16(*t, es);
  const std::size_t mma_smem = mma_bwd_smem(d.D, a->part.group_size, d.bias_rows, want_dbias);
  const std::size_t mma_optin = mma_smem > k_default_smem_bytes ? device_smem_optin() : 0;
  const bool mma_ok = a->dtype != GM_FLOAT32 && a->part.group_size <= k_mma_max_group && vec &&
                      mma_smem <= k_max_smem_bytes && (mma_optin == 0 || mma_smem <= mma_optin);
  if (a->algo == GM_ALGO_MMA)
    GM_REFUSE_IF(!mma_ok, "GM_ALGO_MMA (backward) needs fp16/bf16, group_size <= " GM_STRINGIFY(GM_MMA_MAX_GROUP)
                          ", 16-byte aligned rows of q, k, v, o, d_o, dq, dk, dv, and its shared memory within the "
                          "device limit");
  use_mma = a->algo == GM_ALGO_MMA || (a->algo == GM_ALGO_AUTO && mma_ok);
  // shared memory of the SIMT dq kernel: one float row of the table per warp when dbias is wanted
  if (want_dbias && !use_mma) {
    const std::size_t smem = d.D == 32 ? simt_tile<32>::smem_bwd_dq(a->part.group_size, d.bias_rows)
                                       : simt_tile<64>::smem_bwd_dq(a->part.group_size, d.bias_rows);
    GM_REFUSE_IF(smem > k_max_smem_bytes, "window too large for d_bias_table at this head_dim (shared memory)");
    // the current device's own limit (sm_86/89 opt in to ~99 KB, not 227 KB); without a device
    // to ask, the launch checks again
    const std::size_t optin = smem > k_default_smem_bytes ? device_smem_optin() : 0;
    GM_REFUSE_IF(optin > 0 && smem > optin, "window too large for d_bias_table on this device (shared memory per block)");
  }
  // workspace
  const std::int64_t slots = static_cast<std::int64_t>(a->part.group_size) * a->part.num_groups;
  ws.delta_bytes = static_cast<std::size_t>(d.B * d.H * slots) * sizeof(float);
  ws.partial_count = want_dbias ? d.B * a->part.num_groups * d.q_tiles : 0;
  ws.partial_bytes = static_cast<std::size_t>(ws.partial_count * d.H * d.bias_rows) * sizeof(float);
  return cudaSuccess;
}

}  // namespace

cudaError_t launch_dbias_reduce(const float* partial, std::int64_t count, int heads, int rows, table2f dbias,
                                cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((rows + 31) / 32), static_cast<unsigned>(heads));
  return launch(dbias_reduce, grid, dim3(32, 32), 0, stream, partial, count, heads, rows, dbias);
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim


extern "C" cudaError_t gm_attention_bwd_can_implement(const gm_attention_bwd_args* args) {
  using namespace greenmim::detail::cuda;
  return no_throw([&]() -> cudaError_t {
    attn_dims d;
    bwd_layout ws;
    bool use_mma = false;
    return check_bwd(args, d, ws, use_mma);
  });
}

extern "C" cudaError_t gm_attention_bwd_workspace_size(const gm_attention_bwd_args* args, size_t* bytes) {
  using namespace greenmim::detail::cuda;
  return no_throw([&]() -> cudaError_t {
    clear_refusal();
    GM_REFUSE_IF(bytes == nullptr, "bytes is null");
    attn_dims d;
    bwd_layout ws;
    bool use_mma = false;
    GM_TRY(check_bwd(args, d, ws, use_mma));
    *bytes = ws.total();
    return cudaSuccess;
  });
}

extern "C" cudaError_t gm_attention_bwd(const gm_attention_bwd_args* args, void* workspace, size_t workspace_bytes,
                                        cudaStream_t stream) {
  using namespace greenmim::detail::cuda;
  return no_throw([&]() -> cudaError_t {
    attn_dims d;
    bwd_layout ws;
    bool use_mma = false;
    GM_TRY(check_bwd(args, d, ws, use_mma));
    if (d.B == 0 || d.N == 0 || d.H == 0 || args->part.num_groups == 0) return cudaSuccess;
    GM_REFUSE_IF(workspace_bytes < ws.total(), "workspace smaller than gm_attention_bwd_workspace_size");
    GM_REFUSE_IF(ws.total() > 0 && workspace == nullptr, "workspace is null");
    GM_REFUSE_IF(reinterpret_cast<std::uintptr_t>(workspace) % k_bwd_ws_align != 0, "workspace must be 256-byte aligned");
    return with_element_type(args->dtype, [&](auto t) {
      using T = typename decltype(t)::type;
      return run_bwd_d<T>(*args, d, ws, !std::is_same<T, float>::value && use_mma, workspace, stream);
    });
  });
}
