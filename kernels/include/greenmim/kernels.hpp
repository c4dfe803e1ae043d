//! \file kernels.hpp
//! C++ face of the greenmim CUDA kernels: launchers taking greenmim views and a cudaStream_t,
//! returning cudaError_t, with `can_implement` pre-flight checks. Thin inline wrappers over the C
//! ABI of kernels.h (one implementation, one set of checks). Host code only; compiles with any
//! C++17 compiler that sees the CUDA headers (no nvcc needed).
//!
//! \code
//! namespace gk = greenmim::kernels;
//! gk::attention_forward_args<__nv_bfloat16> a;
//! a.q = q; a.k = k; a.v = v; a.o = o; a.lse = lse;   // [B, N, heads, head_dim] device views
//! a.bias = bias_table; a.window = 7;                 // [(2p-1)^2, heads] float32
//! a.part = device_partition;                         // partition_view of device arrays
//! if (gk::can_implement(a) == cudaSuccess) gk::attention_forward(a, stream);
//! \endcode
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include <greenmim/kernels.h>

#include <greenmim/config.hpp>
#include <greenmim/geometry.hpp>
#include <greenmim/partition_types.hpp>
#include <greenmim/plan.hpp>
#include <greenmim/status.hpp>
#include <greenmim/view.hpp>

