//! \file block_conv.cu
//! The kernel = stride block conv on visible tokens (Twins' GSA sub-sampling, patch embedding),
//! forward and backward, as gather + GEMM (docs/sparse-conv.md; block tables from
//! include/greenmim/sparse_conv.hpp). One tiled SIMT GEMM kernel serves the three products
//! (64 x 64 x 16 tiles of fp32 in shared memory, 4 x 4 outputs per thread; no cuBLAS: the A
//! operand is a gather of whole blocks and dx a scatter, which a GEMM library cannot fuse).
//! Where the output tiles alone are too few CTAs, the reduction is split (split-K: grid.z,
//! detail/conv_split.hpp, a function of the shapes only): each split writes fp32 partials to the
//! workspace and a second kernel sums them in split order and stores (deterministic, no atomics):
//! - forward  Y[b*N_next + n, o] = sum_k A[., k] W'[o, k] + bias[o], A[n, p*C_in + c] =
//!   x[b, gather[n*s*s + p], c], W'[o, p*C_in + c] = weight[o, c, p] (PyTorch's layout, read in
//!   place);
//! - dx: zeroed, then dA = dY W' scattered to x's rows through the table (each input in at most
//!   one block: plain stores);
//! - dweight = dY^T A over all rows, with dbias as one more column of the gathered operand (all
//!   ones), so both share the GEMM and its split.
//! Table entries outside [0, N) read as zero / are skipped (never an out-of-bounds access).
#include <greenmim/kernels.h>

#include <cstdint>
#include <cstring>

#include <greenmim/sparse_conv.hpp>

#include "detail/conv_split.hpp"
#include "detail/device_common.cuh"
#include "detail/gather_gemm_async.cuh"
#include "detail/host_checks.hpp"
#include "detail/launch.cuh"

