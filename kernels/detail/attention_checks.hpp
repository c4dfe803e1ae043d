//! \file attention_checks.hpp
//! Private, host only: the argument checks shared by the forward and backward entry points.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "attention_params.hpp"
#include "host_checks.hpp"

namespace greenmim {
namespace detail {
namespace cuda {

struct attn_dims {
  std::int64_t B = 0, N = 0, H = 0, D = 0;
  int bias_rows = 0;
  bool with_bias = false;
  int q_tiles = 1;  // row tiles per group (attention_traits.hpp)
  float scale = 1.f;
};

//! dtype, q (defines the shape), bias table, partition, window, scale, algo, grid limits.
inline cudaError_t check_attention_core(gm_dtype dtype, const gm_tensor& q, const gm_tensor& bias,
                                        const gm_partition& part, int window, float scale, gm_algo algo,
                                        attn_dims& d) {
  GM_REFUSE_IF(!valid_dtype(dtype), "dtype must be GM_FLOAT32, GM_FLOAT16 or GM_BFLOAT16");
  GM_REFUSE_IF(algo != GM_ALGO_AUTO && algo != GM_ALGO_SIMT && algo != GM_ALGO_MMA, "unknown algo");
  GM_REFUSE_IF(q.rank != 4, "q must have rank 4 [B, N, heads, head_dim]");
  for (int i = 0; i < 4; ++i) GM_REFUSE_IF(q.extent[i] < 0, "q: negative extent");
  d.B = q.extent[0];
  d.N = q.extent[1];
  d.H = q.extent[2];
  d.D = q.extent[3];
  GM_REFUSE_IF(d.D != 32 && d.D != 64, "head_dim must be 32 or 64");
  const std::int64_t ext[4] = {d.B, d.N, d.H, d.D};
  GM_TRY(check_tensor(q, 4, ext, dtype_bytes(dtype), true, false,
                      "q: null, misaligned, negative strides, or last dimension not unit-stride"));
  GM_REFUSE_IF(d.B > 65535, "batch must be <= 65535 (grid z)");
  GM_REFUSE_IF(d.H > 65535, "heads must be <= 65535 (grid y)");
  GM_REFUSE_IF(d.N > std::numeric_limits<index_t>::max(), "token axis longer than int32");
  GM_REFUSE_IF(!std::isfinite(scale), "scale must be finite (0 selects head_dim^-0.5)");
  d.scale = scale == 0.f ? 1.f / std::sqrt(static_cast<float>(d.D)) : scale;
  // partition
  GM_REFUSE_IF(part.group_size < 1 || part.group_size > GM_SIMT_MAX_GROUP, "group_size must be in [1, GM_SIMT_MAX_GROUP]");
  GM_REFUSE_IF(part.num_groups < 0, "num_groups must be >= 0");
  GM_REFUSE_IF(part.num_tokens != d.N, "part.num_tokens must equal the token extent of q");
  const std::int64_t slots = static_cast<std::int64_t>(part.group_size) * part.num_groups;
  GM_REFUSE_IF(slots > std::numeric_limits<index_t>::max(), "num_groups * group_size overflows int32");
  d.q_tiles = tiles_of(part.group_size);
  GM_REFUSE_IF(static_cast<std::int64_t>(part.num_groups) * d.q_tiles > std::numeric_limits<int>::max(),
               "too many groups for the grid");
  GM_REFUSE_IF(slots > 0 && (part.gather == nullptr || part.slot_window == nullptr),
               "part.gather and part.slot_window must be non-null");
  GM_REFUSE_IF(!aligned4(part.gather) || !aligned4(part.slot_window) || !aligned4(part.slot_coord) ||
                   !aligned4(part.scatter),
               "the partition's int32 arrays must be 4-byte aligned");
  // bias
  d.with_bias = bias.data != nullptr;
  if (d.with_bias) {
    GM_REFUSE_IF(window < 1 || window > GM_MAX_WINDOW, "window must be in [1, GM_MAX_WINDOW] with a bias table");
    const std::int64_t rows = (2 * static_cast<std::int64_t>(window) - 1) * (2 * static_cast<std::int64_t>(window) - 1);
    const std::int64_t bext[2] = {rows, d.H};
    GM_TRY(check_tensor(bias, 2, bext, sizeof(float), false, false,
                        "bias_table must be float32 [(2*window-1)^2, heads], element-aligned, non-negative strides"));
    GM_REFUSE_IF(slots > 0 && part.slot_coord == nullptr, "part.slot_coord must be non-null with a bias table");
    d.bias_rows = static_cast<int>(rows);
  }
  return cudaSuccess;
}

//! A [B, N, heads] float32 row tensor (lse).
inline cudaError_t check_lse(const gm_tensor& lse, const attn_dims& d, bool output, const char* why) {
  const std::int64_t ext[3] = {d.B, d.N, d.H};
  return check_tensor(lse, 3, ext, sizeof(float), false, output, why);
}

inline cudaError_t check_like_q(const gm_tensor& x, const attn_dims& d, gm_dtype dtype, bool output, const char* why) {
  const std::int64_t ext[4] = {d.B, d.N, d.H, d.D};
  return check_tensor(x, 4, ext, dtype_bytes(dtype), true, output, why);
}

template <class T>
rows4<T> to_rows(const gm_tensor& t) {
  rows4<T> r;
  r.data = static_cast<T*>(t.data);
  r.s[0] = t.stride[0];
  r.s[1] = t.stride[1];
  r.s[2] = t.stride[2];
  return r;
}

inline rows3f to_rows3(const gm_tensor& t) {
  rows3f r;
  r.data = static_cast<float*>(t.data);
  r.s[0] = t.stride[0];
  r.s[1] = t.stride[1];
  r.s[2] = t.stride[2];
  return r;
}

inline table2f to_table(const gm_tensor& t, int rows) {
  table2f r;
  r.data = static_cast<float*>(t.data);
  r.s0 = t.stride[0];
  r.s1 = t.stride[1];
  r.rows = r.data != nullptr ? rows : 0;
  return r;
}

//! The kernel parameters the forward and backward share (fwd_params / bwd_params of element type
//! T), from their C arguments `a` and the checked problem `d`.
template <class T, class Params, class Args>
void set_shared_params(Params& p, const Args& a, const attn_dims& d) {
  p.q = to_rows<const T>(a.q);
  p.k = to_rows<const T>(a.k);
  p.v = to_rows<const T>(a.v);
  p.lse = to_rows3(a.lse);
  p.bias = to_table(a.bias_table, d.bias_rows);
  p.part = to_view(a.part);
  p.batch = static_cast<int>(d.B);
  p.heads = static_cast<int>(d.H);
  p.window = a.window > 0 ? a.window : 1;
  p.scale = d.scale;
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