namespace greenmim {
namespace kernels {

//! Implementation choice (see gm_algo).
enum class algo : int { automatic = GM_ALGO_AUTO, simt = GM_ALGO_SIMT, mma = GM_ALGO_MMA };

template <class T>
struct dtype_of;
template <>
struct dtype_of<float> { static constexpr gm_dtype value = GM_FLOAT32; };
template <>
struct dtype_of<__half> { static constexpr gm_dtype value = GM_FLOAT16; };
template <>
struct dtype_of<__nv_bfloat16> { static constexpr gm_dtype value = GM_BFLOAT16; };

//! A view as a C tensor descriptor (no copy of data).
template <class T, int R>
gm_tensor to_tensor(const tensor_view<T, R>& v) {
  static_assert(R >= 1 && R <= 4, "rank 1..4");
  gm_tensor t{};
  t.data = const_cast<void*>(static_cast<const void*>(v.data));
  t.rank = R;
  for (int i = 0; i < R; ++i) {
    t.extent[i] = v.extent[i];
    t.stride[i] = v.stride[i];
  }
  return t;
}

inline gm_partition to_partition(const partition_view& p) {
  return gm_partition{p.gather, p.scatter, p.slot_window, p.slot_coord, p.group_size, p.num_groups, p.num_tokens};
}

inline gm_window_geometry to_geometry(const window_geometry& g) {
  return gm_window_geometry{g.height, g.width, g.window, g.shift};
}

// ---- attention ------------------------------------------------------------------------------------

//! Forward arguments (device views). T in {float, __half, __nv_bfloat16}.
template <class T>
struct attention_forward_args {
  tensor_view<const T, 4> q, k, v;  //!< [B, N, heads, head_dim]
  tensor_view<T, 4> o;              //!< [B, N, heads, head_dim], real token rows overwritten
  tensor_view<float, 3> lse;        //!< [B, N, heads]; data null = not written
  tensor_view<const float, 2> bias; //!< [(2p-1)^2, heads]; data null = no bias
  partition_view part;              //!< device index arrays
  index_t window = 0;               //!< p (with a bias)
  float scale = 0.f;                //!< 0 = head_dim^-0.5
  algo alg = algo::automatic;
};

//! Backward arguments: o, lse from the forward; dq, dk, dv overwritten; dbias accumulated (+=).
template <class T>
struct attention_backward_args {
  tensor_view<const T, 4> q, k, v, o, d_o;
  tensor_view<const float, 3> lse;
  tensor_view<const float, 2> bias;
  tensor_view<T, 4> dq, dk, dv;
  tensor_view<float, 2> dbias;      //!< data null = skipped
  partition_view part;
  index_t window = 0;
  float scale = 0.f;
  algo alg = algo::automatic;
};

template <class T>
gm_attention_fwd_args to_c(const attention_forward_args<T>& a) {
  gm_attention_fwd_args c{};
  c.dtype = dtype_of<T>::value;
  c.q = to_tensor(a.q);
  c.k = to_tensor(a.k);
  c.v = to_tensor(a.v);
  c.o = to_tensor(a.o);
  c.lse = to_tensor(a.lse);
  c.bias_table = to_tensor(a.bias);
  c.part = to_partition(a.part);
  c.window = a.window;
  c.scale = a.scale;
  c.algo = static_cast<gm_algo>(a.alg);
  return c;
}

template <class T>
gm_attention_bwd_args to_c(const attention_backward_args<T>& a) {
  gm_attention_bwd_args c{};
  c.dtype = dtype_of<T>::value;
  c.q = to_tensor(a.q);
  c.k = to_tensor(a.k);
  c.v = to_tensor(a.v);
  c.o = to_tensor(a.o);
  c.d_o = to_tensor(a.d_o);
  c.lse = to_tensor(a.lse);
  c.bias_table = to_tensor(a.bias);
  c.dq = to_tensor(a.dq);
  c.dk = to_tensor(a.dk);
  c.dv = to_tensor(a.dv);
  c.d_bias_table = to_tensor(a.dbias);
  c.part = to_partition(a.part);
  c.window = a.window;
  c.scale = a.scale;
  c.algo = static_cast<gm_algo>(a.alg);
  return c;
}

//! Pre-flight check; cudaSuccess or cudaErrorInvalidValue (reason: gm_last_refusal()). O(1), no device access.
template <class T>
cudaError_t can_implement(const attention_forward_args<T>& a) {
  const gm_attention_fwd_args c = to_c(a);
  return gm_attention_fwd_can_implement(&c);
}
template <class T>
cudaError_t can_implement(const attention_backward_args<T>& a) {
  const gm_attention_bwd_args c = to_c(a);
  return gm_attention_bwd_can_implement(&c);
}

//! Fused forward on `stream`. O(B * heads * sum over windows of w_i^2 * head_dim) work.
template <class T>
cudaError_t attention_forward(const attention_forward_args<T>& a, cudaStream_t stream = nullptr) {
  const gm_attention_fwd_args c = to_c(a);
  return gm_attention_fwd(&c, stream);
}

//! Device workspace of `attention_backward` in bytes.
template <class T>
cudaError_t workspace_size(const attention_backward_args<T>& a, std::size_t& bytes) {
  const gm_attention_bwd_args c = to_c(a);
  return gm_attention_bwd_workspace_size(&c, &bytes);
}

//! Fused backward on `stream`; `workspace` holds `workspace_size` bytes (256-byte aligned).
template <class T>
cudaError_t attention_backward(const attention_backward_args<T>& a, void* workspace, std::size_t workspace_bytes,
                               cudaStream_t stream = nullptr) {
  const gm_attention_bwd_args c = to_c(a);
  return gm_attention_bwd(&c, workspace, workspace_bytes, stream);
}

// ---- partition / unpartition ------------------------------------------------------------------------

template <class T>
gm_partition_args partition_args(const partition_view& p, tensor_view<const T, 3> x, tensor_view<const T, 3> y) {
  gm_partition_args c{};
  c.dtype = dtype_of<T>::value;
  c.x = to_tensor(x);
  c.y = to_tensor(y);
  c.part = to_partition(p);
  return c;
}

//! y[b, s, :] = x[b, gather[s], :], zero rows for padding. x [B, N, C], y [B, n_g*G, C] on the device.
template <class T>
cudaError_t partition_tokens(const partition_view& p, tensor_view<const T, 3> x, tensor_view<T, 3> y,
                             cudaStream_t stream = nullptr) {
  const gm_partition_args c = partition_args<T>(p, x, y);
  return gm_partition_tokens(&c, stream);
}

//! x[b, t, :] = y[b, scatter[t], :]. Inverse of partition_tokens on real tokens (bit-exact).
template <class T>
cudaError_t unpartition_tokens(const partition_view& p, tensor_view<const T, 3> y, tensor_view<T, 3> x,
                               cudaStream_t stream = nullptr) {
  const gm_partition_args c = partition_args<T>(p, x, y);
  return gm_unpartition_tokens(&c, stream);
}

// ---- index building helpers (host) ---------------------------------------------------------------------

//! The per-window table gm_build_partition takes: for each window w of `sizes` (the planner's
//! input), `group[w]` = its group in `p` and `slot_offset[w]` = the slot of its first token inside
//! the group (sum of the sizes of the windows before it in the group, plan order); -1 for windows
//! in no group. Fails with the status of `validate_plan`. O(num_windows).
inline status window_slot_table(const plan& p, span<const index_t> sizes, std::vector<index_t>& group,
                                std::vector<index_t>& slot_offset) {
  if (status s = validate_plan(sizes, p); s != status::success) return s;
  std::vector<index_t> gr(static_cast<std::size_t>(sizes.size()), pad_index);
  std::vector<index_t> off(static_cast<std::size_t>(sizes.size()), pad_index);
  for (index_t g = 0; g < p.num_groups(); ++g) {
    index_t o = 0;
    for (index_t w : p.group(g)) {
      gr[static_cast<std::size_t>(w)] = g;
      off[static_cast<std::size_t>(w)] = o;
      o += sizes[w];
    }
  }
  group.swap(gr);
  slot_offset.swap(off);
  return status::success;
}

}  // namespace kernels
}  // namespace greenmim
