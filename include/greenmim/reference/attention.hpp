//! \file reference/attention.hpp
//! CPU reference of Group Window Attention (the paper's Group Window Attention with Masked
//! Attention and relative position bias), forward and backward,
//! and the window-by-window oracle it is proven against.
//!
//! - `group_attention_forward` / `group_attention_backward`: what a kernel computes. Per
//!   (sample, group, head) the G slots of the group are gathered through `partition_view::gather`,
//!   `S = (scale*Q) K^T` (G x G, Eigen) gets the relative-position bias
//!   `bias[rel_pos_index(coords), head]` where `attends(window ids)` and the mask elsewhere, the
//!   rows are soft-maxed, `O = P V` (Eigen), and the rows of real slots are scattered back to their
//!   tokens. Padding rows are never written.
//! - `window_attention_oracle` / `window_attention_oracle_backward`: dense attention computed
//!   window by window straight from the token axis, a per-token window id and per-token
//!   coordinates. No groups, no padding, no mask: the definition the grouped version must equal.
//!
//! Mask semantics (`mask_mode`):
//! - `exact` (default): cross-window and padding pairs are skipped exactly (-inf semantics). No
//!   value of another window in the same group reaches a row, not even a NaN: when a group holds
//!   a non-finite input the affected products are evaluated pair by pair over attending pairs only.
//! - `additive`: the released code's semantics. `mask_value` (e.g. -100) is added to
//!   cross-window and padding scores, padding slots are zero vectors and take part in the
//!   softmax, bias is zero across windows. Rows are then not exactly isolated (by about
//!   exp(mask_value)); non-finite values leak across windows of a group, as in PyTorch.
//!
//! Accumulation is in T (float or double); lse is `m + log(sum exp(s - m))` per row.
//! Non-finite inputs propagate: NaN in q, k, v or dout gives NaN rows (Inf in q or k gives NaN;
//! Inf in v gives +-Inf or NaN) and never makes a loop run longer; no branch depends on data
//! except the finite test that picks the pairwise path.
//!
//! Preconditions the checks cannot see: output views must not overlap input views (outputs may
//! interleave one another, e.g. dq, dk, dv inside one packed [B, N, 3, H, D] buffer, as long as
//! no element is shared).
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../geometry.hpp"
#include "../partition_types.hpp"
#include "../status.hpp"
#include "../view.hpp"

