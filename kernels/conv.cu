//! \file conv.cu
//! Convolutions on visible tokens (docs/sparse-conv.md): the depthwise 3x3 submanifold conv of
//! Twins' PEG, forward and backward, and the kernel = stride block conv (GSA sub-sampling,
//! patch embedding) as gather + GEMM, forward and backward. Index math from
//! include/greenmim/sparse_conv.hpp (stencil offsets, mirror_offset); tables built on the host.
//!
//! Depthwise (fp32/fp16/bf16 features, fp32 weights, fp32 accumulation):
//! - forward and dx: one thread per (token, V channels), V = 8 (16-byte vectors, C % 8 == 0 and
//!   16-byte aligned rows) or 1; grid.y walks the batch. dx gathers through the mirrored offsets
//!   of the forward table (no scatter, no atomics): dx[s] = sum_o w[o] dy[nbr[s, 8 - o]] (+ dy[s]).
//! - dweight and dbias, bitwise deterministic: the token axis is cut into fixed tiles of
//!   k_dw_tile tokens (a constant, not a launch parameter); one thread owns V channels of one tile
//!   and sums its (9 + 1) x V products over the batch and the tile's tokens in a fixed order into a
//!   workspace of per-tile partials; a second kernel sums the partials of each (channel, tap) over
//!   the tiles in ascending order. No float atomics: same inputs, same bits, on any device.
//!
//! Block conv (SIMT first version, one tiled GEMM kernel for the three products, 64 x 64 x 16
//! tiles of fp32 in shared memory, 4 x 4 outputs per thread; no cuBLAS: the A operand is a gather
//! of whole blocks and dx a scatter, which a GEMM library cannot fuse, and the sizes are small):
//! - forward  Y[b*N_next + n, o] = sum_k A[., k] W'[o, k] + bias[o], A[n, p*C_in + c] =
//!   x[b, gather[n*s*s + p], c], W'[o, p*C_in + c] = weight[o, c, p] (the PyTorch layout read in
//!   place, no repacking);
//! - dx: dx zeroed, then dA = dY W' scattered to x's rows through the table (each input in at
//!   most one block: plain stores);
//! - dweight = dY^T A, one thread per output element summing over all rows in order (no split-K:
//!   deterministic); dbias: one thread per channel, rows in order.
//! Table entries outside [0, N) read as zero / are skipped (never an out-of-bounds access);
//! validate tables on the host (the builders of sparse_conv.hpp only produce valid ones).
#include <greenmim/kernels.h>

#include <cstdint>
#include <cstring>

#include <greenmim/sparse_conv.hpp>

#include "detail/device_common.cuh"
#include "detail/host_checks.hpp"
#include "detail/launch.cuh"

