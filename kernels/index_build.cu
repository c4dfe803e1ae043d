//! \file index_build.cu
//! Device-side partition-index building with CUB: visible-position compaction
//! (DeviceSelect::Flagged), token windows and window sizes, and the fill of gather / scatter /
//! slot_window / slot_coord from a plan's per-window (group, slot offset) table, with ranks inside
//! each window from a stable radix sort by window (DeviceRadixSort::SortPairs) and window offsets
//! from an exclusive scan of the sizes (DeviceScan::ExclusiveSum). Same result as the host
//! builders of include/greenmim/partition.hpp (build_windows / build_windows_per_sample +
//! build_partition). All index math goes through geometry.hpp.
#include <greenmim/kernels.h>

#include <cstdint>

#include <greenmim/geometry.hpp>

#include "detail/cub.cuh"
#include "detail/host_checks.hpp"
#include "detail/launch.cuh"

namespace greenmim {
namespace detail {
namespace cuda {
namespace {

constexpr std::size_t tmp_align = 256;
inline std::size_t align_up(std::size_t n) { return (n + tmp_align - 1) / tmp_align * tmp_align; }

inline unsigned blocks_for(std::int64_t n, int threads = 256) {
  const std::int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 1048576 ? 1048576 : b));
}

__global__ void token_windows_kernel(const index_t* __restrict__ positions, const index_t* __restrict__ count,
                                     int capacity, int num_masks, window_geometry g, index_t* coords,
                                     index_t* token_window, index_t* window_sizes) {
  const int n = min(*count, capacity);
  const std::int64_t hw = static_cast<std::int64_t>(g.height) * g.width;
  const index_t nw = g.num_windows();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const index_t pos = positions[i];
    if (pos < 0 || pos >= hw * num_masks) {
      coords[i] = 0;
      token_window[i] = pad_index;
      continue;
    }
    const index_t b = static_cast<index_t>(pos / hw);
    const index_t rem = static_cast<index_t>(pos - b * hw);
    const index_t h = rem / g.width, w = rem % g.width;
    const index_t win = b * nw + g.window_id(h, w);
    coords[i] = pack_coord(h, w);
    token_window[i] = win;
    atomicAdd(window_sizes + win, 1);  // integer: exact, order-free
  }
}

__global__ void iota_kernel(index_t* out, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = i;
}

__global__ void fill_padding_kernel(index_t* gather, index_t* slot_window, index_t* slot_coord, int slots,
                                    index_t* scatter, int num_tokens) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < slots; i += gridDim.x * blockDim.x) {
    gather[i] = pad_index;
    slot_window[i] = pad_index;
    slot_coord[i] = 0;
  }
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < num_tokens; i += gridDim.x * blockDim.x)
    scatter[i] = pad_index;
}

//! Sorted position i holds token t of window w with rank i - offset[w] inside the window.
__global__ void place_tokens_kernel(const index_t* __restrict__ sorted_windows, const index_t* __restrict__ sorted_tokens,
                                    const index_t* __restrict__ window_offsets, const index_t* __restrict__ coords,
                                    const index_t* __restrict__ window_group, const index_t* __restrict__ window_slot_offset,
                                    int num_tokens, int num_windows, int G, int num_groups, index_t* gather,
                                    index_t* scatter, index_t* slot_window, index_t* slot_coord) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < num_tokens; i += gridDim.x * blockDim.x) {
    const index_t w = sorted_windows[i];
    const index_t t = sorted_tokens[i];
    if (w < 0 || w >= num_windows || t < 0 || t >= num_tokens) continue;
    const index_t grp = window_group[w];
    const index_t off = window_slot_offset[w];
    const index_t rank = i - window_offsets[w];
    // not in the plan (rank >= G - off, not off + rank >= G: off is table data, any int32)
    if (grp < 0 || grp >= num_groups || off < 0 || rank < 0 || rank >= G - off) continue;
    const index_t slot = grp * G + off + rank;
    gather[slot] = t;
    scatter[t] = slot;
    slot_window[slot] = w;
    slot_coord[slot] = coords[t];
  }
}

}  // namespace
}  // namespace cuda
}  // namespace detail
}  // namespace greenmim

using greenmim::index_t;
using namespace greenmim::detail::cuda;