namespace greenmim {
namespace reference {

//! How cross-window and padding pairs of a group are masked.
enum class mask_mode : int {
  exact = 0,  //!< skipped exactly (-inf semantics); the default
  additive,   //!< `mask_value` added (the released code: -100), padding takes part as zeros
};

//! head_dim^-0.5, the default scale. Precondition: head_dim > 0. O(1).
template <class T>
T default_scale(index_t head_dim) {
  return T(1) / std::sqrt(T(head_dim));
}

//! Arguments of `group_attention_forward`.
template <class T>
struct attention_args {
  tensor_view<const T, 4> q, k, v;  //!< [B, N, heads, head_dim], any non-negative strides
  partition_view part;              //!< groups over the token axis; part.num_tokens == N
  tensor_view<const T, 2> bias;     //!< [(2p-1)^2, heads] relative-position table; data null = no bias
  index_t window = 0;               //!< p (needed only with a bias table)
  T scale = T(0);                   //!< 0 selects head_dim^-0.5
  mask_mode mask = mask_mode::exact;
  T mask_value = T(-100);           //!< used by `mask_mode::additive` only
  tensor_view<T, 4> out;            //!< [B, N, heads, head_dim], overwritten
  tensor_view<T, 3> lse;            //!< [B, N, heads] log-sum-exp of each row; data null = not written
};

//! Arguments of `group_attention_backward`. Same conventions as `attention_args`; `o` and `lse`
//! are the forward's outputs for the same inputs.
template <class T>
struct attention_backward_args {
  tensor_view<const T, 4> q, k, v, o, dout;  //!< [B, N, heads, head_dim]
  tensor_view<const T, 3> lse;               //!< [B, N, heads], required
  partition_view part;
  tensor_view<const T, 2> bias;              //!< as in the forward; data null = no bias
  index_t window = 0;
  T scale = T(0);
  mask_mode mask = mask_mode::exact;
  T mask_value = T(-100);
  tensor_view<T, 4> dq, dk, dv;              //!< [B, N, heads, head_dim], overwritten
  tensor_view<T, 2> dbias;                   //!< shape of `bias`, accumulated (+=); data null = skipped
};

//! Arguments of the window-by-window oracle (forward).
template <class T>
struct oracle_args {
  tensor_view<const T, 4> q, k, v;       //!< [B, N, heads, head_dim]
  span<const index_t> token_window;      //!< [N] window id of each token (any id >= 0; equal ids attend)
  span<const index_t> token_coord;       //!< [N] packed (h, w) (`pack_coord`); needed with a bias only
  tensor_view<const T, 2> bias;          //!< [(2p-1)^2, heads]; data null = no bias
  index_t window = 0;                    //!< p
  T scale = T(0);                        //!< 0 selects head_dim^-0.5
  tensor_view<T, 4> out;                 //!< [B, N, heads, head_dim]
  tensor_view<T, 3> lse;                 //!< [B, N, heads]; data null = not written
};

//! Arguments of the window-by-window oracle (backward). It recomputes the forward itself.
template <class T>
struct oracle_backward_args {
  tensor_view<const T, 4> q, k, v, dout;
  span<const index_t> token_window;
  span<const index_t> token_coord;
  tensor_view<const T, 2> bias;
  index_t window = 0;
  T scale = T(0);
  tensor_view<T, 4> dq, dk, dv;
  tensor_view<T, 2> dbias;               //!< accumulated (+=); data null = skipped
};

//! Splits a packed `[B, N, 3, heads, head_dim]` view (the output of a qkv projection) into three
//! `[B, N, heads, head_dim]` views sharing its memory. Works for const and mutable T (e.g. a
//! packed dqkv gradient). Returns `shape_mismatch` unless extent[2] == 3. O(1).
template <class T>
status split_qkv(const tensor_view<T, 5>& qkv, tensor_view<T, 4>& q, tensor_view<T, 4>& k,
                 tensor_view<T, 4>& v) {
  if (qkv.extent[2] != 3) return status::shape_mismatch;
  tensor_view<T, 4>* outs[3] = {&q, &k, &v};
  for (int j = 0; j < 3; ++j) {
    tensor_view<T, 4>& o = *outs[j];
    o.data = qkv.data == nullptr ? nullptr : qkv.data + j * qkv.stride[2];
    const int src[4] = {0, 1, 3, 4};
    for (int i = 0; i < 4; ++i) {
      o.extent[i] = qkv.extent[src[i]];
      o.stride[i] = qkv.stride[src[i]];
    }
  }
  return status::success;
}

namespace detail {

template <class T>
using mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <class V>
bool strides_non_negative(const V& v, int rank) {
  for (int i = 0; i < rank; ++i)
    if (v.stride[i] < 0 || v.extent[i] < 0) return false;
  return true;
}

//! True when no two index tuples of `v` address the same element (sufficient test: sorted by
//! stride, each stride is at least the span of the dimensions below it).
template <class T, int R>
bool is_injective(const tensor_view<T, R>& v) {
  if (v.numel() == 0) return true;
  int order[R];
  for (int i = 0; i < R; ++i) order[i] = i;
  std::sort(order, order + R, [&](int a, int b) { return v.stride[a] < v.stride[b]; });
  std::int64_t span_below = 1;  // elements spanned by the dimensions sorted so far
  for (int i = 0; i < R; ++i) {
    const int d = order[i];
    if (v.extent[d] == 1) continue;
    if (v.stride[d] < span_below) return false;
    span_below = v.stride[d] * (v.extent[d] - 1) + span_below;
  }
  return true;
}

template <class A, class B, int R>
bool same_extents(const tensor_view<A, R>& a, const tensor_view<B, R>& b) {
  for (int i = 0; i < R; ++i)
    if (a.extent[i] != b.extent[i]) return false;
  return true;
}

//! Extents [B, N, H] and [B, N, H, D] of the inputs; the usual checks of a 4-D view against q.
template <class T, class U>
status check_like_q(const tensor_view<T, 4>& q, const tensor_view<U, 4>& x, bool output) {
  if (!same_extents(q, x) || !strides_non_negative(x, 4)) return status::shape_mismatch;
  if (output && !is_injective(x)) return status::shape_mismatch;
  if (x.numel() > 0 && x.data == nullptr) return status::invalid_argument;
  return status::success;
}

template <class T, class U>
status check_rows(const tensor_view<T, 4>& q, const tensor_view<U, 3>& x, bool output) {
  for (int i = 0; i < 3; ++i)
    if (x.extent[i] != q.extent[i]) return status::shape_mismatch;
  if (!strides_non_negative(x, 3)) return status::shape_mismatch;
  if (output && !is_injective(x)) return status::shape_mismatch;
  if (x.numel() > 0 && x.data == nullptr) return status::invalid_argument;
  return status::success;
}

//! Shape of q itself: non-negative extents and strides, head_dim >= 1 when there is any row.
template <class T>
status check_q(const tensor_view<const T, 4>& q) {
  if (!strides_non_negative(q, 4)) return status::shape_mismatch;
  if (q.extent[0] * q.extent[1] * q.extent[2] > 0 && q.extent[3] <= 0) return status::invalid_argument;
  if (q.numel() > 0 && q.data == nullptr) return status::invalid_argument;
  return status::success;
}

//! Bias table (if given): p > 0, extents [(2p-1)^2, heads].
template <class T>
status check_bias(const tensor_view<const T, 2>& bias, index_t window, index_t heads) {
  if (bias.data == nullptr) return status::success;
  if (window <= 0 || window > 16384) return status::invalid_argument;
  const std::int64_t rows = (2 * static_cast<std::int64_t>(window) - 1) * (2 * static_cast<std::int64_t>(window) - 1);
  if (bias.extent[0] != rows || bias.extent[1] != heads || !strides_non_negative(bias, 2))
    return status::shape_mismatch;
  return status::success;
}

//! Output bias gradient: null, or the shape of the bias table (and a bias table must exist).
template <class T>
status check_dbias(const tensor_view<const T, 2>& bias, const tensor_view<T, 2>& dbias) {
  if (dbias.data == nullptr) return status::success;
  if (bias.data == nullptr) return status::shape_mismatch;
  if (!same_extents(bias, dbias) || !strides_non_negative(dbias, 2) || !is_injective(dbias))
    return status::shape_mismatch;
  return status::success;
}

//! True when two coordinates of one window are close enough for the bias table of window p.
inline bool within_window(index_t ca, index_t cb, index_t p) {
  const index_t dh = coord_h(ca) - coord_h(cb), dw = coord_w(ca) - coord_w(cb);
  return dh > -p && dh < p && dw > -p && dw < p;
}

//! The partition against a token axis of length n: ranges, exact cover, pad consistency and, with
//! a bias, the coordinates of every attending pair inside the table. O(n_g*G^2) with a bias,
//! O(n_g*G + N) without.
inline status check_partition(const partition_view& part, std::int64_t n, bool with_bias, index_t window) {
  if (part.num_tokens != n) return status::shape_mismatch;
  if (part.group_size < 0 || part.num_groups < 0) return status::invalid_argument;
  const std::int64_t slots = static_cast<std::int64_t>(part.group_size) * part.num_groups;
  if (slots > std::numeric_limits<index_t>::max()) return status::overflow;
  if (slots > 0 && (part.gather == nullptr || part.slot_window == nullptr ||
                    (with_bias && part.slot_coord == nullptr)))
    return status::invalid_argument;
  if (n > 0 && part.scatter == nullptr) return status::invalid_argument;
  std::int64_t real = 0;
  for (std::int64_t s = 0; s < slots; ++s) {
    const index_t t = part.gather[s];
    const index_t w = part.slot_window[s];
    if (t == pad_index) {
      if (w != pad_index) return status::out_of_range;
      continue;
    }
    if (t < 0 || t >= n || w < 0) return status::out_of_range;
    if (with_bias && part.slot_coord[s] < 0) return status::out_of_range;
    ++real;
  }
  for (std::int64_t t = 0; t < n; ++t)
    if (part.scatter[t] < 0 || part.scatter[t] >= slots) return status::out_of_range;
  if (real != n) return status::not_covered;
  for (std::int64_t s = 0; s < slots; ++s) {
    const index_t t = part.gather[s];
    if (t != pad_index && part.scatter[t] != s) return status::not_covered;
  }
  if (with_bias) {
    const index_t G = part.group_size;
    for (index_t g = 0; g < part.num_groups; ++g) {
      const std::int64_t base = static_cast<std::int64_t>(g) * G;
      for (index_t i = 0; i < G; ++i)
        for (index_t j = i + 1; j < G; ++j)
          if (attends(part.slot_window[base + i], part.slot_window[base + j]) &&
              !within_window(part.slot_coord[base + i], part.slot_coord[base + j], window))
            return status::out_of_range;
    }
  }
  return status::success;
}

template <class T>
T resolve_scale(T scale, std::int64_t head_dim) {
  return scale == T(0) ? default_scale<T>(static_cast<index_t>(head_dim)) : scale;
}

//! Pointer to row (b, t, h, :) of a 4-D view.
template <class T>
T* row_ptr(const tensor_view<T, 4>& x, std::int64_t b, std::int64_t t, std::int64_t h) {
  return x.data + b * x.stride[0] + t * x.stride[1] + h * x.stride[2];
}

//! Copies rows (b, tokens[s], h, :) into the rows of `dst` (zero rows for padding, t < 0).
template <class T>
void gather_rows(const tensor_view<const T, 4>& x, std::int64_t b, std::int64_t h, const index_t* tokens,
                 index_t rows, mat<T>& dst) {
  const std::int64_t D = x.extent[3], sd = x.stride[3];
  for (index_t s = 0; s < rows; ++s) {
    T* out = dst.data() + static_cast<std::int64_t>(s) * D;
    if (tokens[s] < 0) {
      std::fill(out, out + D, T(0));
      continue;
    }
    const T* in = row_ptr(x, b, tokens[s], h);
    if (sd == 1)
      std::copy(in, in + D, out);
    else
      for (std::int64_t d = 0; d < D; ++d) out[d] = in[d * sd];
  }
}

//! Writes the rows of real slots of `src` to rows (b, tokens[s], h, :); padding is skipped.
template <class T>
void scatter_rows(const mat<T>& src, const index_t* tokens, index_t rows, const tensor_view<T, 4>& x,
                  std::int64_t b, std::int64_t h) {
  const std::int64_t D = x.extent[3], sd = x.stride[3];
  for (index_t s = 0; s < rows; ++s) {
    if (tokens[s] < 0) continue;
    T* out = row_ptr(x, b, tokens[s], h);
    const T* in = src.data() + static_cast<std::int64_t>(s) * D;
    if (sd == 1)
      std::copy(in, in + D, out);
    else
      for (std::int64_t d = 0; d < D; ++d) out[d * sd] = in[d];
  }
}

//! Per-group pair table: rel[i*G+j] = bias row of the pair (i, j) when the pair attends, -1 when it
//! does not (cross-window or padding). With no bias table, attending pairs get row 0 (unused).
inline void pair_table(const partition_view& part, index_t g, bool with_bias, index_t window,
                       std::vector<index_t>& rel) {
  const index_t G = part.group_size;
  const std::int64_t base = static_cast<std::int64_t>(g) * G;
  rel.assign(static_cast<size_t>(G) * G, -1);
  for (index_t i = 0; i < G; ++i) {
    const index_t wi = part.slot_window[base + i];
    for (index_t j = 0; j < G; ++j) {
      const index_t wj = part.slot_window[base + j];
      if (!attends(wi, wj)) continue;
      rel[static_cast<size_t>(i) * G + j] =
          with_bias ? slot_rel_pos_index(wi, wj, part.slot_coord[base + i], part.slot_coord[base + j], window) : 0;
    }
  }
}

//! Adds bias and mask to the scores of real rows: attending pairs get bias[rel, h]; the others
//! get -inf (exact) or mask_value (additive). Rows of padding slots are left alone.
template <class T>
void bias_and_mask(mat<T>& S, const std::vector<index_t>& rel, const index_t* tokens, index_t G,
                   const tensor_view<const T, 2>& bias, std::int64_t h, mask_mode mode, T mask_value) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  for (index_t i = 0; i < G; ++i) {
    if (tokens[i] < 0) continue;
    T* srow = S.data() + static_cast<std::int64_t>(i) * G;
    const index_t* rrow = rel.data() + static_cast<size_t>(i) * G;
    for (index_t j = 0; j < G; ++j) {
      const index_t r = rrow[j];
      if (r >= 0) {
        if (bias.data != nullptr) srow[j] += bias(r, h);
      } else {
        srow[j] = mode == mask_mode::exact ? neg_inf : srow[j] + mask_value;
      }
    }
  }
}

template <class T>
bool all_finite(const mat<T>& m) {
  const T* p = m.data();
  for (std::int64_t i = 0, n = m.size(); i < n; ++i)
    if (!std::isfinite(p[i])) return false;
  return true;
}

//! Sorts tokens by (window id, token) and returns CSR offsets of the windows: the oracle's buckets.
inline void window_buckets(span<const index_t> token_window, std::vector<index_t>& order,
                           std::vector<index_t>& offsets) {
  const std::int64_t n = token_window.size();
  order.resize(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](index_t a, index_t b) { return token_window[a] < token_window[b]; });
  offsets.assign(1, 0);
  for (std::int64_t i = 1; i <= n; ++i)
    if (i == n || token_window[order[i]] != token_window[order[i - 1]]) offsets.push_back(static_cast<index_t>(i));
  if (n == 0) offsets.assign(1, 0);
}

//! Oracle token-map checks: sizes, ids >= 0, and with a bias every same-window pair within p.
inline status check_token_map(span<const index_t> token_window, span<const index_t> token_coord,
                              std::int64_t n, bool with_bias, index_t window) {
  if (token_window.size() != n) return status::shape_mismatch;
  if (n > 0 && token_window.data() == nullptr) return status::invalid_argument;
  for (std::int64_t t = 0; t < n; ++t)
    if (token_window[t] < 0) return status::out_of_range;
  if (!with_bias) return status::success;
  if (token_coord.size() != n) return status::shape_mismatch;
  if (n > 0 && token_coord.data() == nullptr) return status::invalid_argument;
  for (std::int64_t t = 0; t < n; ++t)
    if (token_coord[t] < 0) return status::out_of_range;
  std::vector<index_t> order, offsets;
  window_buckets(token_window, order, offsets);
  for (size_t w = 0; w + 1 < offsets.size(); ++w)
    for (index_t a = offsets[w]; a < offsets[w + 1]; ++a)
      for (index_t b = a + 1; b < offsets[w + 1]; ++b)
        if (!within_window(token_coord[order[a]], token_coord[order[b]], window)) return status::out_of_range;
  return status::success;
}

}  // namespace detail