namespace greenmim {
namespace detail {
namespace cuda {
namespace {

constexpr int k_taps = 9;          // 3 x 3
constexpr int k_dw_threads = 256;
constexpr int k_dw_tile = 32;      // tokens per dweight partial: fixed, so results never depend on the launch
constexpr int k_red_threads = 256;

// ---- V-element row access ----------------------------------------------------------------------
template <class T, int V>
struct row_io {  // V = 1 (and the generic case): element accesses
  __device__ __forceinline__ static void load(const T* p, float (&x)[V]) {
#pragma unroll
    for (int i = 0; i < V; ++i) x[i] = to_float(__ldg(p + i));
  }
  __device__ __forceinline__ static void store(T* p, const float (&x)[V]) {
#pragma unroll
    for (int i = 0; i < V; ++i) p[i] = from_float<T>(x[i]);
  }
};

template <>
struct row_io<float, 8> {
  __device__ __forceinline__ static void load(const float* p, float (&x)[8]) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p)), b = __ldg(reinterpret_cast<const float4*>(p) + 1);
    x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w; x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
  }
  __device__ __forceinline__ static void store(float* p, const float (&x)[8]) {
    reinterpret_cast<float4*>(p)[0] = make_float4(x[0], x[1], x[2], x[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(x[4], x[5], x[6], x[7]);
  }
};

template <class T>
struct row_io16 {  // 8 x 2-byte elements in one 16-byte access
  __device__ __forceinline__ static void load(const T* p, float (&x)[8]) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    T e[8];
    std::memcpy(e, &v, sizeof v);
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = to_float(e[i]);
  }
  __device__ __forceinline__ static void store(T* p, const float (&x)[8]) {
    T e[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) e[i] = from_float<T>(x[i]);
    uint4 v;
    std::memcpy(&v, e, sizeof v);
    *reinterpret_cast<uint4*>(p) = v;
  }
};
template <>
struct row_io<__half, 8> : row_io16<__half> {};
template <>
struct row_io<__nv_bfloat16, 8> : row_io16<__nv_bfloat16> {};

// ---- depthwise 3x3 submanifold conv ----------------------------------------------------------------
struct dw_params {
  const void* in = nullptr;   // forward: x; dx: dy
  const void* res = nullptr;  // residual source (x or dy), null = no residual
  void* out = nullptr;        // y or dx
  std::int64_t in_s0 = 0, in_s1 = 0, out_s0 = 0, out_s1 = 0;  // elements
  const index_t* nbr = nullptr;
  const float* w = nullptr;
  const float* bias = nullptr;
  int batch = 0, tokens = 0, channels = 0;
  int mirrored = 0;  // 1: dx (read the table at mirrored offsets)
};

template <class T, int V>
__global__ void __launch_bounds__(k_dw_threads) dw_apply(const dw_params p) {
  const int groups = p.channels / V;
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<std::int64_t>(p.tokens) * groups) return;
  const int t = static_cast<int>(i / groups), c0 = static_cast<int>(i % groups) * V;
  const T* in = static_cast<const T*>(p.in);
  const T* res = static_cast<const T*>(p.res);
  T* out = static_cast<T*>(p.out);
  index_t src[k_taps];
  float w[k_taps][V];
#pragma unroll
  for (int o = 0; o < k_taps; ++o) {
    const index_t s = __ldg(p.nbr + static_cast<std::int64_t>(t) * k_taps + (p.mirrored ? mirror_offset(3, o) : o));
    src[o] = static_cast<unsigned>(s) < static_cast<unsigned>(p.tokens) ? s : pad_index;
#pragma unroll
    for (int v = 0; v < V; ++v) w[o][v] = __ldg(p.w + static_cast<std::int64_t>(c0 + v) * k_taps + o);
  }
  for (int b = static_cast<int>(blockIdx.y); b < p.batch; b += static_cast<int>(gridDim.y)) {
    float acc[V];
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] = p.bias ? __ldg(p.bias + c0 + v) : 0.f;
    if (res) {
      float r[V];
      row_io<T, V>::load(res + b * p.in_s0 + t * p.in_s1 + c0, r);
#pragma unroll
      for (int v = 0; v < V; ++v) acc[v] += r[v];
    }
#pragma unroll
    for (int o = 0; o < k_taps; ++o) {
      if (src[o] == pad_index) continue;
      float x[V];
      row_io<T, V>::load(in + b * p.in_s0 + src[o] * p.in_s1 + c0, x);
#pragma unroll
      for (int v = 0; v < V; ++v) acc[v] = fmaf(w[o][v], x[v], acc[v]);
    }
    row_io<T, V>::store(out + b * p.out_s0 + t * p.out_s1 + c0, acc);
  }
}

struct dw_grad_params {
  const void* x = nullptr;
  const void* dy = nullptr;
  std::int64_t x_s0 = 0, x_s1 = 0, dy_s0 = 0, dy_s1 = 0;
  const index_t* nbr = nullptr;
  float* partial = nullptr;  // [tiles, C, 10]
  int batch = 0, tokens = 0, channels = 0;
};

//! Per-tile partials of dweight (taps 0..8) and dbias (slot 9).
template <class T, int V>
__global__ void __launch_bounds__(k_dw_threads) dw_grad_partial(const dw_grad_params p) {
  const int g = static_cast<int>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= p.channels / V) return;
  const int c0 = g * V, tile = static_cast<int>(blockIdx.y);
  const int t0 = tile * k_dw_tile, t1 = t0 + k_dw_tile < p.tokens ? t0 + k_dw_tile : p.tokens;
  const T* x = static_cast<const T*>(p.x);
  const T* dy = static_cast<const T*>(p.dy);
  float acc[k_taps + 1][V];
#pragma unroll
  for (int o = 0; o <= k_taps; ++o)
