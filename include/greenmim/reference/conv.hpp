//! \file reference/conv.hpp
//! CPU reference of convolutions on visible tokens (Eigen), forward and backward, over the tables
//! of sparse_conv.hpp:
//!
//! - `depthwise_conv_forward` / `_backward`: Twins' PEG, a depthwise k x k submanifold conv
//!   (stride 1, padding k/2) with bias and an optional residual:
//!   `y[b, t, c] = bias[c] + sum_o w[c, o] * x[b, nbr[t, o], c] (+ x[b, t, c])`, missing
//!   neighbours (pad_index) read as zero. Twins' PosCNN computes `proj(x) + x`; the released
//!   GreenMIM code drops the `+ x`; `residual = true` (the default) keeps it.
//!   Backward: `dx[s, c] = sum_o w[c, o] * dy[nbr[s, mirror_offset(k, o)], c] (+ dy[s, c])` (the
//!   transposed table is the table at mirrored offsets), `dw[c, o] = sum_{b,t} dy[b,t,c] *
//!   x[b, nbr[t,o], c]`, `dbias[c] = sum_{b,t} dy[b,t,c]`.
//! - `submanifold_conv_forward` / `_backward`: dense C_in -> C_out submanifold conv as
//!   gather-GEMM-scatter, one GEMM per stencil offset: `Y += gather_o(X) W_o^T`; backward
//!   `dX scatter_o+= dY W_o`, `dW_o += dY^T gather_o(X)`.
//! - `block_conv_forward` / `_backward`: kernel = stride = s conv (GSA sub-sampling, patch
//!   embedding) as im2col gather of the blocks + one GEMM, `Y = A W'^T + bias` with the column
//!   order of sparse_conv.hpp (A[n, p*C_in + c] = x[gather[n, p], c], zero where the entry is
//!   pad_index: a masked input of a partly visible block, `block_rule::any`).
//!
//! Weights are in PyTorch's dense layout, so a checkpoint's tensors are used as they are:
//! depthwise `[C, k*k]` (= `[C, 1, k, k]` flattened), dense `[C_out, C_in, k, k]`, any strides.
//! Feature views are `[B, N, C]` with any non-negative strides; with the per-sample flat layout
//! B = 1. Gradients are overwritten (not accumulated); a null dweight / empty dbias is skipped.
//! Accumulation is in T (float or double). Outputs must not overlap inputs (`invalid_argument`).
//! Every check runs before any write: on failure no output is touched.
#pragma once

#include <Eigen/Core>

#include <cstdint>
#include <vector>

#include "../config.hpp"
#include "../partition.hpp"
#include "../sparse_conv.hpp"
#include "../status.hpp"
#include "../view.hpp"