//! Pre-flight of `group_attention_forward`: q, k, v, out extents [B, N, H, D] equal, lse [B, N, H]
//! (if given), non-negative strides, outputs without self-overlap (`shape_mismatch`); head_dim >= 1
//! and non-null data (`invalid_argument`); bias table [(2p-1)^2, H] with p > 0 (`shape_mismatch`,
//! `invalid_argument`); partition indices in range (`out_of_range`), gather/scatter an exact
//! inverse pair covering every token once (`not_covered`), and with a bias every attending pair
//! within p of each other (`out_of_range`). Writes nothing. O(N + n_g*G^2).
template <class T>
status can_implement(const attention_args<T>& a) {
  status s;
  if ((s = detail::check_q(a.q)) != status::success) return s;
  if ((s = detail::check_like_q(a.q, a.k, false)) != status::success) return s;
  if ((s = detail::check_like_q(a.q, a.v, false)) != status::success) return s;
  if ((s = detail::check_like_q(a.q, a.out, true)) != status::success) return s;
  if (a.lse.data != nullptr && (s = detail::check_rows(a.q, a.lse, true)) != status::success) return s;
  if (a.mask != mask_mode::exact && a.mask != mask_mode::additive) return status::invalid_argument;
  if ((s = detail::check_bias(a.bias, a.window, static_cast<index_t>(a.q.extent[2]))) != status::success) return s;
  return detail::check_partition(a.part, a.q.extent[1], a.bias.data != nullptr, a.window);
}