extern "C" cudaError_t gm_select_visible(void* d_temp_storage, size_t* temp_storage_bytes, const uint8_t* d_mask,
                                         int32_t num_masks, int32_t height, int32_t width, int32_t* d_positions,
                                         int32_t* d_num_visible, cudaStream_t stream) {
  return no_throw([&]() -> cudaError_t {
    clear_refusal();
    GM_REFUSE_IF(temp_storage_bytes == nullptr, "temp_storage_bytes is null");
    GM_REFUSE_IF(num_masks < 0, "num_masks must be >= 0");
    GM_REFUSE_IF(height < 1 || width < 1 || height > 32767 || width > 32767, "height and width must be in [1, 32767]");
    const std::int64_t total = static_cast<std::int64_t>(num_masks) * height * width;
    GM_REFUSE_IF(total > 0x7fffffff, "num_masks * height * width overflows int32");
    const thrust::counting_iterator<index_t> first(0);
    std::size_t need = 0;
    GM_TRY(cub::DeviceSelect::Flagged(nullptr, need, first, d_mask, d_positions, d_num_visible, total, stream));
    if (d_temp_storage == nullptr) {
      *temp_storage_bytes = need;
      return cudaSuccess;
    }
    // refused here with a reason, not by CUB without one
    GM_REFUSE_IF(*temp_storage_bytes < need, "temporary storage too small");
    GM_REFUSE_IF(d_mask == nullptr || d_positions == nullptr || d_num_visible == nullptr, "null device pointer");
    GM_REFUSE_IF(!aligned4(d_positions) || !aligned4(d_num_visible), "d_positions and d_num_visible must be 4-byte aligned");
    GM_TRY(cub::DeviceSelect::Flagged(d_temp_storage, *temp_storage_bytes, first, d_mask, d_positions, d_num_visible,
                                      total, stream));
    return cudaGetLastError();
  });
}

extern "C" cudaError_t gm_token_windows(const int32_t* d_positions, const int32_t* d_num_positions, int32_t capacity,
                                        int32_t num_masks, gm_window_geometry geom, int32_t* d_coords,
                                        int32_t* d_token_window, int32_t* d_window_sizes, cudaStream_t stream) {
  return no_throw([&]() -> cudaError_t {
    clear_refusal();
    const greenmim::window_geometry g{geom.height, geom.width, geom.window, geom.shift};
    GM_REFUSE_IF(!g.valid() || g.height > 32767 || g.width > 32767, "invalid window geometry");
    GM_REFUSE_IF(capacity < 0 || num_masks < 0, "capacity and num_masks must be >= 0");
    const std::int64_t nw = static_cast<std::int64_t>(num_masks) * g.num_windows();
    GM_REFUSE_IF(nw > 0x7fffffff, "num_masks * num_windows overflows int32");
    GM_REFUSE_IF(static_cast<std::int64_t>(num_masks) * g.height * g.width > 0x7fffffff, "positions overflow int32");
    GM_REFUSE_IF(nw > 0 && d_window_sizes == nullptr, "d_window_sizes is null");
    GM_REFUSE_IF(capacity > 0 && (d_positions == nullptr || d_num_positions == nullptr || d_coords == nullptr ||
                                  d_token_window == nullptr),
                 "null device pointer");
    GM_REFUSE_IF(!aligned4(d_positions) || !aligned4(d_num_positions) || !aligned4(d_coords) ||
                     !aligned4(d_token_window) || !aligned4(d_window_sizes),
                 "int32 arrays must be 4-byte aligned");  // every refusal before any work is queued
    if (nw > 0) GM_TRY(cudaMemsetAsync(d_window_sizes, 0, static_cast<std::size_t>(nw) * sizeof(index_t), stream));
    if (capacity == 0) return cudaSuccess;
    return launch(token_windows_kernel, blocks_for(capacity), 256, 0, stream, d_positions, d_num_positions, capacity,
                  num_masks, g, d_coords, d_token_window, d_window_sizes);
  });
}