#pragma unroll
    for (int v = 0; v < V; ++v) acc[o][v] = 0.f;
  for (int b = 0; b < p.batch; ++b)
    for (int t = t0; t < t1; ++t) {
      float d[V];
      row_io<T, V>::load(dy + b * p.dy_s0 + t * p.dy_s1 + c0, d);
#pragma unroll
      for (int v = 0; v < V; ++v) acc[k_taps][v] += d[v];
#pragma unroll
      for (int o = 0; o < k_taps; ++o) {
        const index_t s = __ldg(p.nbr + static_cast<std::int64_t>(t) * k_taps + o);
        if (static_cast<unsigned>(s) >= static_cast<unsigned>(p.tokens)) continue;
        float xv[V];
        row_io<T, V>::load(x + b * p.x_s0 + s * p.x_s1 + c0, xv);
#pragma unroll
        for (int v = 0; v < V; ++v) acc[o][v] = fmaf(d[v], xv[v], acc[o][v]);
      }
    }
  float* out = p.partial + (static_cast<std::int64_t>(tile) * p.channels + c0) * (k_taps + 1);
#pragma unroll
  for (int v = 0; v < V; ++v)
#pragma unroll
    for (int o = 0; o <= k_taps; ++o) out[v * (k_taps + 1) + o] = acc[o][v];
}

//! dweight[c, o] / dbias[c] = the tiles' partials summed in ascending tile order.
__global__ void __launch_bounds__(k_red_threads) dw_grad_reduce(const float* partial, int tiles, int channels,
                                                               float* dweight, float* dbias) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<std::int64_t>(channels) * (k_taps + 1)) return;
  float s = 0.f;
  for (int tile = 0; tile < tiles; ++tile) s += partial[static_cast<std::int64_t>(tile) * channels * (k_taps + 1) + i];
  const int c = static_cast<int>(i / (k_taps + 1)), o = static_cast<int>(i % (k_taps + 1));
  if (o < k_taps) {
    if (dweight) dweight[static_cast<std::int64_t>(c) * k_taps + o] = s;
  } else if (dbias) {
    dbias[c] = s;
  }
}

cudaError_t check_dw_args(const gm_depthwise_conv_args* a, bool backward) {
  clear_refusal();
  GM_REFUSE_IF(a == nullptr, "args is null");
  GM_REFUSE_IF(!valid_dtype(a->dtype), "dtype must be GM_FLOAT32, GM_FLOAT16 or GM_BFLOAT16");
  GM_REFUSE_IF(a->kernel != 3, "kernel must be 3 (the kernels implement PEG's 3x3; the CPU reference takes any odd k)");
  GM_REFUSE_IF(a->x.rank != 3, "x must have rank 3");
  const std::int64_t B = a->x.extent[0], N = a->x.extent[1], C = a->x.extent[2];
  GM_REFUSE_IF(B < 0 || N < 0 || C < 0, "negative extent");
  GM_REFUSE_IF(N > 0x7fffffff / k_taps || C > 0x7fffffff / (k_taps + 1) || B > 0x7fffffff, "extents too large");
  const std::size_t es = dtype_bytes(a->dtype);
  const std::int64_t e[3] = {B, N, C};
  GM_TRY(check_tensor(a->x, 3, e, es, true, false, "x must be [B, N, C], element-aligned, unit last stride"));
  GM_REFUSE_IF(N > 0 && a->nbr == nullptr, "nbr is null");
  GM_REFUSE_IF(C > 0 && a->weight == nullptr, "weight is null");
  GM_REFUSE_IF(!aligned4(a->nbr) || !aligned4(a->weight), "nbr and weight must be 4-byte aligned");
  GM_REFUSE_IF(backward ? !aligned4(a->dweight) || !aligned4(a->dbias) : !aligned4(a->bias),
               backward ? "dweight and dbias must be 4-byte aligned" : "bias must be 4-byte aligned");
  if (!backward) {
    GM_TRY(check_tensor(a->y, 3, e, es, true, true, "y must be [B, N, C], element-aligned, unit last stride, injective"));
    GM_REFUSE_IF(overlap(a->x, es, a->y, es), "x and y overlap");
  } else {
    GM_TRY(check_tensor(a->dy, 3, e, es, true, false, "dy must be [B, N, C], element-aligned, unit last stride"));
    GM_TRY(check_tensor(a->dx, 3, e, es, true, true, "dx must be [B, N, C], element-aligned, unit last stride, injective"));
    GM_REFUSE_IF(overlap(a->x, es, a->dx, es) || overlap(a->dy, es, a->dx, es), "dx overlaps x or dy");
    GM_REFUSE_IF((N + k_dw_tile - 1) / k_dw_tile > 65535, "too many tokens for the dweight tiles (N > 2,097,120)");
  }
  return cudaSuccess;
}