//! Pre-flight of `group_attention_backward`: as the forward's, for q, k, v, o, dout, dq, dk, dv
//! ([B, N, H, D]) and lse ([B, N, H], required); dbias, when given, needs a bias table and its
//! shape (`shape_mismatch`). Writes nothing. O(N + n_g*G^2).
template <class T>
status can_implement(const attention_backward_args<T>& a) {
  status s;
  if ((s = detail::check_q(a.q)) != status::success) return s;
  if ((s = detail::check_like_q(a.q, a.k, false)) != status::success) return s;
  if ((s = detail::check_like_q(a.q, a.v, false)) != status::success) return s;
  if ((s = detail::check_like_q(a.q, a.o, false)) != status::success) return s;
  if ((s = detail::check_like_q(a.q, a.dout, false)) != status::success) return s;
  if ((s = detail::check_rows(a.q, a.lse, false)) != status::success) return s;
  if ((s = detail::check_like_q(a.q, a.dq, true)) != status::success) return s;
  if ((s = detail::check_like_q(a.q, a.dk, true)) != status::success) return s;
  if ((s = detail::check_like_q(a.q, a.dv, true)) != status::success) return s;
  if (a.mask != mask_mode::exact && a.mask != mask_mode::additive) return status::invalid_argument;
  if ((s = detail::check_bias(a.bias, a.window, static_cast<index_t>(a.q.extent[2]))) != status::success) return s;
  if ((s = detail::check_dbias(a.bias, a.dbias)) != status::success) return s;
  return detail::check_partition(a.part, a.q.extent[1], a.bias.data != nullptr, a.window);
}

