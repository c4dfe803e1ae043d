//! \file attention_bwd_run.cuh
//! Private: the backward attention's launcher for one element type (run_bwd_d<T>: head_dim 32 or
//! 64; SIMT, or the one-pass or tiled tensor-core kernels), with its workspace layout. Each element
//! type is instantiated in its own file (attention_bwd_{fp32,fp16,bf16}.cu, as FlashAttention's
//! flash_bwd_hdim*_{fp16,bf16}_sm80.cu), so that the three compile in parallel;
//! attention_bwd.cu holds the checks, the d(bias) reduction and the C ABI, and calls them.
#pragma once

#include <greenmim/kernels.h>

#include <type_traits>

#include "attention_bwd_mma.cuh"
#include "attention_bwd_mma_tiled.cuh"
#include "attention_checks.hpp"
#include "attention_simt.cuh"
#include "attention_traits.hpp"
#include "launch.cuh"

namespace greenmim {
namespace detail {
namespace cuda {

constexpr std::size_t k_bwd_ws_align = 256;  //!< the workspace's alignment and its parts'

//! The current device's opt-in shared memory per block.
inline cudaError_t query_smem_optin(std::size_t& bytes) {
  int dev = 0, optin = 0;
  GM_TRY(cudaGetDevice(&dev));
  GM_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  bytes = static_cast<std::size_t>(optin);
  return cudaSuccess;
}

inline std::size_t bwd_align_up(std::size_t n) { return (n + k_bwd_ws_align - 1) / k_bwd_ws_align * k_bwd_ws_align; }

struct bwd_layout {
  std::size_t delta_bytes = 0;    // [B][heads][slots] float
  std::size_t partial_bytes = 0;  // [B * n_g * q_tiles][heads][rows] float
  std::int64_t partial_count = 0; // B * n_g * q_tiles
  std::size_t total() const { return bwd_align_up(delta_bytes) + bwd_align_up(partial_bytes); }
};

//! d_bias_table += the fixed-order sum of `count` CTAs' partials (dbias_reduce, attention_bwd.cu).
cudaError_t launch_dbias_reduce(const float* partial, std::int64_t count, int heads, int rows, table2f dbias,
                                cudaStream_t stream);

//! Raises the dynamic shared-memory limit of `kernel` when `bytes` exceeds the default 48 KB.
template <class K>
cudaError_t allow_smem(K kernel, std::size_t bytes) {
  if (bytes <= k_default_smem_bytes) return cudaSuccess;
  std::size_t optin = 0;
  GM_TRY(query_smem_optin(optin));
  GM_REFUSE_IF(bytes > optin,
               "shared memory of the backward exceeds the device limit (window too large for d_bias_table)");
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

template <class T, int D>
cudaError_t run_bwd(const gm_attention_bwd_args& a, const attn_dims& d, const bwd_layout& ws, bool use_mma,
                    void* workspace, cudaStream_t stream) {
  bwd_params<T> p;
  set_shared_params<T>(p, a, d);
  p.o = to_rows<const T>(a.o);
  p.d_o = to_rows<const T>(a.d_o);
  p.dq = to_rows<T>(a.dq);
  p.dk = to_rows<T>(a.dk);
  p.dv = to_rows<T>(a.dv);
  p.q_tiles = d.q_tiles;
  const std::size_t es = sizeof(T);
  const gm_tensor* all[8] = {&a.q, &a.k, &a.v, &a.o, &a.d_o, &a.dq, &a.dk, &a.dv};
  p.vec = true;
  for (const gm_tensor* t : all) p.vec = p.vec && rows_aligned16(*t, es);
  char* w = static_cast<char*>(workspace);
  p.delta = reinterpret_cast<float*>(w);
  const bool want_dbias = a.d_bias_table.data != nullptr;
  p.dbias_partial = want_dbias ? reinterpret_cast<float*>(w + bwd_align_up(ws.delta_bytes)) : nullptr;

  bool launched = false;
  if constexpr (!std::is_same<T, float>::value) {
    using C = mma_tile<D>;
    if (use_mma && a.part.group_size > k_mma_one_pass_max_group) {  // two tiled kernels, grid and partials as SIMT's
      const dim3 grid(static_cast<unsigned>(a.part.num_groups * d.q_tiles), static_cast<unsigned>(d.H),
                      static_cast<unsigned>(d.B));
      const std::size_t smem_dq = C::smem_bwd_dq_tiled(d.bias_rows, want_dbias);
      const std::size_t smem_dkdv = C::smem_bwd_tiled(d.bias_rows);
      GM_TRY(allow_smem(attention_bwd_dq_mma_tiled<T, D>, smem_dq));
      GM_TRY(allow_smem(attention_bwd_dkdv_mma_tiled<T, D>, smem_dkdv));
      GM_TRY(launch(attention_bwd_dq_mma_tiled<T, D>, grid, C::THREADS, smem_dq, stream, p));
      GM_TRY(launch(attention_bwd_dkdv_mma_tiled<T, D>, grid, C::THREADS, smem_dkdv, stream, p));
      launched = true;
    } else if (use_mma) {  // one CTA per (group, head, sample); its d(bias) partial has the SIMT layout (q_tiles = 1)
      p.q_tiles = 1;
      const dim3 grid(static_cast<unsigned>(a.part.num_groups), static_cast<unsigned>(d.H), static_cast<unsigned>(d.B));
      const std::size_t smem = C::smem_bwd(d.bias_rows, want_dbias);
      GM_TRY(allow_smem(attention_bwd_mma<T, D>, smem));
      GM_TRY(launch(attention_bwd_mma<T, D>, grid, C::THREADS, smem, stream, p));
      launched = true;
    }
  }
  if (!launched) {
    if (use_mma) return refuse("internal: mma path for float32");
    const dim3 grid(static_cast<unsigned>(a.part.num_groups * d.q_tiles), static_cast<unsigned>(d.H),
                    static_cast<unsigned>(d.B));
    const int G = a.part.group_size;
    const std::size_t smem_dq = simt_tile<D>::smem_bwd_dq(G, want_dbias ? d.bias_rows : 0);
    GM_TRY(allow_smem(attention_bwd_dq_simt<T, D>, smem_dq));
    GM_TRY(launch(attention_bwd_dq_simt<T, D>, grid, simt_tile<D>::THREADS, smem_dq, stream, p));
    GM_TRY(launch(attention_bwd_dkdv_simt<T, D>, grid, simt_tile<D>::THREADS, simt_tile<D>::smem_bwd_dkdv(G), stream, p));
  }
  if (want_dbias && ws.partial_count > 0) {
    table2f out;
    out.data = static_cast<float*>(a.d_bias_table.data);
    out.s0 = a.d_bias_table.stride[0];
    out.s1 = a.d_bias_table.stride[1];
    out.rows = d.bias_rows;
    GM_TRY(launch_dbias_reduce(p.dbias_partial, ws.partial_count, static_cast<int>(d.H), d.bias_rows, out, stream));
  }
  return cudaSuccess;
}


template <class T>
cudaError_t run_bwd_d(const gm_attention_bwd_args& a, const attn_dims& d, const bwd_layout& ws, bool use_mma,
                      void* workspace, cudaStream_t stream) {
  return d.D == 32 ? run_bwd<T, 32>(a, d, ws, use_mma, workspace, stream)
                   : run_bwd<T, 64>(a, d, ws, use_mma, workspace, stream);
}

// Instantiated once each, in attention_bwd_fp32.cu, attention_bwd_fp16.cu, attention_bwd_bf16.cu.
extern template cudaError_t run_bwd_d<float>(const gm_attention_bwd_args& a, const attn_dims& d, const bwd_layout& ws, bool use_mma,
                      void* workspace, cudaStream_t stream);
extern template cudaError_t run_bwd_d<__half>(const gm_attention_bwd_args& a, const attn_dims& d, const bwd_layout& ws, bool use_mma,
                      void* workspace, cudaStream_t stream);
extern template cudaError_t run_bwd_d<__nv_bfloat16>(const gm_attention_bwd_args& a, const attn_dims& d, const bwd_layout& ws, bool use_mma,
                      void* workspace, cudaStream_t stream);

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