extern "C" cudaError_t gm_build_partition(void* d_temp_storage, size_t* temp_storage_bytes, const int32_t* d_coords,
                                          const int32_t* d_token_window, int32_t num_tokens,
                                          const int32_t* d_window_sizes, int32_t num_windows,
                                          const int32_t* d_window_group, const int32_t* d_window_slot_offset,
                                          int32_t group_size, int32_t num_groups, int32_t* d_gather,
                                          int32_t* d_scatter, int32_t* d_slot_window, int32_t* d_slot_coord,
                                          cudaStream_t stream) {
  return no_throw([&]() -> cudaError_t {
    clear_refusal();
    GM_REFUSE_IF(temp_storage_bytes == nullptr, "temp_storage_bytes is null");
    GM_REFUSE_IF(num_tokens < 0 || num_windows < 0 || num_groups < 0, "counts must be >= 0");
    GM_REFUSE_IF(group_size < 1, "group_size must be >= 1");
    const std::int64_t slots = static_cast<std::int64_t>(group_size) * num_groups;
    GM_REFUSE_IF(slots > 0x7fffffff, "num_groups * group_size overflows int32");
    // temporary storage: offsets [nw], sorted keys [N], values in [N], values out [N], CUB scratch
    std::size_t scan_bytes = 0, sort_bytes = 0;
    GM_TRY(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, d_window_sizes, static_cast<index_t*>(nullptr),
                                         num_windows, stream));
    // Keys sorted as UNSIGNED: a token outside every window (id -1, or any negative id) sorts after
    // all real windows, so it cannot shift the ranks that window_offsets (the scan of the window
    // sizes, which never count it) assign to real tokens.
    const auto* keys_in = reinterpret_cast<const std::uint32_t*>(d_token_window);
    GM_TRY(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys_in, static_cast<std::uint32_t*>(nullptr),
                                           static_cast<const index_t*>(nullptr), static_cast<index_t*>(nullptr),
                                           num_tokens, 0, 32, stream));
    const std::size_t off_bytes = align_up(static_cast<std::size_t>(num_windows) * sizeof(index_t) + 1);
    const std::size_t n_bytes = align_up(static_cast<std::size_t>(num_tokens) * sizeof(index_t) + 1);
    const std::size_t cub_bytes = align_up(scan_bytes > sort_bytes ? scan_bytes : sort_bytes);
    const std::size_t total = off_bytes + 3 * n_bytes + cub_bytes;
    if (d_temp_storage == nullptr) {
      *temp_storage_bytes = total;
      return cudaSuccess;
    }
    GM_REFUSE_IF(*temp_storage_bytes < total, "temporary storage too small");
    GM_REFUSE_IF(reinterpret_cast<std::uintptr_t>(d_temp_storage) % tmp_align != 0, "temporary storage must be 256-byte aligned");
    GM_REFUSE_IF(slots > 0 && (d_gather == nullptr || d_slot_window == nullptr || d_slot_coord == nullptr),
                 "null partition output");
    GM_REFUSE_IF(num_tokens > 0 && (d_scatter == nullptr || d_coords == nullptr || d_token_window == nullptr),
                 "null token array");
    GM_REFUSE_IF(num_windows > 0 && (d_window_sizes == nullptr || d_window_group == nullptr || d_window_slot_offset == nullptr),
                 "null window array");
    GM_REFUSE_IF(!aligned4(d_coords) || !aligned4(d_token_window) || !aligned4(d_window_sizes) ||
                     !aligned4(d_window_group) || !aligned4(d_window_slot_offset) || !aligned4(d_gather) ||
                     !aligned4(d_scatter) || !aligned4(d_slot_window) || !aligned4(d_slot_coord),
                 "int32 arrays must be 4-byte aligned");
    char* base = static_cast<char*>(d_temp_storage);
    index_t* offsets = reinterpret_cast<index_t*>(base);
    index_t* keys_out = reinterpret_cast<index_t*>(base + off_bytes);
    index_t* vals_in = reinterpret_cast<index_t*>(base + off_bytes + n_bytes);
    index_t* vals_out = reinterpret_cast<index_t*>(base + off_bytes + 2 * n_bytes);
    void* cub_tmp = base + off_bytes + 3 * n_bytes;

    GM_TRY(launch(fill_padding_kernel, blocks_for(slots > num_tokens ? slots : num_tokens), 256, 0, stream, d_gather,
                  d_slot_window, d_slot_coord, static_cast<int>(slots), d_scatter, num_tokens));
    if (num_tokens == 0 || num_windows == 0) return cudaSuccess;
    std::size_t bytes = scan_bytes;
    GM_TRY(cub::DeviceScan::ExclusiveSum(cub_tmp, bytes, d_window_sizes, offsets, num_windows, stream));
    GM_TRY(cudaGetLastError());
    GM_TRY(launch(iota_kernel, blocks_for(num_tokens), 256, 0, stream, vals_in, num_tokens));
    bytes = sort_bytes;
    GM_TRY(cub::DeviceRadixSort::SortPairs(cub_tmp, bytes, keys_in, reinterpret_cast<std::uint32_t*>(keys_out), vals_in,
                                           vals_out, num_tokens, 0, 32, stream));
    GM_TRY(cudaGetLastError());
    return launch(place_tokens_kernel, blocks_for(num_tokens), 256, 0, stream, keys_out, vals_out, offsets, d_coords,
                  d_window_group, d_window_slot_offset, num_tokens, num_windows, group_size, num_groups, d_gather,
                  d_scatter, d_slot_window, d_slot_coord);
  });
}