//! Pre-flight of `window_attention_oracle`: view checks as `can_implement(attention_args)`;
//! token_window of size N with ids >= 0; with a bias, token_coord of size N and every same-window
//! pair within p (`out_of_range`). O(N log N + sum of squared window sizes).
template <class T>
status can_implement(const oracle_args<T>& a) {
  status s;
  if ((s = detail::check_q(a.q)) != status::success) return s;
  if ((s = detail::check_like_q(a.q, a.k, false)) != status::success) return s;
  if ((s = detail::check_like_q(a.q, a.v, false)) != status::success) return s;
  if ((s = detail::check_like_q(a.q, a.out, true)) != status::success) return s;
  if (a.lse.data != nullptr && (s = detail::check_rows(a.q, a.lse, true)) != status::success) return s;
  if ((s = detail::check_bias(a.bias, a.window, static_cast<index_t>(a.q.extent[2]))) != status::success) return s;
  return detail::check_token_map(a.token_window, a.token_coord, a.q.extent[1], a.bias.data != nullptr, a.window);
}

//! Pre-flight of `window_attention_oracle_backward` (as the oracle forward's, plus dout, dq, dk,
//! dv and dbias as in `can_implement(attention_backward_args)`).
template <class T>
status can_implement(const oracle_backward_args<T>& a) {
  status s;
  if ((s = detail::check_q(a.q)) != status::success) return s;
  if ((s = detail::check_like_q(a.q, a.k, false)) != status::success) return s;
  if ((s = detail::check_like_q(a.q, a.v, false)) != status::success) return s;
  if ((s = detail::check_like_q(a.q, a.dout, false)) != status::success) return s;
  if ((s = detail::check_like_q(a.q, a.dq, true)) != status::success) return s;
  if ((s = detail::check_like_q(a.q, a.dk, true)) != status::success) return s;
  if ((s = detail::check_like_q(a.q, a.dv, true)) != status::success) return s;
  if ((s = detail::check_bias(a.bias, a.window, static_cast<index_t>(a.q.extent[2]))) != status::success) return s;
  if ((s = detail::check_dbias(a.bias, a.dbias)) != status::success) return s;
  return detail::check_token_map(a.token_window, a.token_coord, a.q.extent[1], a.bias.data != nullptr, a.window);
}

//! Grouped window attention, forward: out (and lse) of every token, computed per (sample, group,
//! head) on the padded G x G group with Eigen. Runs `can_implement` first and writes nothing when
//! it fails. Every token row of out/lse is written exactly once; padding never is.
//! O(B * H * n_g * G^2 * D) time, O(G^2 + G*D) extra memory. Single-threaded, deterministic.
template <class T>
status group_attention_forward(const attention_args<T>& a) {
  if (status s = can_implement(a); s != status::success) return s;
  const std::int64_t B = a.q.extent[0], H = a.q.extent[2], D = a.q.extent[3];
  const index_t G = a.part.group_size;
  if (B == 0 || a.q.extent[1] == 0 || H == 0 || G == 0) return status::success;
  const T scale = detail::resolve_scale(a.scale, D);
  const bool with_bias = a.bias.data != nullptr;
  detail::mat<T> Q(G, D), K(G, D), V(G, D), O(G, D), S(G, G);
  std::vector<index_t> rel;
  std::vector<T> lse_row(static_cast<size_t>(G));
  for (index_t g = 0; g < a.part.num_groups; ++g) {
    const index_t* tokens = a.part.gather + static_cast<std::int64_t>(g) * G;
    detail::pair_table(a.part, g, with_bias, a.window, rel);
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t h = 0; h < H; ++h) {
        detail::gather_rows(a.q, b, h, tokens, G, Q);
        detail::gather_rows(a.k, b, h, tokens, G, K);
        detail::gather_rows(a.v, b, h, tokens, G, V);
        Q *= scale;
        S.noalias() = Q * K.transpose();
        detail::bias_and_mask(S, rel, tokens, G, a.bias, h, a.mask, a.mask_value);
        for (index_t i = 0; i < G; ++i) {  // row softmax of real rows; padding rows zeroed
          T* srow = S.data() + static_cast<std::int64_t>(i) * G;
          if (tokens[i] < 0) {
            std::fill(srow, srow + G, T(0));
            continue;
          }
          T m = -std::numeric_limits<T>::infinity();
          for (index_t j = 0; j < G; ++j) m = std::max(m, srow[j]);
          T l = 0;
          for (index_t j = 0; j < G; ++j) l += (srow[j] = std::exp(srow[j] - m));
          for (index_t j = 0; j < G; ++j) srow[j] /= l;
          lse_row[static_cast<size_t>(i)] = m + std::log(l);
        }
        if (a.mask == mask_mode::additive || detail::all_finite(V)) {
          O.noalias() = S * V;  // masked probabilities are exact zeros times finite values
        } else {                // pairwise over attending pairs only: nothing leaks across windows
          O.setZero();
          for (index_t i = 0; i < G; ++i)
            for (index_t j = 0; j < G; ++j)
              if (rel[static_cast<size_t>(i) * G + j] >= 0) O.row(i) += S(i, j) * V.row(j);
        }
        detail::scatter_rows(O, tokens, G, a.out, b, h);
        if (a.lse.data != nullptr)
          for (index_t i = 0; i < G; ++i)
            if (tokens[i] >= 0) a.lse(b, tokens[i], h) = lse_row[static_cast<size_t>(i)];
      }
    }
  }
  return status::success;
}

