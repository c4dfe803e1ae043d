//! \file dw_weights.cuh
//! Private: the depthwise conv kernels' shapes and weight layout (depthwise_conv.cu). A block of
//! the forward / dx kernel (dw_apply.cuh) stages its channels' weights and bias in shared memory,
//! tap-major, so that a thread reads its V channels' weights of one tap as 16-byte loads rather
//! than hold (taps x V) of them in registers (126 and 119 registers, 1.1-2x slower, twice:
//! docs/sparse-conv.md). The layout is written for any tap count `Taps` (k x k for an odd k) and
//! G channel groups per block: PEG's 3 x 3 kernels (dw_apply.cuh) use Taps = k_dw_taps and
//! G = k_dw_max_groups; the k x k kernels (dw_taps.cuh) Taps = 49 (k <= 7, the weights staged
//! with a runtime row stride k * k) and G = 16.
#pragma once

#include <cstdint>

#include "conv_split.hpp"
#include "device_common.cuh"

namespace greenmim {
namespace detail {
namespace cuda {

constexpr int k_dw_taps = 9;          //!< PEG's 3 x 3, the one kernel size instantiated
constexpr int k_dw_threads = 256;     //!< threads of dw_apply and dw_grad_partial
constexpr int k_dw_red_threads = 256;  //!< threads of dw_grad_reduce

//! Channel groups per block for `groups` groups of channels: all of them up to 32.
inline int dw_block_groups(int groups) { return groups < k_dw_max_groups ? groups : k_dw_max_groups; }

//! A block's weights in shared memory: [tap][ws_slot<V, G>(channel in block)], the bias as row
//! Taps; G channel groups of up to 8 per block (the 3x3 kernels: k_dw_max_groups; the k x k ones,
//! dw_taps.cuh, fewer, so that 49 taps fit in 48 KiB).
template <int Taps, int G = k_dw_max_groups>
using dw_weight_smem = float[Taps + 1][G * 8];

//! Where the block's channel `cl` (group cl / V, element cl % V) keeps a tap's weight in
//! dw_apply's ws[tap][.]. V = 8: a group's two 4-float halves lie 4 * G floats apart, so a
//! quarter warp's 16-byte reads of consecutive groups are 128 contiguous bytes, free of bank
//! conflicts (the plain [group][8] layout made every read a 2-way conflict).
template <int V, int G = k_dw_max_groups>
__device__ __forceinline__ int ws_slot(int cl) {
  if constexpr (V == 8) return ((cl & 7) >> 2) * (G * 4) + (cl >> 3) * 4 + (cl & 3);
  else return cl;
}

//! The block's weights, read contiguously ([C, Taps] rows of channels [c_first, + cw), PyTorch's
//! layout), stored tap-major, and the bias as row Taps; channels past `channels` (and the bias
//! where `bias` is null) as zero. Every thread of the block calls it (Threads of them); the caller
//! syncs before reading.
template <int Taps, int V, int Threads>
__device__ __forceinline__ void dw_stage_weights(dw_weight_smem<Taps>& ws, const float* w, const float* bias,
                                                 int c_first, int cw, int channels) {
  for (int i = static_cast<int>(threadIdx.x); i < Taps * cw; i += Threads) {
    const int cl = i / Taps, o = i % Taps;
    ws[o][ws_slot<V>(cl)] = c_first + cl < channels ? __ldg(w + static_cast<std::int64_t>(c_first) * Taps + i) : 0.f;
  }
  for (int cl = static_cast<int>(threadIdx.x); cl < cw; cl += Threads)
    ws[Taps][ws_slot<V>(cl)] = bias && c_first + cl < channels ? __ldg(bias + c_first + cl) : 0.f;
}

//! Tap o's (o = Taps: the bias) V weights of the block's channel group gl.
template <int Taps, int V, int G = k_dw_max_groups>
__device__ __forceinline__ void dw_tap_weights(const dw_weight_smem<Taps, G>& ws, int o, int gl, float (&w)[V]) {
  if constexpr (V == 8) {  // the group's halves, ws_slot<8, G>
    const float4 lo = *reinterpret_cast<const float4*>(&ws[o][gl * 4]);
    const float4 hi = *reinterpret_cast<const float4*>(&ws[o][G * 4 + gl * 4]);
    w[0] = lo.x; w[1] = lo.y; w[2] = lo.z; w[3] = lo.w; w[4] = hi.x; w[5] = hi.y; w[6] = hi.z; w[7] = hi.w;
  } else {
#pragma unroll
    for (int v = 0; v < V; ++v) w[v] = ws[o][ws_slot<V, G>(gl * V + v)];
  }
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
