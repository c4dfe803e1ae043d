//! \file reference/oracle.hpp
//! The window-by-window oracle the grouped attention (reference/attention.hpp, the kernels) is
//! proven against: dense attention computed window by window straight from the token axis, a
//! per-token window id and per-token coordinates. No groups, no padding, no mask: the definition
//! the grouped version must equal. Plain loops, independent of the grouped code (no Eigen, no
//! partition). Tests, examples and `greenmim demo` use it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "../config.hpp"
#include "../geometry.hpp"
#include "../status.hpp"
#include "../view.hpp"
#include "checks.hpp"

namespace greenmim {
namespace reference {

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

namespace detail {

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

//! Pre-flight of `window_attention_oracle`: view checks as `can_implement(attention_args)`;
//! token_window of size N with ids >= 0; with a bias, token_coord of size N and every same-window
//! pair within p (`out_of_range`). O(N log N + sum of squared window sizes).
template <class T>
status can_implement(const oracle_args<T>& a) {
  return detail::view_checks<T>(a.q)
      .inputs(a.k, a.v)
      .outputs(a.out)
      .rows(a.lse, true, true)
      .bias(a.bias, a.window)
      .then([&] {
        return detail::check_token_map(a.token_window, a.token_coord, a.q.extent[1], a.bias.data != nullptr, a.window);
      })
      .result();
}

//! Pre-flight of `window_attention_oracle_backward` (as the oracle forward's, plus dout, dq, dk,
//! dv and dbias as in `can_implement(attention_backward_args)`).
template <class T>
status can_implement(const oracle_backward_args<T>& a) {
  return detail::view_checks<T>(a.q)
      .inputs(a.k, a.v, a.dout)
      .outputs(a.dq, a.dk, a.dv)
      .bias(a.bias, a.window, &a.dbias)
      .then([&] {
        return detail::check_token_map(a.token_window, a.token_coord, a.q.extent[1], a.bias.data != nullptr, a.window);
      })
      .result();
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
