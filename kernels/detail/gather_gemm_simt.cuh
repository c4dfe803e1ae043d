//! \file gather_gemm_simt.cuh
//! Private, experimental (docs/sparse-conv.md "The fused block conv"): C[M, N] = A[M, K] B[K, N]
//! on CUDA cores in fp32 for operands read through an operator (block_conv_ops.cuh: `a(m, k)`,
//! `b(k, n)`, `store(m, n, v)`, `int M, N, K`), the block conv's fp32 path; and splitk_reduce,
//! which sums any of the gather-GEMMs' split-K partials in split order (deterministic, no atomics).
//! Tiles of k_gemm_bm x k_gemm_bn x k_gemm_bk (conv_split.hpp) in shared memory, 256 threads of
//! 4 x 4 outputs.
#pragma once

#include <cstdint>

#include "block_conv_ops.cuh"
#include "conv_split.hpp"
#include "device_common.cuh"

namespace greenmim {
namespace detail {
namespace cuda {

constexpr int k_bm = k_gemm_bm, k_bn = k_gemm_bn, k_bk = k_gemm_bk, k_gemm_threads = 256;

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
__global__ void __launch_bounds__(k_bc_elem_threads) splitk_reduce(const Op op, const int splits, const float* partial) {
  const std::int64_t mn = static_cast<std::int64_t>(op.M) * op.N;
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= mn) return;
  float s = 0.f;
  for (int z = 0; z < splits; ++z) s += partial[z * mn + i];
  op.store(static_cast<int>(i / op.N), static_cast<int>(i % op.N), s);
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