std::size_t dw_workspace_bytes(const gm_depthwise_conv_args* a) {
  if (a->dweight == nullptr && a->dbias == nullptr) return 0;
  const std::int64_t N = a->x.extent[1], C = a->x.extent[2];
  const std::int64_t tiles = (N + k_dw_tile - 1) / k_dw_tile;
  return static_cast<std::size_t>(tiles * C * (k_taps + 1)) * sizeof(float);
}

bool dw_vectorizable(const gm_depthwise_conv_args* a, bool backward) {
  const std::size_t es = dtype_bytes(a->dtype);
  if (a->x.extent[2] % 8 != 0) return false;
  if (!backward) return rows_aligned16(a->x, es) && rows_aligned16(a->y, es);
  return rows_aligned16(a->x, es) && rows_aligned16(a->dy, es) && rows_aligned16(a->dx, es);
}

template <class T, int V>
cudaError_t launch_dw_apply(const dw_params& p, cudaStream_t stream) {
  const std::int64_t threads = static_cast<std::int64_t>(p.tokens) * (p.channels / V);
  const dim3 grid(static_cast<unsigned>((threads + k_dw_threads - 1) / k_dw_threads),
                  static_cast<unsigned>(p.batch < 65535 ? p.batch : 65535));
  return launch(dw_apply<T, V>, grid, k_dw_threads, 0, stream, p);
}

template <class T>
cudaError_t run_dw_fwd(const gm_depthwise_conv_args* a, cudaStream_t stream) {
  dw_params p;
  p.in = a->x.data;
  p.res = a->residual ? a->x.data : nullptr;
  p.out = a->y.data;
  p.in_s0 = a->x.stride[0]; p.in_s1 = a->x.stride[1];
  p.out_s0 = a->y.stride[0]; p.out_s1 = a->y.stride[1];
  p.nbr = a->nbr;
  p.w = a->weight;
  p.bias = a->bias;
  p.batch = static_cast<int>(a->x.extent[0]);
  p.tokens = static_cast<int>(a->x.extent[1]);
  p.channels = static_cast<int>(a->x.extent[2]);
  if (p.batch == 0 || p.tokens == 0 || p.channels == 0) return cudaSuccess;
  return dw_vectorizable(a, false) ? launch_dw_apply<T, 8>(p, stream) : launch_dw_apply<T, 1>(p, stream);
}

template <class T>
cudaError_t run_dw_bwd(const gm_depthwise_conv_args* a, void* workspace, cudaStream_t stream) {
  const int B = static_cast<int>(a->x.extent[0]), N = static_cast<int>(a->x.extent[1]), C = static_cast<int>(a->x.extent[2]);
  const bool vec = dw_vectorizable(a, true);
  if (C > 0 && (a->dweight || a->dbias) && (B == 0 || N == 0)) {  // empty batch: zero gradients
    if (a->dweight) GM_TRY(cudaMemsetAsync(a->dweight, 0, static_cast<std::size_t>(C) * k_taps * sizeof(float), stream));
    if (a->dbias) GM_TRY(cudaMemsetAsync(a->dbias, 0, static_cast<std::size_t>(C) * sizeof(float), stream));
  }
  if (B == 0 || N == 0 || C == 0) return cudaSuccess;
  dw_params p;
  p.in = a->dy.data;
  p.res = a->residual ? a->dy.data : nullptr;
  p.out = a->dx.data;
  p.in_s0 = a->dy.stride[0]; p.in_s1 = a->dy.stride[1];
  p.out_s0 = a->dx.stride[0]; p.out_s1 = a->dx.stride[1];
  p.nbr = a->nbr;
  p.w = a->weight;
  p.batch = B;
  p.tokens = N;
  p.channels = C;
  p.mirrored = 1;
  GM_TRY((vec ? launch_dw_apply<T, 8>(p, stream) : launch_dw_apply<T, 1>(p, stream)));
  if (!a->dweight && !a->dbias) return cudaSuccess;
  dw_grad_params g;
  g.x = a->x.data;
  g.dy = a->dy.data;
  g.x_s0 = a->x.stride[0]; g.x_s1 = a->x.stride[1];
  g.dy_s0 = a->dy.stride[0]; g.dy_s1 = a->dy.stride[1];
  g.nbr = a->nbr;
  g.partial = static_cast<float*>(workspace);
  g.batch = B;
  g.tokens = N;
  g.channels = C;
  const int tiles = (N + k_dw_tile - 1) / k_dw_tile;
  const int groups = vec ? C / 8 : C;
  const dim3 grid(static_cast<unsigned>((groups + k_dw_threads - 1) / k_dw_threads), static_cast<unsigned>(tiles));
  if (vec)
    GM_TRY((launch(dw_grad_partial<T, 8>, grid, k_dw_threads, 0, stream, g)));
  else
    GM_TRY((launch(dw_grad_partial<T, 1>, grid, k_dw_threads, 0, stream, g)));
  const std::int64_t outs = static_cast<std::int64_t>(C) * (k_taps + 1);
  return launch(dw_grad_reduce, dim3(static_cast<unsigned>((outs + k_red_threads - 1) / k_red_threads)), k_red_threads,
                0, stream, static_cast<const float*>(workspace), tiles, C, a->dweight, a->dbias);
}

