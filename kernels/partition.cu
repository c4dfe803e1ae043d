//! \file partition.cu
//! Partition / unpartition (gather / scatter) of token features, [B, N, C] <-> [B, n_g*G, C]:
//! one row copy, destination row r takes source row index[r] or zeros (padding). A team of 2^k
//! lanes copies a row in the widest chunks (16, 8, 4, 2 bytes) dividing every row start and the
//! row length. A thread reads a row's index once and copies its chunks of that row for several
//! samples, issuing a pass's loads (up to 8 in registers) before its stores. The grid
//! (copy_grid.hpp) fits one wave of k_resident_ctas CTAs per SM where it can.
#include <greenmim/kernels.h>

#include <cstdint>

#include "detail/copy_grid.hpp"
#include "detail/device_common.cuh"
#include "detail/launch.cuh"
#include "detail/host_checks.hpp"

namespace greenmim {
namespace detail {
namespace cuda {
namespace {

struct copy_params {
  const char* src = nullptr;
  char* dst = nullptr;
  std::int64_t src_s0 = 0, src_s1 = 0;  // bytes
  std::int64_t dst_s0 = 0, dst_s1 = 0;  // bytes
  const index_t* index = nullptr;       // [dst_rows]: source row of each destination row
  int dst_rows = 0;                     // rows per sample of the destination
  int src_rows = 0;                     // rows per sample of the source (bounds)
  int batch = 0;
  int chunks = 0;                       // chunks of sizeof(V) per row
  int tpr_log2 = 0;
  int spt = 1;                          // samples per thread and pass (1 .. 8/K)
};

//! K: chunks of the row per lane and pass (1, 2, 4 or 8); up to 8/K samples per pass.
template <class V, int K>
__global__ void __launch_bounds__(k_copy_threads, k_resident_ctas) copy_rows(const copy_params p) {
  constexpr int S = k_copy_vectors / K;
  const int tpr = 1 << p.tpr_log2;
  const int lane = threadIdx.x & (tpr - 1);
  const int r = static_cast<int>((static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> p.tpr_log2);
  if (r >= p.dst_rows) return;
  const index_t sr = p.index[r];
  const bool real = static_cast<unsigned>(sr) < static_cast<unsigned>(p.src_rows);
  const char* const src_row = p.src + (real ? sr * p.src_s1 : 0);
  char* const dst_row = p.dst + r * p.dst_s1;
  const int step = static_cast<int>(gridDim.y) * p.spt;
  for (int b0 = static_cast<int>(blockIdx.y) * p.spt; b0 < p.batch; b0 += step) {
    const int nb = p.batch - b0 < p.spt ? p.batch - b0 : p.spt;  // samples in this pass
    for (int c0 = lane; c0 < p.chunks; c0 += K * tpr) {
      V v[S][K];
#pragma unroll
      for (int i = 0; i < S; ++i)
#pragma unroll
        for (int j = 0; j < K; ++j) v[i][j] = V{};
      if (real) {  // every load of the pass before any store
#pragma unroll
        for (int i = 0; i < S; ++i) {
          const V* s = reinterpret_cast<const V*>(src_row + (b0 + i) * p.src_s0);
#pragma unroll
          for (int j = 0; j < K; ++j)
            if (i < nb && c0 + j * tpr < p.chunks) v[i][j] = __ldg(s + c0 + j * tpr);
        }
      }
#pragma unroll
      for (int i = 0; i < S; ++i) {
        V* d = reinterpret_cast<V*>(dst_row + (b0 + i) * p.dst_s0);
#pragma unroll
        for (int j = 0; j < K; ++j)
          if (i < nb && c0 + j * tpr < p.chunks) d[c0 + j * tpr] = v[i][j];
      }
    }
  }
}

cudaError_t check_partition_args(const gm_partition_args* a, bool unpartition) {
  clear_refusal();
  GM_REFUSE_IF(a == nullptr, "args is null");
  GM_REFUSE_IF(!valid_dtype(a->dtype), "dtype must be GM_FLOAT32, GM_FLOAT16 or GM_BFLOAT16");
  GM_REFUSE_IF(a->x.rank != 3 || a->y.rank != 3, "x and y must have rank 3");
  const gm_partition& part = a->part;
  GM_REFUSE_IF(part.group_size < 1, "group_size must be >= 1");
  GM_REFUSE_IF(part.num_groups < 0 || part.num_tokens < 0, "num_groups and num_tokens must be >= 0");
  const std::int64_t slots = static_cast<std::int64_t>(part.group_size) * part.num_groups;
  GM_REFUSE_IF(slots > 0x7fffffff, "num_groups * group_size overflows int32");
  const std::int64_t B = a->x.extent[0], C = a->x.extent[2];
  GM_REFUSE_IF(B < 0 || C < 0, "negative extent");
  const std::size_t es = dtype_bytes(a->dtype);
  const std::int64_t xe[3] = {B, part.num_tokens, C};
  const std::int64_t ye[3] = {B, slots, C};
  GM_TRY(check_tensor(a->x, 3, xe, es, true, unpartition,
                      "x must be [B, num_tokens, C], element-aligned, unit last stride, non-negative strides"));
  GM_TRY(check_tensor(a->y, 3, ye, es, true, !unpartition,
                      "y must be [B, num_groups*group_size, C], element-aligned, unit last stride, non-negative strides"));
  GM_REFUSE_IF(overlap(a->x, es, a->y, es), "x and y overlap");
  GM_REFUSE_IF(C * static_cast<std::int64_t>(es) > 0x7fffffff, "row too long");
  if (unpartition) GM_REFUSE_IF(part.num_tokens > 0 && part.scatter == nullptr, "part.scatter is null");
  else GM_REFUSE_IF(slots > 0 && part.gather == nullptr, "part.gather is null");
  GM_REFUSE_IF(!aligned4(unpartition ? part.scatter : part.gather), "the partition's int32 arrays must be 4-byte aligned");
  return cudaSuccess;
}

template <class V>
cudaError_t launch_copy(copy_params p, std::int64_t row_bytes, cudaStream_t stream) {
  p.chunks = static_cast<int>(row_bytes / static_cast<std::int64_t>(sizeof(V)));
  int dev = 0, sms = 0;
  GM_TRY(cudaGetDevice(&dev));
  GM_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const copy_grid g = plan_copy_grid(p.dst_rows, p.chunks, p.batch, sms);
  p.tpr_log2 = g.tpr_log2;
  p.spt = g.spt;
  const dim3 grid(static_cast<unsigned>(g.gx), static_cast<unsigned>(g.gy));
  switch (g.k) {
    case 1: return launch(copy_rows<V, 1>, grid, k_copy_threads, 0, stream, p);
    case 2: return launch(copy_rows<V, 2>, grid, k_copy_threads, 0, stream, p);
    case 4: return launch(copy_rows<V, 4>, grid, k_copy_threads, 0, stream, p);
    default: return launch(copy_rows<V, 8>, grid, k_copy_threads, 0, stream, p);
  }
}

cudaError_t run_copy(const gm_partition_args* a, bool unpartition, cudaStream_t stream) {
  GM_TRY(check_partition_args(a, unpartition));
  const std::size_t es = dtype_bytes(a->dtype);
  const gm_tensor& src = unpartition ? a->y : a->x;
  const gm_tensor& dst = unpartition ? a->x : a->y;
  const std::int64_t B = a->x.extent[0], C = a->x.extent[2];
  const std::int64_t dst_rows = dst.extent[1];
  if (B == 0 || C == 0 || dst_rows == 0) return cudaSuccess;
  copy_params p;
  p.src = static_cast<const char*>(src.data);
  p.dst = static_cast<char*>(dst.data);
  p.src_s0 = src.stride[0] * static_cast<std::int64_t>(es);
  p.src_s1 = src.stride[1] * static_cast<std::int64_t>(es);
  p.dst_s0 = dst.stride[0] * static_cast<std::int64_t>(es);
  p.dst_s1 = dst.stride[1] * static_cast<std::int64_t>(es);
  p.index = unpartition ? a->part.scatter : a->part.gather;
  p.dst_rows = static_cast<int>(dst_rows);
  p.src_rows = static_cast<int>(src.extent[1]);
  p.batch = static_cast<int>(B);
  const std::int64_t row_bytes = C * static_cast<std::int64_t>(es);
  // widest chunk dividing every row start and the row length
  std::uint64_t g = static_cast<std::uint64_t>(row_bytes) | reinterpret_cast<std::uintptr_t>(p.src) |
                    reinterpret_cast<std::uintptr_t>(p.dst);
  if (B > 1) g |= static_cast<std::uint64_t>(p.src_s0) | static_cast<std::uint64_t>(p.dst_s0);
  if (src.extent[1] > 1) g |= static_cast<std::uint64_t>(p.src_s1);
  if (dst_rows > 1) g |= static_cast<std::uint64_t>(p.dst_s1);
  if (g % 16 == 0) return launch_copy<uint4>(p, row_bytes, stream);
  if (g % 8 == 0) return launch_copy<uint2>(p, row_bytes, stream);
  if (g % 4 == 0) return launch_copy<unsigned>(p, row_bytes, stream);
  return launch_copy<unsigned short>(p, row_bytes, stream);
}

}  // namespace
}  // namespace cuda
}  // namespace detail
}  // namespace greenmim

using namespace greenmim::detail::cuda;

extern "C" cudaError_t gm_partition_can_implement(const gm_partition_args* args) {
  return no_throw([&]() -> cudaError_t {
    GM_TRY(check_partition_args(args, false));
    return check_partition_args(args, true);
  });
}

extern "C" cudaError_t gm_partition_tokens(const gm_partition_args* args, cudaStream_t stream) {
  return no_throw([&] { return run_copy(args, false, stream); });
}

extern "C" cudaError_t gm_unpartition_tokens(const gm_partition_args* args, cudaStream_t stream) {
  return no_throw([&] { return run_copy(args, true, stream); });
}