namespace greenmim {
namespace reference {

namespace conv_detail {

template <class T>
using mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <class T, int R>
bool valid_view(const tensor_view<T, R>& v) {
  for (int i = 0; i < R; ++i)
    if (v.extent[i] < 0 || v.stride[i] < 0) return false;
  return v.numel() == 0 || v.data != nullptr;
}

//! Every entry in [-1, n); table size a multiple of `row`.
inline status check_table(span<const index_t> table, std::int64_t row, std::int64_t rows, std::int64_t n) {
  if (row <= 0 || table.size() != rows * row) return status::shape_mismatch;
  if (table.size() > 0 && table.data() == nullptr) return status::invalid_argument;
  for (std::int64_t i = 0; i < table.size(); ++i)
    if (table[i] < pad_index || table[i] >= n) return status::out_of_range;
  return status::success;
}

template <class T>
void load(const tensor_view<const T, 3>& x, std::int64_t b, mat<T>& m) {  // [N, C] of sample b
  m.resize(x.extent[1], x.extent[2]);
  for (std::int64_t t = 0; t < x.extent[1]; ++t)
    for (std::int64_t c = 0; c < x.extent[2]; ++c) m(t, c) = x(b, t, c);
}

template <class T>
void store(const mat<T>& m, std::int64_t b, const tensor_view<T, 3>& y) {
  for (std::int64_t t = 0; t < y.extent[1]; ++t)
    for (std::int64_t c = 0; c < y.extent[2]; ++c) y(b, t, c) = m(t, c);
}

//! Rows of `x` picked by `table[r * row + col]`, zero where pad_index: [rows, C].
template <class T>
void gather_rows(const mat<T>& x, span<const index_t> table, std::int64_t row, std::int64_t col, mat<T>& g) {
  const std::int64_t rows = row > 0 ? table.size() / row : 0;
  g.setZero(rows, x.cols());
  for (std::int64_t r = 0; r < rows; ++r) {
    const index_t s = table[r * row + col];
    if (s != pad_index) g.row(r) = x.row(s);
  }
}

//! im2col of sample b: A[n, p*C_in + c] = x[b, gather[n*P + p], c], zero for pad_index (A is
//! [N_next, P*C_in], sized by the caller).
template <class T>
void im2col(const tensor_view<const T, 3>& x, std::int64_t b, span<const index_t> gather, std::int64_t P, mat<T>& A) {
  const std::int64_t Ci = x.extent[2];
  for (std::int64_t n = 0; n < A.rows(); ++n)
    for (std::int64_t p = 0; p < P; ++p) {
      const index_t t = gather[n * P + p];
      for (std::int64_t c = 0; c < Ci; ++c) A(n, p * Ci + c) = t == pad_index ? T(0) : x(b, t, c);
    }
}

//! The argument checks the two GEMM-style backward ops share, in their order: valid views,
//! weight `[C_out, C_in, k, k]`, dy `[B, dy_tokens, C_out]` (dy_tokens < 0: any), dx shaped like
//! x, dweight (if wanted) shaped like weight and disjoint from x, dy and dx, dbias of C_out.
template <class T>
status check_gemm_backward(const tensor_view<const T, 3>& x, const tensor_view<const T, 4>& weight,
                           const tensor_view<const T, 3>& dy, const tensor_view<T, 3>& dx,
                           const tensor_view<T, 4>& dweight, span<T> dbias, std::int64_t k,
                           std::int64_t dy_tokens) {
  const std::int64_t B = x.extent[0], Ci = x.extent[2], Co = weight.extent[0];
  if (!valid_view(x) || !valid_view(dy) || !valid_view(dx) || !valid_view(weight)) return status::invalid_argument;
  if (weight.extent[1] != Ci || weight.extent[2] != k || weight.extent[3] != k) return status::shape_mismatch;
  if (dy.extent[0] != B || (dy_tokens >= 0 && dy.extent[1] != dy_tokens) || dy.extent[2] != Co)
    return status::shape_mismatch;
  for (int i = 0; i < 3; ++i)
    if (dx.extent[i] != x.extent[i]) return status::shape_mismatch;
  if (dweight.data != nullptr) {
    for (int i = 0; i < 4; ++i)
      if (dweight.extent[i] != weight.extent[i]) return status::shape_mismatch;
    if (!valid_view(dweight)) return status::invalid_argument;
    if (greenmim::detail::overlaps(x, dweight) || greenmim::detail::overlaps(dy, dweight) || greenmim::detail::overlaps(dx, dweight))
      return status::invalid_argument;
  }
  if (!dbias.empty() && dbias.size() != Co) return status::shape_mismatch;
  return status::success;
}

}  // namespace conv_detail

// ---- depthwise submanifold conv (PEG) ----------------------------------------------------------

//! Depthwise submanifold conv forward (see the file comment). `nbr` [N, k*k] from
//! `build_neighbor_table` (any odd k), x and y `[B, N, C]`, weight `[C, k*k]`, bias `[C]` or
//! empty. Fails with `shape_mismatch` (extents, table size), `out_of_range` (a table entry
//! outside [-1, N)), `invalid_argument` (bad kernel, null data, y overlapping an input).
//! O(B * N * C * k^2).
template <class T>
status depthwise_conv_forward(span<const index_t> nbr, index_t kernel,
                              tensor_view<const greenmim::detail::nondeduced_t<T>, 3> x,
                              tensor_view<const greenmim::detail::nondeduced_t<T>, 2> weight,
                              span<const greenmim::detail::nondeduced_t<T>> bias, bool residual, tensor_view<T, 3> y) {
  if (kernel <= 0 || kernel % 2 == 0) return status::invalid_argument;
  const std::int64_t B = x.extent[0], N = x.extent[1], C = x.extent[2], K = kernel * kernel;
  if (!conv_detail::valid_view(x) || !conv_detail::valid_view(y) || !conv_detail::valid_view(weight))
    return status::invalid_argument;
  if (y.extent[0] != B || y.extent[1] != N || y.extent[2] != C) return status::shape_mismatch;
  if (weight.extent[0] != C || weight.extent[1] != K) return status::shape_mismatch;
  if (!bias.empty() && bias.size() != C) return status::shape_mismatch;
  if (status s = conv_detail::check_table(nbr, K, N, N); s != status::success) return s;
  if (greenmim::detail::overlaps(x, y) || greenmim::detail::overlaps(weight, y)) return status::invalid_argument;
  std::vector<T> acc(static_cast<size_t>(C));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < N; ++t) {
      for (std::int64_t c = 0; c < C; ++c) acc[c] = bias.empty() ? T(0) : bias[c];
      for (std::int64_t o = 0; o < K; ++o) {
        const index_t s = nbr[t * K + o];
        if (s == pad_index) continue;
        for (std::int64_t c = 0; c < C; ++c) acc[c] += weight(c, o) * x(b, s, c);
      }
      for (std::int64_t c = 0; c < C; ++c) y(b, t, c) = residual ? acc[c] + x(b, t, c) : acc[c];
    }
  return status::success;
}

//! Depthwise submanifold conv backward: dx `[B, N, C]` (overwritten, through the mirrored
//! offsets of the same table), dweight `[C, k*k]` (overwritten; data null = skipped), dbias
//! `[C]` (overwritten; empty = skipped). Failures as the forward. O(B * N * C * k^2).
template <class T>
status depthwise_conv_backward(span<const index_t> nbr, index_t kernel,
                               tensor_view<const greenmim::detail::nondeduced_t<T>, 3> x,
                               tensor_view<const greenmim::detail::nondeduced_t<T>, 2> weight,
                               tensor_view<const greenmim::detail::nondeduced_t<T>, 3> dy, bool residual,
                               tensor_view<T, 3> dx, tensor_view<T, 2> dweight, span<T> dbias) {
  if (kernel <= 0 || kernel % 2 == 0) return status::invalid_argument;
  const std::int64_t B = x.extent[0], N = x.extent[1], C = x.extent[2], K = kernel * kernel;
  if (!conv_detail::valid_view(x) || !conv_detail::valid_view(dy) || !conv_detail::valid_view(dx) ||
      !conv_detail::valid_view(weight))
    return status::invalid_argument;
  for (int i = 0; i < 3; ++i)
    if (dy.extent[i] != x.extent[i] || dx.extent[i] != x.extent[i]) return status::shape_mismatch;
  if (weight.extent[0] != C || weight.extent[1] != K) return status::shape_mismatch;
  const bool want_dw = dweight.data != nullptr;
  if (want_dw && (dweight.extent[0] != C || dweight.extent[1] != K || !conv_detail::valid_view(dweight)))
    return status::shape_mismatch;
  if (!dbias.empty() && dbias.size() != C) return status::shape_mismatch;
  if (status s = conv_detail::check_table(nbr, K, N, N); s != status::success) return s;
  if (greenmim::detail::overlaps(x, dx) || greenmim::detail::overlaps(dy, dx) || greenmim::detail::overlaps(weight, dx))
    return status::invalid_argument;
  if (want_dw && (greenmim::detail::overlaps(x, dweight) || greenmim::detail::overlaps(dy, dweight) || greenmim::detail::overlaps(dx, dweight)))
    return status::invalid_argument;
  std::vector<T> acc(static_cast<size_t>(C));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t s = 0; s < N; ++s) {
      for (std::int64_t c = 0; c < C; ++c) acc[c] = residual ? dy(b, s, c) : T(0);
      for (std::int64_t o = 0; o < K; ++o) {
        const index_t u = nbr[s * K + mirror_offset(kernel, static_cast<index_t>(o))];  // u reads s at offset o
        if (u == pad_index) continue;
        for (std::int64_t c = 0; c < C; ++c) acc[c] += weight(c, o) * dy(b, u, c);
      }
      for (std::int64_t c = 0; c < C; ++c) dx(b, s, c) = acc[c];
    }
  if (want_dw) {
    conv_detail::mat<T> dw = conv_detail::mat<T>::Zero(C, K);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < N; ++t)
        for (std::int64_t o = 0; o < K; ++o) {
          const index_t s = nbr[t * K + o];
          if (s == pad_index) continue;
          for (std::int64_t c = 0; c < C; ++c) dw(c, o) += dy(b, t, c) * x(b, s, c);
        }
    for (std::int64_t c = 0; c < C; ++c)
      for (std::int64_t o = 0; o < K; ++o) dweight(c, o) = dw(c, o);
  }
  if (!dbias.empty()) {
    for (std::int64_t c = 0; c < C; ++c) dbias[c] = T(0);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < N; ++t)
        for (std::int64_t c = 0; c < C; ++c) dbias[c] += dy(b, t, c);
  }
  return status::success;
}