// ---- block conv: one tiled SIMT GEMM, operands through accessors --------------------------------------
constexpr int k_bm = 64, k_bn = 64, k_bk = 16, k_gemm_threads = 256;

struct block_geom {
  const index_t* gather = nullptr;  // [n_next, P]
  int batch = 0, tokens = 0, n_next = 0, P = 0, cin = 0, cout = 0;
  const float* w = nullptr;         // [C_out, C_in, s, s]
  // x's row of (b, n, p) or -1 (out-of-range table entry)
  __device__ __forceinline__ index_t token(int n, int p) const {
    const index_t t = __ldg(gather + static_cast<std::int64_t>(n) * P + p);
    return static_cast<unsigned>(t) < static_cast<unsigned>(tokens) ? t : pad_index;
  }
  // W'[o, k] with k = p * C_in + c
  __device__ __forceinline__ float wprime(int o, int k) const {
    return __ldg(w + (static_cast<std::int64_t>(o) * cin + k % cin) * P + k / cin);
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
  __device__ __forceinline__ void store(int m, int o, float v) const {
    y[(m / g.n_next) * y_s0 + (m % g.n_next) * y_s1 + o] = from_float<T>(v + (bias ? __ldg(bias + o) : 0.f));
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
  __device__ __forceinline__ void store(int m, int j, float v) const {
    const index_t t = g.token(m % g.n_next, j / g.cin);
    if (t != pad_index) dx[(m / g.n_next) * dx_s0 + t * dx_s1 + j % g.cin] = from_float<T>(v);
  }
};

//! dweight: rows o, columns j = p * C_in + c, reduction m = b * n_next + n (all rows, in order).
template <class T>
struct bc_dw_op {
  block_geom g;
  const T* x = nullptr;
  const T* dy = nullptr;
  float* dw = nullptr;
  std::int64_t x_s0 = 0, x_s1 = 0, dy_s0 = 0, dy_s1 = 0;
  int M = 0, N = 0, K = 0;
  __device__ __forceinline__ float a(int o, int m) const {
    return to_float(__ldg(dy + (m / g.n_next) * dy_s0 + (m % g.n_next) * dy_s1 + o));
  }
  __device__ __forceinline__ float b(int m, int j) const {
    const index_t t = g.token(m % g.n_next, j / g.cin);
    return t == pad_index ? 0.f : to_float(__ldg(x + (m / g.n_next) * x_s0 + t * x_s1 + j % g.cin));
  }
  __device__ __forceinline__ void store(int o, int j, float v) const {
    dw[(static_cast<std::int64_t>(o) * g.cin + j % g.cin) * g.P + j / g.cin] = v;
  }
};

//! C[M, N] = A[M, K] B[K, N] through op.a / op.b / op.store; fp32 in shared memory, each thread
//! 4 x 4 outputs, k ascending (a fixed order: deterministic).
template <class Op>
__global__ void __launch_bounds__(k_gemm_threads) gather_gemm(const Op op) {
  __shared__ float As[k_bk][k_bm + 4];
  __shared__ float Bs[k_bk][k_bn + 4];
  const int m0 = static_cast<int>(blockIdx.y) * k_bm, n0 = static_cast<int>(blockIdx.x) * k_bn;
  const int tx = static_cast<int>(threadIdx.x) % 16, ty = static_cast<int>(threadIdx.x) / 16;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
  for (int k0 = 0; k0 < op.K; k0 += k_bk) {
    for (int i = static_cast<int>(threadIdx.x); i < k_bm * k_bk; i += k_gemm_threads) {
      const int r = i / k_bk, kk = i % k_bk;
      As[kk][r] = (m0 + r < op.M && k0 + kk < op.K) ? op.a(m0 + r, k0 + kk) : 0.f;
    }
    for (int i = static_cast<int>(threadIdx.x); i < k_bk * k_bn; i += k_gemm_threads) {
      const int kk = i / k_bn, c = i % k_bn;
      Bs[kk][c] = (k0 + kk < op.K && n0 + c < op.N) ? op.b(k0 + kk, n0 + c) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < k_bk; ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = As[kk][ty * 4 + i];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = Bs[kk][tx * 4 + j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = m0 + ty * 4 + i, c = n0 + tx * 4 + j;
      if (r < op.M && c < op.N) op.store(r, c, acc[i][j]);
    }
}

//! Zeroes rows of a [B, N, C] tensor (dx before the scatter).
template <class T>
__global__ void __launch_bounds__(k_red_threads) zero_rows(T* p, std::int64_t s0, std::int64_t s1, int batch,
                                                          int tokens, int channels) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t per = static_cast<std::int64_t>(tokens) * channels;
  if (i >= per * batch) return;
  const std::int64_t b = i / per, r = i % per;
  p[b * s0 + (r / channels) * s1 + r % channels] = from_float<T>(0.f);
}

//! dbias[o] = sum over rows of dy, rows in order.
template <class T>
__global__ void __launch_bounds__(k_red_threads) block_dbias(const T* dy, std::int64_t s0, std::int64_t s1,
                                                            int batch, int rows, int cout, float* dbias) {
  const int o = static_cast<int>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= cout) return;
  float s = 0.f;
  for (int b = 0; b < batch; ++b)
    for (int n = 0; n < rows; ++n) s += to_float(__ldg(dy + b * s0 + n * s1 + o));
  dbias[o] = s;
}

cudaError_t check_block_args(const gm_block_conv_args* a, bool backward) {
  clear_refusal();
  GM_REFUSE_IF(a == nullptr, "args is null");
  GM_REFUSE_IF(!valid_dtype(a->dtype), "dtype must be GM_FLOAT32, GM_FLOAT16 or GM_BFLOAT16");
  GM_REFUSE_IF(a->stride < 1 || a->stride > 64, "stride must be in [1, 64]");
  GM_REFUSE_IF(a->x.rank != 3, "x must have rank 3");
  const gm_tensor& out = backward ? a->dy : a->y;
  GM_REFUSE_IF(out.rank != 3, backward ? "dy must have rank 3" : "y must have rank 3");
  const std::int64_t B = a->x.extent[0], N = a->x.extent[1], Ci = a->x.extent[2];
  const std::int64_t Nn = out.extent[1], Co = out.extent[2], P = static_cast<std::int64_t>(a->stride) * a->stride;
  GM_REFUSE_IF(B < 0 || N < 0 || Ci < 0 || Nn < 0 || Co < 0, "negative extent");
  GM_REFUSE_IF(B > 0x7fffffff || N > 0x7fffffff || Nn > 0x7fffffff || mul_sat(B, Nn) > 0x7fffffff ||
                   mul_sat(mul_sat(B, N), Ci) > 0x7fffffff || mul_sat(P, Ci) > 0x7fffffff || Co > 0x7fffffff,
               "extents too large for int32 GEMM indices");
  GM_REFUSE_IF((B * Nn + k_bm - 1) / k_bm > 65535 || (Co + k_bm - 1) / k_bm > 65535, "too many rows for the grid");
  const std::size_t es = dtype_bytes(a->dtype);
  const std::int64_t xe[3] = {B, N, Ci}, oe[3] = {B, Nn, Co};
  GM_TRY(check_tensor(a->x, 3, xe, es, true, false, "x must be [B, N, C_in], element-aligned, unit last stride"));
  GM_REFUSE_IF(Nn > 0 && a->gather == nullptr, "gather is null");
  GM_REFUSE_IF(Co > 0 && Ci > 0 && a->weight == nullptr, "weight is null");
  GM_REFUSE_IF(!aligned4(a->gather) || !aligned4(a->weight), "gather and weight must be 4-byte aligned");
  GM_REFUSE_IF(backward ? !aligned4(a->dweight) || !aligned4(a->dbias) : !aligned4(a->bias),
               backward ? "dweight and dbias must be 4-byte aligned" : "bias must be 4-byte aligned");
  if (!backward) {
    GM_TRY(check_tensor(a->y, 3, oe, es, true, true,
                        "y must be [B, N_next, C_out], element-aligned, unit last stride, injective"));
    GM_REFUSE_IF(overlap(a->x, es, a->y, es), "x and y overlap");
  } else {
    GM_TRY(check_tensor(a->dy, 3, oe, es, true, false, "dy must be [B, N_next, C_out], element-aligned, unit last stride"));
    GM_TRY(check_tensor(a->dx, 3, xe, es, true, true, "dx must be [B, N, C_in], element-aligned, unit last stride, injective"));
    GM_REFUSE_IF(overlap(a->x, es, a->dx, es) || overlap(a->dy, es, a->dx, es), "dx overlaps x or dy");
  }
  return cudaSuccess;
}

template <class Op>
cudaError_t launch_gemm(const Op& op, cudaStream_t stream) {
  if (op.M == 0 || op.N == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((op.N + k_bn - 1) / k_bn), static_cast<unsigned>((op.M + k_bm - 1) / k_bm));
  return launch(gather_gemm<Op>, grid, k_gemm_threads, 0, stream, op);
}

block_geom make_geom(const gm_block_conv_args* a, const gm_tensor& out) {
  block_geom g;
  g.gather = a->gather;
  g.batch = static_cast<int>(a->x.extent[0]);
  g.tokens = static_cast<int>(a->x.extent[1]);
  g.cin = static_cast<int>(a->x.extent[2]);
  g.n_next = static_cast<int>(out.extent[1]);
  g.cout = static_cast<int>(out.extent[2]);
  g.P = a->stride * a->stride;
  g.w = a->weight;
  return g;
}

template <class T>
cudaError_t run_block_fwd(const gm_block_conv_args* a, cudaStream_t stream) {
  bc_fwd_op<T> op;
  op.g = make_geom(a, a->y);
  op.x = static_cast<const T*>(a->x.data);
  op.y = static_cast<T*>(a->y.data);
  op.bias = a->bias;
  op.x_s0 = a->x.stride[0]; op.x_s1 = a->x.stride[1];
  op.y_s0 = a->y.stride[0]; op.y_s1 = a->y.stride[1];
  op.M = op.g.batch * op.g.n_next;
  op.N = op.g.cout;
  op.K = op.g.P * op.g.cin;
  return launch_gemm(op, stream);
}

template <class T>
cudaError_t run_block_bwd(const gm_block_conv_args* a, cudaStream_t stream) {
  const block_geom g = make_geom(a, a->dy);
  const T* dy = static_cast<const T*>(a->dy.data);
  const std::int64_t xs = static_cast<std::int64_t>(g.batch) * g.tokens * g.cin;
  if (xs > 0)
    GM_TRY(launch(zero_rows<T>, dim3(static_cast<unsigned>((xs + k_red_threads - 1) / k_red_threads)), k_red_threads, 0,
                  stream, static_cast<T*>(a->dx.data), a->dx.stride[0], a->dx.stride[1], g.batch, g.tokens, g.cin));
  bc_dx_op<T> dx;
  dx.g = g;
  dx.dy = dy;
  dx.dx = static_cast<T*>(a->dx.data);
  dx.dy_s0 = a->dy.stride[0]; dx.dy_s1 = a->dy.stride[1];
  dx.dx_s0 = a->dx.stride[0]; dx.dx_s1 = a->dx.stride[1];
  dx.M = g.batch * g.n_next;
  dx.N = g.P * g.cin;
  dx.K = g.cout;
  GM_TRY(launch_gemm(dx, stream));
  if (a->dweight) {
    bc_dw_op<T> dw;
    dw.g = g;
    dw.x = static_cast<const T*>(a->x.data);
    dw.dy = dy;
    dw.dw = a->dweight;
    dw.x_s0 = a->x.stride[0]; dw.x_s1 = a->x.stride[1];
    dw.dy_s0 = a->dy.stride[0]; dw.dy_s1 = a->dy.stride[1];
    dw.M = g.cout;
    dw.N = g.P * g.cin;
    dw.K = g.batch * g.n_next;
    if (dw.K == 0 && dw.M > 0 && dw.N > 0)
      GM_TRY(cudaMemsetAsync(a->dweight, 0, static_cast<std::size_t>(dw.M) * dw.N * sizeof(float), stream));
    else
      GM_TRY(launch_gemm(dw, stream));
  }
  if (a->dbias && g.cout > 0)
    GM_TRY(launch(block_dbias<T>, dim3(static_cast<unsigned>((g.cout + k_red_threads - 1) / k_red_threads)),
                  k_red_threads, 0, stream, dy, a->dy.stride[0], a->dy.stride[1], g.batch, g.n_next, g.cout, a->dbias));
  return cudaSuccess;
}

}  // namespace
}  // namespace cuda
}  // namespace detail
}  // namespace greenmim

