//! \file block_conv_ops.cuh
//! Private, experimental (docs/sparse-conv.md "The fused block conv"): the block conv's three
//! GEMMs as operators over its gather table, for the fused kernels (block_conv.cu):
//! - block_geom: the table and W' (PyTorch's [C_out, C_in, s, s] weight read as [C_out][s^2 C_in],
//!   in place, or rounded into the element type for the tensor cores);
//! - bc_fwd_op (Y = A W'^T + bias, A the gathered blocks), bc_dx_op (dA = dY W', scattered to
//!   x's rows), bc_dw_op (dweight = dY^T A, dbias as a column of ones);
//! each with the SIMT accessors (a, b, store: gather_gemm_simt.cuh), the tensor-core ones (a8,
//! b8: gather_gemm_mma.cuh) and, for the forward, cp.async's (gather_gemm_async.cuh);
//! - the element-wise kernels around them: zero_rows (dx before the scatter), convert_weight (W').
//! Table entries outside [0, N) read as zero / are skipped (never an out-of-bounds access).
#pragma once

#include <cstdint>

#include <greenmim/partition_types.hpp>

#include "conv_split.hpp"
#include "device_common.cuh"
#include "gather_gemm_mma.cuh"

namespace greenmim {
namespace detail {
namespace cuda {

constexpr int k_bc_elem_threads = 256;  //!< element-wise kernels (zero_rows, convert_weight, splitk_reduce)

struct block_geom {
  const index_t* gather = nullptr;  // [n_next, P]
  int batch = 0, tokens = 0, n_next = 0, P = 0, cin = 0, cout = 0;
  const float* w = nullptr;         // [C_out, C_in, s, s]
  const void* wt = nullptr;         // tensor-core path: W' in the element type, [C_out][ldw] (zero-padded)
  int ldw = 0;
  // x's row of (b, n, p) or -1 (out-of-range table entry)
  __device__ __forceinline__ index_t token(int n, int p) const {
    const index_t t = __ldg(gather + static_cast<std::int64_t>(n) * P + p);
    return static_cast<unsigned>(t) < static_cast<unsigned>(tokens) ? t : pad_index;
  }
  // W'[o, k] with k = p * C_in + c
  __device__ __forceinline__ float wprime(int o, int k) const {
    return __ldg(w + (static_cast<std::int64_t>(o) * cin + k % cin) * P + k / cin);
  }
  //! Columns [j, j + valid) of gathered row m = b * n_next + n (column p * C_in + c = x[b, token(n, p), c];
  //! column P * C_in is the ones column, later ones zero), packed for the tensor cores: one 16-byte
  //! load when the chunk is one block position, else element by element (the same values).
  template <class T>
  __device__ __forceinline__ uint4 gathered8(const T* x, std::int64_t x_s0, std::int64_t x_s1, int m, int j,
                                             int valid) const {
    const int bi = m / n_next, n = m - bi * n_next, pc = P * cin;
    const T* xb = x + bi * x_s0;
    if (j + valid <= pc) {  // no ones column in the chunk (and C_in > 0: the division is defined)
      const int p = j / cin, c = j - p * cin;
      if (c + valid <= cin) {  // one block position
        const index_t t = token(n, p);
        return t == pad_index ? zero_chunk() : load8(xb + t * x_s1 + c, valid);
      }
    }
    uint4 u = zero_chunk();
    for (int e = 0; e < valid; ++e) {
      const int je = j + e;
      if (je >= pc) {
        if (je == pc) set8(u, e, from_float<T>(1.f));
        continue;
      }
      const int pe = je / cin;
      const index_t t = token(n, pe);
      if (t != pad_index) set8(u, e, __ldg(xb + t * x_s1 + (je - pe * cin)));
    }
    return u;
  }
};

//! Forward: rows m = b * n_next + n, columns o, reduction k = p * C_in + c.
template <class T>
struct bc_fwd_op {
  block_geom g;
  const T* x = nullptr;
  T* y = nullptr;
  const float* bias = nullptr;
  std::int64_t x_s0 = 0, x_s1 = 0, y_s0 = 0, y_s1 = 0;
  int M = 0, N = 0, K = 0;
  __device__ __forceinline__ float a(int m, int k) const {
    const index_t t = g.token(m % g.n_next, k / g.cin);
    return t == pad_index ? 0.f : to_float(__ldg(x + (m / g.n_next) * x_s0 + t * x_s1 + k % g.cin));
  }
  __device__ __forceinline__ float b(int k, int o) const { return g.wprime(o, k); }
  // tensor cores: A row-major (gathered x), B n-major (rows of W')
  using elem = T;
  using layout = tc_layout<false, false>;
  __device__ __forceinline__ uint4 a8(int m, int k, int k_end) const {
    if (m >= M || k >= k_end) return zero_chunk();
    return g.gathered8(x, x_s0, x_s1, m, k, k_end - k < 8 ? k_end - k : 8);  // k < K: no ones column
  }
  __device__ __forceinline__ uint4 b8(int k, int o, int k_end) const {
    if (o >= N) return zero_chunk();
    return load8(static_cast<const T*>(g.wt) + static_cast<std::int64_t>(o) * g.ldw + k, k_end - k < 8 ? k_end - k : 8);
  }
  __device__ __forceinline__ void store(int m, int o, float v) const {
    y[(m / g.n_next) * y_s0 + (m % g.n_next) * y_s1 + o] = from_float<T>(v + (bias ? __ldg(bias + o) : 0.f));
  }
  // cp.async (gather_gemm_async), where `async` (the host: whole, aligned chunks; async_ok)
  bool async = false;
  __device__ __forceinline__ index_t a_token(int m, int k) const { return g.token(m % g.n_next, k / g.cin); }
  __device__ __forceinline__ const T* a_ptr(index_t t, int m, int k) const {
    return x + (m / g.n_next) * x_s0 + t * x_s1 + k % g.cin;
  }
  __device__ __forceinline__ const T* b_ptr(int k, int o) const {
    return static_cast<const T*>(g.wt) + static_cast<std::int64_t>(o) * g.ldw + k;
  }
  //! Every chunk of A is one block position's 8 channels at a 16-byte aligned address, and W'
  //! rows (ldw = K) are 16-byte aligned (the workspace is): C_in, x's strides multiples of 8.
  bool async_ok() const {
    return sizeof(T) == 2 && g.cin % 8 == 0 && x_s0 % 8 == 0 && x_s1 % 8 == 0 &&
           reinterpret_cast<std::uintptr_t>(x) % 16 == 0 && g.ldw == K;
  }
};

//! dx: rows m = b * n_next + n, columns j = p * C_in + c, reduction o; scattered to x's rows.
template <class T>
struct bc_dx_op {
  block_geom g;
  const T* dy = nullptr;
  T* dx = nullptr;
  std::int64_t dy_s0 = 0, dy_s1 = 0, dx_s0 = 0, dx_s1 = 0;
  int M = 0, N = 0, K = 0;
  __device__ __forceinline__ float a(int m, int o) const {
    return to_float(__ldg(dy + (m / g.n_next) * dy_s0 + (m % g.n_next) * dy_s1 + o));
  }
  __device__ __forceinline__ float b(int o, int j) const { return g.wprime(o, j); }
  // tensor cores: A row-major (rows of dY), B k-major (rows of W')
  using elem = T;
  using layout = tc_layout<false, true>;
  __device__ __forceinline__ uint4 a8(int m, int o, int k_end) const {
    if (m >= M || o >= k_end) return zero_chunk();
    return load8(dy + (m / g.n_next) * dy_s0 + (m % g.n_next) * dy_s1 + o, k_end - o < 8 ? k_end - o : 8);
  }
  __device__ __forceinline__ uint4 b8(int o, int j, int k_end) const {
    if (o >= k_end || j >= g.ldw) return zero_chunk();
    return load8(static_cast<const T*>(g.wt) + static_cast<std::int64_t>(o) * g.ldw + j, g.ldw - j < 8 ? g.ldw - j : 8);
  }
  __device__ __forceinline__ void store(int m, int j, float v) const {
    const index_t t = g.token(m % g.n_next, j / g.cin);
    if (t != pad_index) dx[(m / g.n_next) * dx_s0 + t * dx_s1 + j % g.cin] = from_float<T>(v);
  }
};

//! dweight and dbias: rows o, columns j = jbase + column (j = p * C_in + c < P * C_in: dweight;
//! j = P * C_in: dbias, a column of ones), reduction m = b * n_next + n (all rows).
template <class T>
struct bc_dw_op {
  block_geom g;
  const T* x = nullptr;
  const T* dy = nullptr;
  float* dw = nullptr;
  float* db = nullptr;
  std::int64_t x_s0 = 0, x_s1 = 0, dy_s0 = 0, dy_s1 = 0;
  int jbase = 0;  // P * C_in when only dbias is wanted (N = 1)
  int M = 0, N = 0, K = 0;
  __device__ __forceinline__ float a(int o, int m) const {
    return to_float(__ldg(dy + (m / g.n_next) * dy_s0 + (m % g.n_next) * dy_s1 + o));
  }
  __device__ __forceinline__ float b(int m, int col) const {
    const int j = jbase + col;
    if (j == g.P * g.cin) return 1.f;
    const index_t t = g.token(m % g.n_next, j / g.cin);
    return t == pad_index ? 0.f : to_float(__ldg(x + (m / g.n_next) * x_s0 + t * x_s1 + j % g.cin));
  }
  // tensor cores: A k-major (rows of dY), B k-major (gathered x rows, then the ones column)
  using elem = T;
  using layout = tc_layout<true, true>;
  __device__ __forceinline__ uint4 a8(int o, int m, int k_end) const {
    if (m >= k_end || o >= M) return zero_chunk();
    return load8(dy + (m / g.n_next) * dy_s0 + (m % g.n_next) * dy_s1 + o, M - o < 8 ? M - o : 8);
  }
  __device__ __forceinline__ uint4 b8(int m, int col, int k_end) const {
    if (m >= k_end || col >= N) return zero_chunk();
    return g.gathered8(x, x_s0, x_s1, m, jbase + col, N - col < 8 ? N - col : 8);
  }
  __device__ __forceinline__ void store(int o, int col, float v) const {
    const int j = jbase + col;
    if (j == g.P * g.cin) db[o] = v;
    else dw[(static_cast<std::int64_t>(o) * g.cin + j % g.cin) * g.P + j / g.cin] = v;
  }
};

//! Zeroes rows of a [B, N, C] tensor (dx before the scatter).
template <class T>
__global__ void __launch_bounds__(k_bc_elem_threads) zero_rows(T* p, std::int64_t s0, std::int64_t s1, int batch,
                                                          int tokens, int channels) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t per = static_cast<std::int64_t>(tokens) * channels;
  if (i >= per * batch) return;
  const std::int64_t b = i / per, r = i % per;
  p[b * s0 + (r / channels) * s1 + r % channels] = from_float<T>(0.f);
}

//! W' in the element type for the tensor cores: wt[o][j] = weight[o, j % C_in, j / C_in] for
//! j < P * C_in, zero up to the padded row length ldw.
template <class T>
__global__ void __launch_bounds__(k_bc_elem_threads) convert_weight(const float* w, T* wt, int cout, int cin, int P, int ldw) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<std::int64_t>(cout) * ldw) return;
  const int o = static_cast<int>(i / ldw), j = static_cast<int>(i % ldw);
  wt[i] = j < P * cin ? from_float<T>(__ldg(w + (static_cast<std::int64_t>(o) * cin + j % cin) * P + j / cin))
                      : from_float<T>(0.f);
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