// ---- dense submanifold conv (gather-GEMM-scatter) ----------------------------------------------

//! Submanifold conv C_in -> C_out forward: x `[B, N, C_in]`, weight `[C_out, C_in, k, k]`, bias
//! `[C_out]` or empty, y `[B, N, C_out]` (overwritten). One gather + GEMM per stencil offset.
//! Failures as `depthwise_conv_forward`. O(B * N * k^2 * C_in * C_out).
template <class T>
status submanifold_conv_forward(span<const index_t> nbr, index_t kernel,
                                tensor_view<const greenmim::detail::nondeduced_t<T>, 3> x,
                                tensor_view<const greenmim::detail::nondeduced_t<T>, 4> weight,
                                span<const greenmim::detail::nondeduced_t<T>> bias, tensor_view<T, 3> y) {
  using M = conv_detail::mat<T>;
  if (kernel <= 0 || kernel % 2 == 0) return status::invalid_argument;
  const std::int64_t B = x.extent[0], N = x.extent[1], Ci = x.extent[2], Co = weight.extent[0];
  const std::int64_t K = kernel * kernel;
  if (!conv_detail::valid_view(x) || !conv_detail::valid_view(y) || !conv_detail::valid_view(weight))
    return status::invalid_argument;
  if (weight.extent[1] != Ci || weight.extent[2] != kernel || weight.extent[3] != kernel) return status::shape_mismatch;
  if (y.extent[0] != B || y.extent[1] != N || y.extent[2] != Co) return status::shape_mismatch;
  if (!bias.empty() && bias.size() != Co) return status::shape_mismatch;
  if (status s = conv_detail::check_table(nbr, K, N, N); s != status::success) return s;
  if (greenmim::detail::overlaps(x, y) || greenmim::detail::overlaps(weight, y)) return status::invalid_argument;
  std::vector<M> w(static_cast<size_t>(K), M(Co, Ci));  // W_o [C_out, C_in]
  for (std::int64_t o = 0; o < K; ++o)
    for (std::int64_t a = 0; a < Co; ++a)
      for (std::int64_t c = 0; c < Ci; ++c) w[o](a, c) = weight(a, c, o / kernel, o % kernel);
  M xb, g, acc;
  for (std::int64_t b = 0; b < B; ++b) {
    conv_detail::load(x, b, xb);
    acc.setZero(N, Co);
    if (!bias.empty())
      for (std::int64_t t = 0; t < N; ++t)
        for (std::int64_t a = 0; a < Co; ++a) acc(t, a) = bias[a];
    for (std::int64_t o = 0; o < K; ++o) {
      conv_detail::gather_rows(xb, nbr, K, o, g);
      acc.noalias() += g * w[o].transpose();
    }
    conv_detail::store(acc, b, y);
  }
  return status::success;
}