using namespace greenmim::detail::cuda;

extern "C" cudaError_t gm_depthwise_conv_fwd_can_implement(const gm_depthwise_conv_args* args) {
  try {
    return check_dw_args(args, false);
  } catch (...) {
    return cudaErrorUnknown;
  }
}

extern "C" cudaError_t gm_depthwise_conv_fwd(const gm_depthwise_conv_args* args, cudaStream_t stream) {
  try {
    GM_TRY(check_dw_args(args, false));
    switch (args->dtype) {
      case GM_FLOAT32: return run_dw_fwd<float>(args, stream);
      case GM_FLOAT16: return run_dw_fwd<__half>(args, stream);
      case GM_BFLOAT16: return run_dw_fwd<__nv_bfloat16>(args, stream);
    }
    return cudaErrorInvalidValue;
  } catch (...) {
    return cudaErrorUnknown;
  }
}

extern "C" cudaError_t gm_depthwise_conv_bwd_can_implement(const gm_depthwise_conv_args* args) {
  try {
    return check_dw_args(args, true);
  } catch (...) {
    return cudaErrorUnknown;
  }
}

extern "C" cudaError_t gm_depthwise_conv_bwd_workspace_size(const gm_depthwise_conv_args* args, size_t* bytes) {
  try {
    GM_TRY(check_dw_args(args, true));
    GM_REFUSE_IF(bytes == nullptr, "bytes is null");
    *bytes = dw_workspace_bytes(args);
    return cudaSuccess;
  } catch (...) {
    return cudaErrorUnknown;
  }
}

