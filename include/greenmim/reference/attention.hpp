//! \file reference/attention.hpp
//! CPU reference of Group Window Attention (the paper's Group Window Attention with Masked
//! Attention and relative position bias), forward and backward: what a kernel computes, and what
//! the CPU path of the Python package runs. Per (sample, group, head) the G slots of the group are
//! gathered through `partition_view::gather`, `S = (scale*Q) K^T` (G x G, Eigen) gets the
//! relative-position bias `bias[rel_pos_index(coords), head]` where `attends(window ids)` and the
//! mask elsewhere, the rows are soft-maxed, `O = P V` (Eigen), and the rows of real slots are
//! scattered back to their tokens. Padding rows are never written. Its proof is the
//! window-by-window oracle of reference/oracle.hpp.
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
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../geometry.hpp"
#include "../partition_types.hpp"
#include "../status.hpp"
#include "../view.hpp"
#include "checks.hpp"

namespace greenmim {
namespace reference {

//! How cross-window and padding pairs of a group are masked.
enum class mask_mode : int {
  exact = 0,  //!< skipped exactly (-inf semantics); the default
  additive,   //!< `mask_value` added (the released code: -100), padding takes part as zeros
};

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

}  // namespace detail

//! Pre-flight of `group_attention_forward`: q, k, v, out extents [B, N, H, D] equal, lse [B, N, H]
//! (if given), non-negative strides, outputs without self-overlap (`shape_mismatch`); head_dim >= 1
//! and non-null data (`invalid_argument`); bias table [(2p-1)^2, H] with p > 0 (`shape_mismatch`,
//! `invalid_argument`); partition indices in range (`out_of_range`), gather/scatter an exact
//! inverse pair covering every token once (`not_covered`), and with a bias every attending pair
//! within p of each other (`out_of_range`). Writes nothing. O(N + n_g*G^2).
template <class T>
status can_implement(const attention_args<T>& a) {
  return detail::view_checks<T>(a.q)
      .inputs(a.k, a.v)
      .outputs(a.out)
      .rows(a.lse, true, true)
      .then([&] { return detail::check_mask(a.mask); })
      .bias(a.bias, a.window)
      .then([&] { return detail::check_partition(a.part, a.q.extent[1], a.bias.data != nullptr, a.window); })
      .result();
}

//! Pre-flight of `group_attention_backward`: as the forward's, for q, k, v, o, dout, dq, dk, dv
//! ([B, N, H, D]) and lse ([B, N, H], required); dbias, when given, needs a bias table and its
//! shape (`shape_mismatch`). Writes nothing. O(N + n_g*G^2).
template <class T>
status can_implement(const attention_backward_args<T>& a) {
  return detail::view_checks<T>(a.q)
      .inputs(a.k, a.v, a.o, a.dout)
      .rows(a.lse, false, false)
      .outputs(a.dq, a.dk, a.dv)
      .then([&] { return detail::check_mask(a.mask); })
      .bias(a.bias, a.window, &a.dbias)
      .then([&] { return detail::check_partition(a.part, a.q.extent[1], a.bias.data != nullptr, a.window); })
      .result();
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

}  // namespace reference
}  // namespace greenmim