//! Submanifold conv backward: dx `[B, N, C_in]` (overwritten; scatter-add of `dY W_o` through
//! the table), dweight `[C_out, C_in, k, k]` (overwritten; data null = skipped), dbias `[C_out]`
//! (overwritten; empty = skipped). Failures as the forward. O(B * N * k^2 * C_in * C_out).
template <class T>
status submanifold_conv_backward(span<const index_t> nbr, index_t kernel,
                                 tensor_view<const greenmim::detail::nondeduced_t<T>, 3> x,
                                 tensor_view<const greenmim::detail::nondeduced_t<T>, 4> weight,
                                 tensor_view<const greenmim::detail::nondeduced_t<T>, 3> dy, tensor_view<T, 3> dx,
                                 tensor_view<T, 4> dweight, span<T> dbias) {
  using M = conv_detail::mat<T>;
  if (kernel <= 0 || kernel % 2 == 0) return status::invalid_argument;
  const std::int64_t B = x.extent[0], N = x.extent[1], Ci = x.extent[2], Co = weight.extent[0];
  const std::int64_t K = kernel * kernel;
  if (status s = conv_detail::check_gemm_backward<T>(x, weight, dy, dx, dweight, dbias, kernel, N);
      s != status::success)
    return s;
  const bool want_dw = dweight.data != nullptr;
  if (status s = conv_detail::check_table(nbr, K, N, N); s != status::success) return s;
  if (greenmim::detail::overlaps(x, dx) || greenmim::detail::overlaps(dy, dx) || greenmim::detail::overlaps(weight, dx))
    return status::invalid_argument;
  std::vector<M> w(static_cast<size_t>(K), M(Co, Ci)), dw(static_cast<size_t>(K), M::Zero(Co, Ci));
  for (std::int64_t o = 0; o < K; ++o)
    for (std::int64_t a = 0; a < Co; ++a)
      for (std::int64_t c = 0; c < Ci; ++c) w[o](a, c) = weight(a, c, o / kernel, o % kernel);
  M xb, dyb, g, dxb, dg;
  std::vector<T> db(static_cast<size_t>(Co), T(0));
  for (std::int64_t b = 0; b < B; ++b) {
    conv_detail::load(x, b, xb);
    conv_detail::load(dy, b, dyb);
    dxb.setZero(N, Ci);
    for (std::int64_t o = 0; o < K; ++o) {
      dg.noalias() = dyb * w[o];  // [N, C_in]: gradient of the gathered rows
      for (std::int64_t t = 0; t < N; ++t) {
        const index_t s = nbr[t * K + o];
        if (s != pad_index) dxb.row(s) += dg.row(t);
      }
      if (want_dw) {
        conv_detail::gather_rows(xb, nbr, K, o, g);
        dw[o].noalias() += dyb.transpose() * g;
      }
    }
    conv_detail::store(dxb, b, dx);
    for (std::int64_t t = 0; t < N; ++t)
      for (std::int64_t a = 0; a < Co; ++a) db[a] += dyb(t, a);
  }
  if (want_dw)
    for (std::int64_t o = 0; o < K; ++o)
      for (std::int64_t a = 0; a < Co; ++a)
        for (std::int64_t c = 0; c < Ci; ++c) dweight(a, c, o / kernel, o % kernel) = dw[o](a, c);
  for (std::int64_t a = 0; a < dbias.size(); ++a) dbias[a] = db[a];
  return status::success;
}