extern "C" cudaError_t gm_depthwise_conv_bwd(const gm_depthwise_conv_args* args, void* workspace,
                                             size_t workspace_bytes, cudaStream_t stream) {
  try {
    GM_TRY(check_dw_args(args, true));
    const std::size_t need = dw_workspace_bytes(args);
    GM_REFUSE_IF(workspace_bytes < need, "workspace too small (gm_depthwise_conv_bwd_workspace_size)");
    GM_REFUSE_IF(need > 0 && (workspace == nullptr || reinterpret_cast<std::uintptr_t>(workspace) % 16 != 0),
                 "workspace must be non-null and 16-byte aligned");
    switch (args->dtype) {
      case GM_FLOAT32: return run_dw_bwd<float>(args, workspace, stream);
      case GM_FLOAT16: return run_dw_bwd<__half>(args, workspace, stream);
      case GM_BFLOAT16: return run_dw_bwd<__nv_bfloat16>(args, workspace, stream);
    }
    return cudaErrorInvalidValue;
  } catch (...) {
    return cudaErrorUnknown;
  }
}

extern "C" cudaError_t gm_block_conv_fwd_can_implement(const gm_block_conv_args* args) {
  try {
    return check_block_args(args, false);
  } catch (...) {
    return cudaErrorUnknown;
  }
}