//! Grouped window attention, backward: dq, dk, dv of every token (overwritten) and dbias
//! (accumulated, in the fixed order group, sample, head, row, column), from dout and the forward's
//! o and lse: P = exp(S - lse), dS = P * (dout V^T - rowsum(dout * o)). Runs `can_implement` first
//! and writes nothing when it fails. O(B * H * n_g * G^2 * D) time, O(G^2 + G*D + table) memory.
template <class T>
status group_attention_backward(const attention_backward_args<T>& a) {
  if (status s = can_implement(a); s != status::success) return s;
  const std::int64_t B = a.q.extent[0], H = a.q.extent[2], D = a.q.extent[3];
  const index_t G = a.part.group_size;
  if (B == 0 || a.q.extent[1] == 0 || H == 0 || G == 0) return status::success;
  const T scale = detail::resolve_scale(a.scale, D);
  const bool with_bias = a.bias.data != nullptr;
  const bool want_dbias = a.dbias.data != nullptr;
  detail::mat<T> Q(G, D), K(G, D), V(G, D), O(G, D), dO(G, D), dQ(G, D), dK(G, D), dV(G, D), S(G, G), dP(G, G);
  detail::mat<T> dtable;  // local accumulator, added to dbias at the end
  if (want_dbias) dtable = detail::mat<T>::Zero(a.dbias.extent[0], a.dbias.extent[1]);
  std::vector<index_t> rel;
  std::vector<T> lse_row(static_cast<size_t>(G)), delta(static_cast<size_t>(G));
  for (index_t g = 0; g < a.part.num_groups; ++g) {
    const index_t* tokens = a.part.gather + static_cast<std::int64_t>(g) * G;
    detail::pair_table(a.part, g, with_bias, a.window, rel);
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t h = 0; h < H; ++h) {
        detail::gather_rows(a.q, b, h, tokens, G, Q);
        detail::gather_rows(a.k, b, h, tokens, G, K);
        detail::gather_rows(a.v, b, h, tokens, G, V);
        detail::gather_rows(a.o, b, h, tokens, G, O);
        detail::gather_rows(a.dout, b, h, tokens, G, dO);
        for (index_t i = 0; i < G; ++i) {
          lse_row[static_cast<size_t>(i)] = tokens[i] >= 0 ? a.lse(b, tokens[i], h) : T(0);
          delta[static_cast<size_t>(i)] = dO.row(i).dot(O.row(i));
        }
        Q *= scale;
        S.noalias() = Q * K.transpose();
        detail::bias_and_mask(S, rel, tokens, G, a.bias, h, a.mask, a.mask_value);
        const bool exact = a.mask == mask_mode::exact;
        const bool fast = !exact || (detail::all_finite(Q) && detail::all_finite(K) && detail::all_finite(dO));
        if (fast) dP.noalias() = dO * V.transpose();
        // S <- P, dP <- dS; masked pairs of the exact mode are set to exact zeros (selected, not
        // multiplied), padding rows are zero.
        for (index_t i = 0; i < G; ++i) {
          T* srow = S.data() + static_cast<std::int64_t>(i) * G;
          T* prow = dP.data() + static_cast<std::int64_t>(i) * G;
          const index_t* rrow = rel.data() + static_cast<size_t>(i) * G;
          if (tokens[i] < 0) {
            std::fill(srow, srow + G, T(0));
            std::fill(prow, prow + G, T(0));
            continue;
          }
          const T li = lse_row[static_cast<size_t>(i)], di = delta[static_cast<size_t>(i)];
          for (index_t j = 0; j < G; ++j) {
            if (exact && rrow[j] < 0) {
              srow[j] = T(0);
              prow[j] = T(0);
              continue;
            }
            const T p = std::exp(srow[j] - li);
            const T dp = fast ? prow[j] : dO.row(i).dot(V.row(j));
            srow[j] = p;
            prow[j] = p * (dp - di);
          }
        }
        if (fast) {
          dV.noalias() = S.transpose() * dO;
          dQ.noalias() = dP * K;
          dK.noalias() = dP.transpose() * Q;  // Q already holds scale*q
        } else {
          dV.setZero();
          dQ.setZero();
          dK.setZero();
          for (index_t i = 0; i < G; ++i)
            for (index_t j = 0; j < G; ++j) {
              if (rel[static_cast<size_t>(i) * G + j] < 0) continue;
              dV.row(j) += S(i, j) * dO.row(i);
              dQ.row(i) += dP(i, j) * K.row(j);
              dK.row(j) += dP(i, j) * Q.row(i);
            }
        }
        dQ *= scale;
        detail::scatter_rows(dQ, tokens, G, a.dq, b, h);
        detail::scatter_rows(dK, tokens, G, a.dk, b, h);
        detail::scatter_rows(dV, tokens, G, a.dv, b, h);
        if (want_dbias)
          for (index_t i = 0; i < G; ++i)
            for (index_t j = 0; j < G; ++j) {
              const index_t r = rel[static_cast<size_t>(i) * G + j];
              if (r >= 0) dtable(r, h) += dP(i, j);
            }
      }
    }
  }
  if (want_dbias)
    for (std::int64_t r = 0; r < a.dbias.extent[0]; ++r)
      for (std::int64_t h = 0; h < a.dbias.extent[1]; ++h) a.dbias(r, h) += dtable(r, h);
  return status::success;
}