// ---- block conv, kernel = stride = s (gather + GEMM) -------------------------------------------

//! Block conv forward: `gather` [N_next, s*s] from `build_block_table`, x `[B, N, C_in]`,
//! weight `[C_out, C_in, s, s]`, bias `[C_out]` or empty, y `[B, N_next, C_out]` (overwritten).
//! im2col A [N_next, s*s*C_in] (column p*C_in + c; a pad_index entry reads zero), then
//! `Y = A W'^T + bias`. Failures as `depthwise_conv_forward`. O(B * N_next * s^2 * C_in * C_out).
template <class T>
status block_conv_forward(span<const index_t> gather, index_t stride, tensor_view<const greenmim::detail::nondeduced_t<T>, 3> x,
                          tensor_view<const greenmim::detail::nondeduced_t<T>, 4> weight,
                          span<const greenmim::detail::nondeduced_t<T>> bias, tensor_view<T, 3> y) {
  using M = conv_detail::mat<T>;
  if (stride <= 0) return status::invalid_argument;
  const std::int64_t B = x.extent[0], N = x.extent[1], Ci = x.extent[2], Co = weight.extent[0];
  const std::int64_t P = static_cast<std::int64_t>(stride) * stride, Nn = y.extent[1];
  if (!conv_detail::valid_view(x) || !conv_detail::valid_view(y) || !conv_detail::valid_view(weight))
    return status::invalid_argument;
  if (weight.extent[1] != Ci || weight.extent[2] != stride || weight.extent[3] != stride) return status::shape_mismatch;
  if (y.extent[0] != B || y.extent[2] != Co) return status::shape_mismatch;
  if (!bias.empty() && bias.size() != Co) return status::shape_mismatch;
  if (status s = conv_detail::check_table(gather, P, Nn, N); s != status::success) return s;
  if (greenmim::detail::overlaps(x, y) || greenmim::detail::overlaps(weight, y)) return status::invalid_argument;
  M wt(P * Ci, Co);  // W'^T
  for (std::int64_t a = 0; a < Co; ++a)
    for (std::int64_t c = 0; c < Ci; ++c)
      for (std::int64_t p = 0; p < P; ++p) wt(p * Ci + c, a) = weight(a, c, p / stride, p % stride);
  M A(Nn, P * Ci), Y;
  for (std::int64_t b = 0; b < B; ++b) {
    conv_detail::im2col(x, b, gather, P, A);
    Y.noalias() = A * wt;
    if (!bias.empty())
      for (std::int64_t n = 0; n < Nn; ++n)
        for (std::int64_t a = 0; a < Co; ++a) Y(n, a) += bias[a];
    conv_detail::store(Y, b, y);
  }
  return status::success;
}