namespace greenmim {
namespace detail {
namespace cuda {
namespace {

constexpr int k_red_threads = 256;  // element-wise kernels (zero_rows, splitk_reduce)

// ---- block conv: one tiled SIMT GEMM, operands through accessors --------------------------------------
constexpr int k_bm = k_gemm_bm, k_bn = k_gemm_bn, k_bk = k_gemm_bk, k_gemm_threads = 256;

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

//! C[M, N] = A[M, K] B[K, N] through op.a / op.b / op.store; fp32 in shared memory, each thread
//! 4 x 4 outputs, k ascending (a fixed order: deterministic). Split blockIdx.z covers
//! k in [z * k_per, (z + 1) * k_per); with `partial`, it writes its sums to partial[z][M][N]
//! (splitk_reduce stores them), else it stores through op.store.
template <class Op>
__global__ void __launch_bounds__(k_gemm_threads) gather_gemm(const Op op, const int k_per, float* partial) {
  __shared__ float As[k_bk][k_bm + 4];
  __shared__ float Bs[k_bk][k_bn + 4];
  const int m0 = static_cast<int>(blockIdx.y) * k_bm, n0 = static_cast<int>(blockIdx.x) * k_bn;
  const int tx = static_cast<int>(threadIdx.x) % 16, ty = static_cast<int>(threadIdx.x) / 16;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
  const int k_begin = static_cast<int>(blockIdx.z) * k_per;
  const int k_end = op.K - k_begin > k_per ? k_begin + k_per : op.K;
  for (int k0 = k_begin; k0 < k_end; k0 += k_bk) {
    for (int i = static_cast<int>(threadIdx.x); i < k_bm * k_bk; i += k_gemm_threads) {
      const int r = i / k_bk, kk = i % k_bk;
      As[kk][r] = (m0 + r < op.M && k0 + kk < k_end) ? op.a(m0 + r, k0 + kk) : 0.f;
    }
    for (int i = static_cast<int>(threadIdx.x); i < k_bk * k_bn; i += k_gemm_threads) {
      const int kk = i / k_bn, c = i % k_bn;
      Bs[kk][c] = (k0 + kk < k_end && n0 + c < op.N) ? op.b(k0 + kk, n0 + c) : 0.f;
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
      if (r >= op.M || c >= op.N) continue;
      if (partial)
        partial[(static_cast<std::int64_t>(blockIdx.z) * op.M + r) * op.N + c] = acc[i][j];
      else
        op.store(r, c, acc[i][j]);
    }
}

//! C[r, c] = the splits' partials summed in split order, stored through op.store.
template <class Op>
__global__ void __launch_bounds__(k_red_threads) splitk_reduce(const Op op, const int splits, const float* partial) {
  const std::int64_t mn = static_cast<std::int64_t>(op.M) * op.N;
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= mn) return;
  float s = 0.f;
  for (int z = 0; z < splits; ++z) s += partial[z * mn + i];
  op.store(static_cast<int>(i / op.N), static_cast<int>(i % op.N), s);
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

//! W' in the element type for the tensor cores: wt[o][j] = weight[o, j % C_in, j / C_in] for
//! j < P * C_in, zero up to the padded row length ldw.
template <class T>
__global__ void __launch_bounds__(k_red_threads) convert_weight(const float* w, T* wt, int cout, int cin, int P, int ldw) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<std::int64_t>(cout) * ldw) return;
  const int o = static_cast<int>(i / ldw), j = static_cast<int>(i % ldw);
  wt[i] = j < P * cin ? from_float<T>(__ldg(w + (static_cast<std::int64_t>(o) * cin + j % cin) * P + j / cin))
                      : from_float<T>(0.f);
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
  GM_REFUSE_IF(P * Ci > 0x7fffffff - 8,
               "extents too large for int32 GEMM indices (s * s * C_in + 1, rounded up to 8 for the tensor cores)");
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

//! The operators that gather_gemm_async can run (the forward), where they set `async` (k_per is a
//! multiple of 16 and K of 8 there, so no chunk straddles a split's end).
template <class Op>
constexpr bool k_has_async = std::is_same<Op, bc_fwd_op<typename Op::elem>>::value;

//! gather_gemm_async where op allows it, else gather_gemm_mma (16-bit element types).
template <class Op>
cudaError_t launch_mma(const Op& op, const dim3 grid, int k_per, float* partial, cudaStream_t stream) {
  if constexpr (k_has_async<Op>)
    if (op.async)
      return launch(gather_gemm_async<Op>, grid, k_tc_threads, gather_gemm_async_smem<Op>(), stream, op, k_per, partial);
  return launch(gather_gemm_mma<Op>, grid, k_tc_threads, gather_gemm_mma_smem<Op>(), stream, op, k_per, partial);
}

//! op's GEMM split as gemm_split_for(M, split_n, K) says (split_n: the N the split is computed
//! for, >= op.N; the dweight GEMM passes P * C_in + 1 whichever gradients are requested, so
//! dweight's bits do not depend on whether dbias is wanted); `workspace` holds the partials.
template <class Op>
cudaError_t launch_gemm(const Op& op, float* workspace, cudaStream_t stream, std::int64_t split_n = 0) {
  if (op.M == 0 || op.N == 0) return cudaSuccess;
  const gemm_split sp = gemm_split_for(op.M, split_n > op.N ? split_n : op.N, op.K);
  const dim3 grid(static_cast<unsigned>((op.N + k_bn - 1) / k_bn), static_cast<unsigned>((op.M + k_bm - 1) / k_bm),
                  static_cast<unsigned>(sp.splits));
  float* partial = sp.splits > 1 ? workspace : nullptr;
  if constexpr (std::is_same<typename Op::elem, float>::value)
    GM_TRY(launch(gather_gemm<Op>, grid, k_gemm_threads, 0, stream, op, sp.k_per, partial));
  else
    GM_TRY(launch_mma(op, grid, sp.k_per, partial, stream));
  if (!partial) return cudaSuccess;
  const std::int64_t mn = static_cast<std::int64_t>(op.M) * op.N;
  return launch(splitk_reduce<Op>, dim3(static_cast<unsigned>((mn + k_red_threads - 1) / k_red_threads)), k_red_threads,
                0, stream, op, sp.splits, static_cast<const float*>(partial));
}

//! The three GEMMs' (M, N, K): forward, dx, dweight (+ dbias column).
struct block_gemms {
  std::int64_t rows = 0, P = 0, cin = 0, cout = 0;  // rows = B * N_next
  std::int64_t dw_cols(const gm_block_conv_args* a) const {
    return (a->dweight ? P * cin : 0) + (a->dbias ? 1 : 0);
  }
  //! The N the dweight GEMM's split is computed for: all columns, whichever are requested.
  std::int64_t dw_split_n() const { return P * cin + 1; }
};

block_gemms gemm_shapes(const gm_block_conv_args* a, const gm_tensor& out) {
  block_gemms s;
  s.rows = a->x.extent[0] * out.extent[1];
  s.P = static_cast<std::int64_t>(a->stride) * a->stride;
  s.cin = a->x.extent[2];
  s.cout = out.extent[2];
  return s;
}

//! The workspace: W' in the element type (16-bit dtypes: the tensor cores' B operand), then the
//! split-K partials at a 256-byte offset.
struct block_workspace {
  std::size_t weight_bytes = 0, partial_bytes = 0;
  std::size_t partial_offset() const { return (weight_bytes + 255) / 256 * 256; }
  std::size_t total() const { return partial_bytes == 0 ? weight_bytes : partial_offset() + partial_bytes; }
};

//! W' rows of the tensor-core path: P * C_in rounded up to 8 elements (16-byte rows).
std::int64_t weight_ld(const block_gemms& s) { return (s.P * s.cin + 7) / 8 * 8; }

std::size_t weight_bytes(const gm_block_conv_args* a, const block_gemms& s) {
  if (a->dtype == GM_FLOAT32 || s.rows == 0) return 0;  // SIMT reads the fp32 weight; no rows: no GEMM
  return static_cast<std::size_t>(s.cout * weight_ld(s)) * dtype_bytes(a->dtype);
}

block_workspace block_fwd_workspace(const gm_block_conv_args* a) {
  const block_gemms s = gemm_shapes(a, a->y);
  const std::int64_t K = s.P * s.cin;
  block_workspace w;
  w.weight_bytes = weight_bytes(a, s);
  w.partial_bytes = static_cast<std::size_t>(gemm_split_for(s.rows, s.cout, K).partial_floats(s.rows, s.cout)) * sizeof(float);
  return w;
}

block_workspace block_bwd_workspace(const gm_block_conv_args* a) {
  const block_gemms s = gemm_shapes(a, a->dy);
  const std::int64_t dx = gemm_split_for(s.rows, s.P * s.cin, s.cout).partial_floats(s.rows, s.P * s.cin);
  const std::int64_t cols = s.dw_split_n();  // an upper bound of the requested columns
  const std::int64_t dw = (a->dweight || a->dbias) ? gemm_split_for(s.cout, cols, s.rows).partial_floats(s.cout, cols) : 0;
  block_workspace w;
  w.weight_bytes = weight_bytes(a, s);
  w.partial_bytes = static_cast<std::size_t>(dx > dw ? dx : dw) * sizeof(float);
  return w;
}

std::size_t block_fwd_workspace_bytes(const gm_block_conv_args* a) { return block_fwd_workspace(a).total(); }
std::size_t block_bwd_workspace_bytes(const gm_block_conv_args* a) { return block_bwd_workspace(a).total(); }

//! The geometry's W' for the tensor cores (16-bit T): converted into the workspace's head.
template <class T>
cudaError_t stage_weight(block_geom& g, const gm_block_conv_args* a, void* workspace, cudaStream_t stream) {
  if constexpr (std::is_same<T, float>::value) {
    return cudaSuccess;
  } else {
    const block_gemms s = gemm_shapes(a, a->x);  // only P and C_in are read
    g.ldw = static_cast<int>(weight_ld(s));
    g.wt = workspace;
    const std::int64_t n = static_cast<std::int64_t>(g.cout) * g.ldw;
    if (n == 0) return cudaSuccess;
    return launch(convert_weight<T>, dim3(static_cast<unsigned>((n + k_red_threads - 1) / k_red_threads)), k_red_threads, 0,
                  stream, a->weight, static_cast<T*>(workspace), g.cout, g.cin, g.P, g.ldw);
  }
}

cudaError_t check_workspace(std::size_t need, const void* workspace, std::size_t bytes, const char* size_fn) {
  GM_REFUSE_IF(bytes < need, size_fn);
  GM_REFUSE_IF(need > 0 && (workspace == nullptr || reinterpret_cast<std::uintptr_t>(workspace) % 16 != 0),
               "workspace must be non-null and 16-byte aligned");
  return cudaSuccess;
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

//! The split-K partials' part of the workspace.
float* partials(void* workspace, const block_workspace& w) {
  return w.partial_bytes == 0 ? nullptr : reinterpret_cast<float*>(static_cast<char*>(workspace) + w.partial_offset());
}

template <class T>
cudaError_t run_block_fwd(const gm_block_conv_args* a, void* workspace, cudaStream_t stream) {
  const block_workspace w = block_fwd_workspace(a);
  bc_fwd_op<T> op;
  op.g = make_geom(a, a->y);
  if (op.g.batch * op.g.n_next > 0) GM_TRY(stage_weight<T>(op.g, a, workspace, stream));
  op.x = static_cast<const T*>(a->x.data);
  op.y = static_cast<T*>(a->y.data);
  op.bias = a->bias;
  op.x_s0 = a->x.stride[0]; op.x_s1 = a->x.stride[1];
  op.y_s0 = a->y.stride[0]; op.y_s1 = a->y.stride[1];
  op.M = op.g.batch * op.g.n_next;
  op.N = op.g.cout;
  op.K = op.g.P * op.g.cin;
  op.async = op.async_ok();
  return launch_gemm(op, partials(workspace, w), stream);
}

template <class T>
cudaError_t run_block_bwd(const gm_block_conv_args* a, void* workspace, cudaStream_t stream) {
  const block_workspace w = block_bwd_workspace(a);
  block_geom g = make_geom(a, a->dy);
  if (g.batch * g.n_next > 0) GM_TRY(stage_weight<T>(g, a, workspace, stream));
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
  GM_TRY(launch_gemm(dx, partials(workspace, w), stream));
  if (!a->dweight && !a->dbias) return cudaSuccess;
  const block_gemms shapes = gemm_shapes(a, a->dy);
  bc_dw_op<T> dw;
  dw.g = g;
  dw.x = static_cast<const T*>(a->x.data);
  dw.dy = dy;
  dw.dw = a->dweight;
  dw.db = a->dbias;
  dw.x_s0 = a->x.stride[0]; dw.x_s1 = a->x.stride[1];
  dw.dy_s0 = a->dy.stride[0]; dw.dy_s1 = a->dy.stride[1];
  dw.jbase = a->dweight ? 0 : g.P * g.cin;
  dw.M = g.cout;
  dw.N = static_cast<int>(shapes.dw_cols(a));
  dw.K = g.batch * g.n_next;
  if (dw.K == 0) {  // no rows: zero gradients
    if (a->dweight && g.cout > 0 && g.P * g.cin > 0)
      GM_TRY(cudaMemsetAsync(a->dweight, 0, static_cast<std::size_t>(g.cout) * g.P * g.cin * sizeof(float), stream));
    if (a->dbias && g.cout > 0) GM_TRY(cudaMemsetAsync(a->dbias, 0, static_cast<std::size_t>(g.cout) * sizeof(float), stream));
    return cudaSuccess;
  }
  GM_TRY(launch_gemm(dw, partials(workspace, w), stream, shapes.dw_split_n()));
  return cudaSuccess;
}

}  // namespace
}  // namespace cuda
}  // namespace detail
}  // namespace greenmim

using namespace greenmim::detail::cuda;

namespace {

//! The workspace_size entry points (the forward's, the backward's).
cudaError_t block_workspace_size(const gm_block_conv_args* args, bool backward, size_t* bytes) {
  return no_throw([&]() -> cudaError_t {
    GM_TRY(check_block_args(args, backward));
    GM_REFUSE_IF(bytes == nullptr, "bytes is null");
    *bytes = backward ? block_bwd_workspace_bytes(args) : block_fwd_workspace_bytes(args);
    return cudaSuccess;
  });
}

//! The forward and backward entry points: checks, the workspace's, then the launches.
cudaError_t block_entry(const gm_block_conv_args* args, bool backward, void* workspace, size_t workspace_bytes,
                        cudaStream_t stream) {
  return no_throw([&]() -> cudaError_t {
    GM_TRY(check_block_args(args, backward));
    GM_TRY(check_workspace(backward ? block_bwd_workspace_bytes(args) : block_fwd_workspace_bytes(args), workspace,
                           workspace_bytes,
                           backward ? "workspace too small (gm_block_conv_bwd_workspace_size)"
                                    : "workspace too small (gm_block_conv_fwd_workspace_size)"));
    return with_element_type(args->dtype, [&](auto t) {
      using T = typename decltype(t)::type;
      return backward ? run_block_bwd<T>(args, workspace, stream) : run_block_fwd<T>(args, workspace, stream);
    });
  });
}

}  // namespace

extern "C" cudaError_t gm_block_conv_fwd_can_implement(const gm_block_conv_args* args) {
  return no_throw([&] { return check_block_args(args, false); });
}

extern "C" cudaError_t gm_block_conv_fwd_workspace_size(const gm_block_conv_args* args, size_t* bytes) {
  return block_workspace_size(args, false, bytes);
}

extern "C" cudaError_t gm_block_conv_fwd(const gm_block_conv_args* args, void* workspace, size_t workspace_bytes,
                                         cudaStream_t stream) {
  return block_entry(args, false, workspace, workspace_bytes, stream);
}

extern "C" cudaError_t gm_block_conv_bwd_can_implement(const gm_block_conv_args* args) {
  return no_throw([&] { return check_block_args(args, true); });
}

extern "C" cudaError_t gm_block_conv_bwd_workspace_size(const gm_block_conv_args* args, size_t* bytes) {
  return block_workspace_size(args, true, bytes);
}

extern "C" cudaError_t gm_block_conv_bwd(const gm_block_conv_args* args, void* workspace, size_t workspace_bytes,
                                         cudaStream_t stream) {
  return block_entry(args, true, workspace, workspace_bytes, stream);
}