//! The oracle, forward: dense softmax attention of each token over the tokens of its own window
//! (equal `token_window`), with bias[rel_pos_index(coords), head], computed window by window with
//! plain loops; no groups, no padding, no mask. Runs `can_implement` first; writes nothing on
//! failure. O(B * H * sum_w n_w^2 * D) time.
template <class T>
status window_attention_oracle(const oracle_args<T>& a) {
  if (status s = can_implement(a); s != status::success) return s;
  const std::int64_t B = a.q.extent[0], N = a.q.extent[1], H = a.q.extent[2], D = a.q.extent[3];
  if (B == 0 || N == 0 || H == 0) return status::success;
  const T scale = detail::resolve_scale(a.scale, D);
  const std::int64_t sq = a.q.stride[3], sk = a.k.stride[3], sv = a.v.stride[3], so = a.out.stride[3];
  std::vector<index_t> order, offsets;
  detail::window_buckets(a.token_window, order, offsets);
  std::vector<T> s, acc(static_cast<size_t>(D));
  for (size_t w = 0; w + 1 < offsets.size(); ++w) {
    const index_t* tok = order.data() + offsets[w];
    const std::int64_t n = offsets[w + 1] - offsets[w];
    s.resize(static_cast<size_t>(n));
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < n; ++i) {
          const index_t ti = tok[i];
          const T* qi = detail::row_ptr(a.q, b, ti, h);
          T m = -std::numeric_limits<T>::infinity();
          for (std::int64_t j = 0; j < n; ++j) {
            const index_t tj = tok[j];
            const T* kj = detail::row_ptr(a.k, b, tj, h);
            T dot = 0;
            for (std::int64_t d = 0; d < D; ++d) dot += (scale * qi[d * sq]) * kj[d * sk];
            if (a.bias.data != nullptr) {
              const index_t ci = a.token_coord[ti], cj = a.token_coord[tj];
              dot += a.bias(rel_pos_index(coord_h(ci), coord_w(ci), coord_h(cj), coord_w(cj), a.window), h);
            }
            s[static_cast<size_t>(j)] = dot;
            m = std::max(m, dot);
          }
          T l = 0;
          for (std::int64_t j = 0; j < n; ++j) l += (s[static_cast<size_t>(j)] = std::exp(s[static_cast<size_t>(j)] - m));
          std::fill(acc.begin(), acc.end(), T(0));
          for (std::int64_t j = 0; j < n; ++j) {
            const T* vj = detail::row_ptr(a.v, b, tok[j], h);
            const T pj = s[static_cast<size_t>(j)];
            for (std::int64_t d = 0; d < D; ++d) acc[static_cast<size_t>(d)] += pj * vj[d * sv];
          }
          T* oi = detail::row_ptr(a.out, b, ti, h);
          for (std::int64_t d = 0; d < D; ++d) oi[d * so] = acc[static_cast<size_t>(d)] / l;
          if (a.lse.data != nullptr) a.lse(b, ti, h) = m + std::log(l);
        }
  }
  return status::success;
}