//! Block conv backward: dx `[B, N, C_in]` (overwritten; tokens in no block get 0), dweight
//! `[C_out, C_in, s, s]` (overwritten; data null = skipped), dbias (overwritten; empty =
//! skipped). `gather` entries other than pad_index must be distinct (each input in at most one
//! block, as the builder guarantees; `invalid_argument` otherwise); pad_index entries (masked
//! inputs) take no gradient. O(B * N_next * s^2 * C_in * C_out + N).
template <class T>
status block_conv_backward(span<const index_t> gather, index_t stride, tensor_view<const greenmim::detail::nondeduced_t<T>, 3> x,
                           tensor_view<const greenmim::detail::nondeduced_t<T>, 4> weight,
                           tensor_view<const greenmim::detail::nondeduced_t<T>, 3> dy, tensor_view<T, 3> dx,
                           tensor_view<T, 4> dweight, span<T> dbias) {
  using M = conv_detail::mat<T>;
  if (stride <= 0) return status::invalid_argument;
  const std::int64_t B = x.extent[0], N = x.extent[1], Ci = x.extent[2], Co = weight.extent[0];
  const std::int64_t P = static_cast<std::int64_t>(stride) * stride, Nn = dy.extent[1];
  if (status s = conv_detail::check_gemm_backward<T>(x, weight, dy, dx, dweight, dbias, stride, -1);
      s != status::success)
    return s;
  const bool want_dw = dweight.data != nullptr;
  if (status s = conv_detail::check_table(gather, P, Nn, N); s != status::success) return s;
  std::vector<char> seen(static_cast<size_t>(N), 0);
  for (std::int64_t i = 0; i < gather.size(); ++i)
    if (gather[i] != pad_index && seen[gather[i]]++) return status::invalid_argument;
  if (greenmim::detail::overlaps(x, dx) || greenmim::detail::overlaps(dy, dx) || greenmim::detail::overlaps(weight, dx))
    return status::invalid_argument;
  M w(Co, P * Ci);  // W'
  for (std::int64_t a = 0; a < Co; ++a)
    for (std::int64_t c = 0; c < Ci; ++c)
      for (std::int64_t p = 0; p < P; ++p) w(a, p * Ci + c) = weight(a, c, p / stride, p % stride);
  M A(Nn, P * Ci), dyb, dA, dw = M::Zero(Co, P * Ci);
  std::vector<T> db(static_cast<size_t>(Co), T(0));
  for (std::int64_t b = 0; b < B; ++b) {
    conv_detail::load(dy, b, dyb);
    dA.noalias() = dyb * w;  // [N_next, s*s*C_in]
    for (std::int64_t t = 0; t < N; ++t)
      for (std::int64_t c = 0; c < Ci; ++c) dx(b, t, c) = T(0);
    for (std::int64_t n = 0; n < Nn; ++n)
      for (std::int64_t p = 0; p < P; ++p) {
        const index_t t = gather[n * P + p];
        if (t == pad_index) continue;
        for (std::int64_t c = 0; c < Ci; ++c) dx(b, t, c) = dA(n, p * Ci + c);
      }
    if (want_dw) {
      conv_detail::im2col(x, b, gather, P, A);
      dw.noalias() += dyb.transpose() * A;
    }
    for (std::int64_t n = 0; n < Nn; ++n)
      for (std::int64_t a = 0; a < Co; ++a) db[a] += dyb(n, a);
  }
  if (want_dw)
    for (std::int64_t a = 0; a < Co; ++a)
      for (std::int64_t c = 0; c < Ci; ++c)
        for (std::int64_t p = 0; p < P; ++p) dweight(a, c, p / stride, p % stride) = dw(a, p * Ci + c);
  for (std::int64_t a = 0; a < dbias.size(); ++a) dbias[a] = db[a];
  return status::success;
}

}  // namespace reference
}  // namespace greenmim
