//! \file conv_split.hpp
//! Private host arithmetic of the convolution kernels' deterministic reductions, tested on the host
//! (test/gpu/test_depthwise_conv_gpu.cpp, test_block_conv_gpu.cpp): how the depthwise backward cuts (tokens x samples) into the
//! pieces whose dweight/dbias partials a second kernel sums in a fixed order, and how the block
//! conv's GEMMs split their reduction axis (split-K, partials summed in split order). Both cuts
//! depend on the shapes only, never on the device, so results are bitwise the same on every GPU.
#pragma once

#include <cstdint>

namespace greenmim {
namespace detail {
namespace cuda {

//! Pieces of the depthwise dweight/dbias reduction: `tile` tokens x `chunk` samples each,
//! `tiles` x `chunks` of them (grid.y x grid.z of the partial kernel).
struct dw_grad_split {
  int tile = 0, chunk = 0, tiles = 0, chunks = 0;
  std::int64_t parts() const { return static_cast<std::int64_t>(tiles) * chunks; }
};

//! At most this many partial floats per channel (x 10 per part: 9 taps and the bias), so the
//! workspace stays <= 10 * 4 * k_dw_max_part_floats bytes = 40 MiB whatever the shape.
constexpr std::int64_t k_dw_max_part_floats = std::int64_t(1) << 20;

//! Channel groups per CTA of the depthwise kernels, at most (dw_block_groups in dw_weights.cuh).
constexpr int k_dw_max_groups = 32;

//! The dweight kernel's CTAs for one piece: its channel blocks, pairs of channels in blocks of up
//! to k_dw_max_groups (from C alone, whatever the path's vector width).
inline std::int64_t dw_grad_channel_blocks(std::int64_t channels) {
  const std::int64_t pairs = (channels + 1) / 2, gb = pairs < k_dw_max_groups ? pairs : k_dw_max_groups;
  return (pairs + gb - 1) / gb;
}

//! The cut aims at about this many CTAs of the dweight kernel (pieces x channel blocks): one wave
//! at 3 CTAs per SM on an H100 (80 registers, 256 threads). On an H100 at Twins-L's shapes
//! (docs/perf/NVIDIA_H100_80GB_HBM3_2026-11-26g/, call 5) the kernel was fastest with 256-400 CTAs
//! and up to 2x slower with 1536-3072 (more pieces than work) or 96-192 (too few CTAs). A constant,
//! not the device's SM count, so that the cut, and the sums' bits, are the same on every GPU.
constexpr std::int64_t k_dw_grad_target_ctas = 384;

//! Pieces of 32 tokens x 1 sample, doubled (samples up to 8 first, then tokens; samples again once
//! one tile holds every token) while the CTAs are more than 10% above k_dw_grad_target_ctas, the
//! pieces times C above k_dw_max_part_floats, or a grid extent above 65535. A function of the
//! shapes only. Requires tokens, batch, channels >= 1.
inline dw_grad_split dw_grad_split_for(std::int64_t tokens, std::int64_t batch, std::int64_t channels) {
  const std::int64_t cap = k_dw_max_part_floats / channels > 0 ? k_dw_max_part_floats / channels : 1;
  const std::int64_t cb = dw_grad_channel_blocks(channels);
  std::int64_t tile = 32, chunk = 1;
  for (;;) {
    const std::int64_t tiles = (tokens + tile - 1) / tile, chunks = (batch + chunk - 1) / chunk;
    const std::int64_t parts = tiles * chunks;
    // parts x cb CTAs at most 10% above the target (no product: parts may be near 2^57); where one
    // piece's channel blocks alone pass it, any cut is few enough
    const std::int64_t limit = k_dw_grad_target_ctas * 11 / 10;
    const bool few = cb >= limit || parts <= limit / cb;
    if ((few && parts <= cap && tiles <= 65535 && chunks <= 65535) || (tiles == 1 && chunks == 1)) {
      dw_grad_split s;
      s.tile = static_cast<int>(tile < tokens ? tile : tokens);
      s.chunk = static_cast<int>(chunk < batch ? chunk : batch);
      s.tiles = static_cast<int>(tiles);
      s.chunks = static_cast<int>(chunks);
      return s;
    }
    if ((chunk < 8 && chunks > 1) || tiles == 1) chunk *= 2;
    else tile *= 2;
  }
}

//! The grid of the depthwise forward / dx kernel (dw_apply). Its work items are (token tile,
//! sample) pairs, `tiles` x `batch` for each of `cblocks` channel blocks. Each CTA takes several
//! items where there are many CTAs, so that its fixed cost (the block's weights staged and held in
//! registers) is spread: at least k_dw_apply_min_ctas CTAs stay (or one per item), at most 8 items
//! per CTA unless grid.z would pass 65535. Samples are shared first (a CTA's samples reuse its
//! neighbour indices), then consecutive tiles (a packed per-sample batch has B = 1 and all its
//! tokens on one axis). Shapes only. Requires tiles, cblocks, batch >= 1. The minimum of 256 CTAs
//! (was 1024): on an H100 (docs/perf/NVIDIA_H100_80GB_HBM3_2026-11-26f/), 8 samples per CTA ran
//! Twins-L's PEG forward at stages 2-4 1.19-1.36x faster, stage 1 the same. On an H100
//! (docs/perf/NVIDIA_H100_80GB_HBM3_2026-11-27/, calls 4-5) 256 and 8 beat every other pair tried
//! (528-1056 CTAs, 1.2-1.35x slower: a CTA's consecutive tiles keep a token's neighbours in its
//! L1; 64-128 CTAs or 16-32 items, slower but at one shape), though 384 CTAs fill 0.73 waves.
constexpr std::int64_t k_dw_apply_min_ctas = 256;
struct dw_apply_split {
  int tiles_per_cta = 1;
  std::int64_t grid_x = 1;  //!< CTA x takes tiles [x * tiles_per_cta, + tiles_per_cta)
  int grid_z = 1;           //!< CTA z takes samples z, z + grid_z, ...
};
inline dw_apply_split dw_apply_split_for(std::int64_t tiles, std::int64_t cblocks, std::int64_t batch) {
  constexpr std::int64_t cap = 8 * k_dw_apply_min_ctas;  // items at which per reaches 8 (no overflow)
  const std::int64_t tc = tiles * cblocks < cap ? tiles * cblocks : cap, bc = batch < cap ? batch : cap;
  std::int64_t per = tc * bc / k_dw_apply_min_ctas;
  per = per < 1 ? 1 : per > 8 ? 8 : per;
  const std::int64_t pb = per < batch ? per : batch, pt = per / pb;
  dw_apply_split s;
  s.tiles_per_cta = static_cast<int>(pt);
  s.grid_x = (tiles + pt - 1) / pt;
  const std::int64_t z = (batch + pb - 1) / pb;
  s.grid_z = static_cast<int>(z < 65535 ? z : 65535);
  return s;
}

//! dw_apply's token rows per block that walk (a multiple of 8: whole groups of 8 x 8 tokens).
inline std::int64_t dw_walk_rows(std::int64_t rows) { return rows / 8 * 8; }

//! dw_apply walks runs of 8 tokens, keeping rows across them, where the walk still gives the GPU
//! at least this many (tile, channel block, sample) items: a tile of a walking block has 8 times
//! the tokens of one that does not, so small stages (Twins-L's 3 and 4 per-sample: 96 and 48
//! items) would run on a fraction of the SMs. About one CTA per SM of an H100; unmeasured
//! (bench/gpu/ab/peg_run_ab.cu times both ways at every stage).
constexpr std::int64_t k_dw_walk_min_items = 128;

//! Whether dw_apply walks (8 tokens a thread, rows kept) or takes one token a thread, for `tokens`
//! tokens a sample, `rows` token rows per block, `cblocks` channel blocks and `batch` samples: it
//! walks where its tiles (dw_walk_rows(rows) * 8 tokens) make at least k_dw_walk_min_items
//! (tile, channel block, sample) items and pad the tokens by at most a quarter (the tiles cover at
//! most 1.25 times the tokens; only a sample of 4 tiles or fewer can fail that).
//! Shapes only (the bits are the same either way). Requires tokens, rows, cblocks, batch >= 1.
inline bool dw_apply_walks(std::int64_t tokens, std::int64_t rows, std::int64_t cblocks, std::int64_t batch) {
  const std::int64_t tile = dw_walk_rows(rows) * 8;
  if (tile == 0) return false;
  const std::int64_t tiles = (tokens + tile - 1) / tile;
  // items = tiles * cblocks * batch >= cap, without overflow: below the cap, tiles * c * b < 2^21
  const std::int64_t cap = k_dw_walk_min_items, c = cblocks < cap ? cblocks : cap, b = batch < cap ? batch : cap;
  const bool enough = tiles >= cap || tiles * c * b >= cap;
  return enough && (tiles * tile - tokens) * 4 <= tokens;
}

//! Whether dw_apply can hold its taps' element offsets within a sample as int32: every row start
//! `s * row_stride` (s < tokens) plus the channels stays below 2^31. Strides are non-negative
//! (check_tensor). The 32-bit path saves a register and two integer instructions per tap (its
//! address is one wide multiply-add onto the sample's base).
inline bool dw_offsets_fit_int32(std::int64_t tokens, std::int64_t row_stride, std::int64_t channels) {
  constexpr std::int64_t lim = 0x7fffffff;
  if (tokens <= 0 || row_stride < 0 || channels < 0 || channels > lim) return false;
  return row_stride == 0 || tokens - 1 <= (lim - channels) / row_stride;
}

//! The block conv's gather-GEMM tile (block_conv.cu): 64 x 64 outputs, 16-deep reduction steps.
constexpr int k_gemm_bm = 64, k_gemm_bn = 64, k_gemm_bk = 16;
//! Split-K aims at this many CTAs (a few waves on today's largest GPUs; a constant, not the
//! device's SM count, so the split is the same everywhere) ...
constexpr std::int64_t k_gemm_target_ctas = 1024;
//! ... with at least this much of the reduction per split ...
constexpr std::int64_t k_gemm_min_k_per_split = 128;
//! ... and at most this many partial floats in all (a 64 MiB workspace) ...
constexpr std::int64_t k_gemm_max_partial_floats = std::int64_t(1) << 24;
//! ... but none where there are this many output tiles or more: an empirical threshold (about
//! four CTAs per SM of today's largest GPUs, though a 4-warp tensor-core CTA fits up to 7), above
//! which the partials (4 bytes per output and split, written, then read back by a second kernel)
//! cost more than the extra CTAs bring. Twins-L's patch embedding at stage 1 (batch 64, 25%
//! visible: 768 tiles, K = 512) was split in 2, its 25 MB of partials larger than its operands;
//! unsplit, its forward ran 1.46x faster (H200, 2026-11-26e). The rule decides the forward's,
//! dx's and dweight's splits alike.
constexpr std::int64_t k_gemm_wave_tiles = 512;

//! Split-K of one C[M, N] = A[M, K] B[K, N]: `splits` CTAs along K (grid.z), each `k_per`
//! (a multiple of k_gemm_bk) of the reduction; splits == 1: no partials, outputs stored directly.
struct gemm_split {
  int splits = 1, k_per = 0;
  //! Partial floats the split needs (0 when it stores directly).
  std::int64_t partial_floats(std::int64_t M, std::int64_t N) const { return splits > 1 ? splits * M * N : 0; }
};

//! Requires M, N, K >= 0 and M, N, K < 2^31. Every split is non-empty.
inline gemm_split gemm_split_for(std::int64_t M, std::int64_t N, std::int64_t K) {
  gemm_split s;
  s.k_per = static_cast<int>(K);
  if (M == 0 || N == 0 || K == 0) return s;
  const std::int64_t tiles = ((M + k_gemm_bm - 1) / k_gemm_bm) * ((N + k_gemm_bn - 1) / k_gemm_bn);
  if (tiles >= k_gemm_wave_tiles) return s;
  std::int64_t n = (k_gemm_target_ctas + tiles - 1) / tiles;
  const std::int64_t by_k = (K + k_gemm_min_k_per_split - 1) / k_gemm_min_k_per_split;
  if (n > by_k) n = by_k;
  const std::int64_t by_space = k_gemm_max_partial_floats / (M * N);
  if (n > by_space) n = by_space;
  if (n > 65535) n = 65535;
  if (n < 2) return s;
  std::int64_t per = (K + n - 1) / n;
  per = (per + k_gemm_bk - 1) / k_gemm_bk * k_gemm_bk;
  s.splits = static_cast<int>((K + per - 1) / per);
  s.k_per = static_cast<int>(per);
  return s;
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