extern "C" cudaError_t gm_block_conv_fwd(const gm_block_conv_args* args, cudaStream_t stream) {
  try {
    GM_TRY(check_block_args(args, false));
    switch (args->dtype) {
      case GM_FLOAT32: return run_block_fwd<float>(args, stream);
      case GM_FLOAT16: return run_block_fwd<__half>(args, stream);
      case GM_BFLOAT16: return run_block_fwd<__nv_bfloat16>(args, stream);
    }
    return cudaErrorInvalidValue;
  } catch (...) {
    return cudaErrorUnknown;
  }
}

extern "C" cudaError_t gm_block_conv_bwd_can_implement(const gm_block_conv_args* args) {
  try {
    return check_block_args(args, true);
  } catch (...) {
    return cudaErrorUnknown;
  }
}

extern "C" cudaError_t gm_block_conv_bwd(const gm_block_conv_args* args, cudaStream_t stream) {
  try {
    GM_TRY(check_block_args(args, true));
    switch (args->dtype) {
      case GM_FLOAT32: return run_block_bwd<float>(args, stream);
      case GM_FLOAT16: return run_block_bwd<__half>(args, stream);
      case GM_BFLOAT16: return run_block_bwd<__nv_bfloat16>(args, stream);
    }
    return cudaErrorInvalidValue;
  } catch (...) {
    return cudaErrorUnknown;
  }
}