//! The oracle, backward: recomputes each window's probabilities P, then dv = P^T dout,
//! dS = P * (dP - rowsum(P * dP)) with dP = dout v^T, dq = scale dS k, dk = scale dS^T q,
//! dbias += dS (accumulated in window, sample, head, row, column order). Independent of the
//! grouped backward (no o, no lse, no Eigen). Writes nothing on failure.
//! O(B * H * sum_w n_w^2 * D) time.
template <class T>
status window_attention_oracle_backward(const oracle_backward_args<T>& a) {
  if (status s = can_implement(a); s != status::success) return s;
  const std::int64_t B = a.q.extent[0], N = a.q.extent[1], H = a.q.extent[2], D = a.q.extent[3];
  if (B == 0 || N == 0 || H == 0) return status::success;
  const T scale = detail::resolve_scale(a.scale, D);
  const bool with_bias = a.bias.data != nullptr, want_dbias = a.dbias.data != nullptr;
  const std::int64_t sq = a.q.stride[3], sk = a.k.stride[3], sv = a.v.stride[3], sdo = a.dout.stride[3];
  std::vector<index_t> order, offsets;
  detail::window_buckets(a.token_window, order, offsets);
  std::vector<T> P, dS, dtable, gq(static_cast<size_t>(D)), gk(static_cast<size_t>(D)), gv(static_cast<size_t>(D));
  std::vector<const T*> qr, kr, vr, dor;
  if (want_dbias) dtable.assign(static_cast<size_t>(a.dbias.extent[0] * a.dbias.extent[1]), T(0));
  for (size_t w = 0; w + 1 < offsets.size(); ++w) {
    const index_t* tok = order.data() + offsets[w];
    const std::int64_t n = offsets[w + 1] - offsets[w];
    P.resize(static_cast<size_t>(n * n));
    dS.resize(static_cast<size_t>(n * n));
    qr.resize(static_cast<size_t>(n));
    kr.resize(static_cast<size_t>(n));
    vr.resize(static_cast<size_t>(n));
    dor.resize(static_cast<size_t>(n));
    auto rel = [&](std::int64_t i, std::int64_t j) {
      const index_t ci = a.token_coord[tok[i]], cj = a.token_coord[tok[j]];
      return rel_pos_index(coord_h(ci), coord_w(ci), coord_h(cj), coord_w(cj), a.window);
    };
    auto dot = [D](const T* x, std::int64_t sx, const T* y, std::int64_t sy) {
      T acc = 0;
      for (std::int64_t d = 0; d < D; ++d) acc += x[d * sx] * y[d * sy];
      return acc;
    };
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < H; ++h) {
        for (std::int64_t i = 0; i < n; ++i) {
          qr[static_cast<size_t>(i)] = detail::row_ptr(a.q, b, tok[i], h);
          kr[static_cast<size_t>(i)] = detail::row_ptr(a.k, b, tok[i], h);
          vr[static_cast<size_t>(i)] = detail::row_ptr(a.v, b, tok[i], h);
          dor[static_cast<size_t>(i)] = detail::row_ptr(a.dout, b, tok[i], h);
        }
        for (std::int64_t i = 0; i < n; ++i) {  // probabilities
          T m = -std::numeric_limits<T>::infinity();
          T* pi = P.data() + i * n;
          for (std::int64_t j = 0; j < n; ++j) {
            T acc = 0;
            for (std::int64_t d = 0; d < D; ++d)
              acc += (scale * qr[static_cast<size_t>(i)][d * sq]) * kr[static_cast<size_t>(j)][d * sk];
            if (with_bias) acc += a.bias(rel(i, j), h);
            pi[j] = acc;
            m = std::max(m, acc);
          }
          T l = 0;
          for (std::int64_t j = 0; j < n; ++j) l += (pi[j] = std::exp(pi[j] - m));
          for (std::int64_t j = 0; j < n; ++j) pi[j] /= l;
        }
        for (std::int64_t i = 0; i < n; ++i) {  // dS = P * (dP - rowsum(P * dP))
          const T* pi = P.data() + i * n;
          T* si = dS.data() + i * n;
          T rowsum = 0;
          for (std::int64_t j = 0; j < n; ++j) {
            si[j] = dot(dor[static_cast<size_t>(i)], sdo, vr[static_cast<size_t>(j)], sv);
            rowsum += pi[j] * si[j];
          }
          for (std::int64_t j = 0; j < n; ++j) si[j] = pi[j] * (si[j] - rowsum);
        }
        for (std::int64_t i = 0; i < n; ++i) {
          std::fill(gq.begin(), gq.end(), T(0));
          std::fill(gk.begin(), gk.end(), T(0));
          std::fill(gv.begin(), gv.end(), T(0));
          for (std::int64_t j = 0; j < n; ++j) {
            const T sij = dS[static_cast<size_t>(i * n + j)], sji = dS[static_cast<size_t>(j * n + i)];
            const T pji = P[static_cast<size_t>(j * n + i)];
            const T *kj = kr[static_cast<size_t>(j)], *qj = qr[static_cast<size_t>(j)], *doj = dor[static_cast<size_t>(j)];
            for (std::int64_t d = 0; d < D; ++d) {
              gq[static_cast<size_t>(d)] += sij * kj[d * sk];
              gk[static_cast<size_t>(d)] += sji * qj[d * sq];
              gv[static_cast<size_t>(d)] += pji * doj[d * sdo];
            }
          }
          for (std::int64_t d = 0; d < D; ++d) {
            a.dq(b, tok[i], h, d) = scale * gq[static_cast<size_t>(d)];
            a.dk(b, tok[i], h, d) = scale * gk[static_cast<size_t>(d)];
            a.dv(b, tok[i], h, d) = gv[static_cast<size_t>(d)];
          }
        }
        if (want_dbias)
          for (std::int64_t i = 0; i < n; ++i)
            for (std::int64_t j = 0; j < n; ++j)
              dtable[static_cast<size_t>(rel(i, j) * a.dbias.extent[1] + h)] += dS[static_cast<size_t>(i * n + j)];
      }
  }
  if (want_dbias)
    for (std::int64_t r = 0; r < a.dbias.extent[0]; ++r)
      for (std::int64_t h = 0; h < a.dbias.extent[1]; ++h)
        a.dbias(r, h) += dtable[static_cast<size_t>(r * a.dbias.extent[1] + h)];
  return status::success;
}

}  // namespace reference
}  // namespace greenmim
