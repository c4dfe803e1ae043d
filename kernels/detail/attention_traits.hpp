//! \file attention_traits.hpp
//! Private, host and device: the tile shapes and shared-memory sizes of the attention kernels,
//! the one source for the kernels' layouts and the launchers' grids, checks and opt-ins.
#pragma once

#include <cstddef>
#include <cstdint>

#include <greenmim/config.hpp>
#include <greenmim/kernel_limits.h>

namespace greenmim {
namespace detail {
namespace cuda {

//! Dynamic shared memory a kernel may use without opting in (cudaFuncSetAttribute).
constexpr std::size_t k_default_smem_bytes = 48u * 1024u;
//! The most the backward opts in to: within sm_80's 163 KB and sm_90's 227 KB per block.
constexpr std::size_t k_max_smem_bytes = 160u * 1024u;
//! Slots per row tile (query or key rows of a CTA, or a staged tile of the other operand), in
//! every attention kernel; a group of G slots has tiles_of(G) of them.
constexpr int k_tile_rows = 64;
constexpr int tiles_of(int G) { return (G + k_tile_rows - 1) / k_tile_rows; }
//! Largest group of the one-pass tensor-core kernels (one tile); above it, up to
//! GM_MMA_MAX_GROUP, the tiled ones run.
constexpr int k_mma_one_pass_max_group = k_tile_rows;
constexpr int k_mma_max_group = GM_MMA_MAX_GROUP;

//! SIMT kernels: a row (slot) is owned by a team of D/16 lanes holding 16 elements each; 64 rows
//! per CTA; the other operand staged through shared memory as fp32, 64 rows at a time.
template <int D>
struct simt_tile {
  static_assert(D % 16 == 0 && D >= 16 && D <= 128, "head_dim must be a multiple of 16 in [16, 128]");
  static constexpr int E = 16;            // elements per lane
  static constexpr int TEAM = D / E;      // lanes per row
  static constexpr int ROWS = k_tile_rows;
  static constexpr int TILE = k_tile_rows;
  static constexpr int THREADS = ROWS * TEAM;
  static constexpr int WARPS = THREADS / 32;
  static constexpr int LD = D + 4;        // padded smem row (floats): conflict-free float4 reads
  //! Dynamic shared memory: two fp32 tiles, then the group's slot ids and coordinates, then the
  //! kernel's own part (per-warp d(bias) rows, or lse and delta of the staged tile).
  static constexpr std::size_t tiles = 2u * TILE * LD * sizeof(float);
  static constexpr std::size_t smem_fwd(int G) { return tiles + 2u * static_cast<std::size_t>(G) * sizeof(index_t); }
  static constexpr std::size_t smem_bwd_dq(int G, int dbias_rows) {
    return smem_fwd(G) + static_cast<std::size_t>(WARPS) * static_cast<std::size_t>(dbias_rows) * sizeof(float);
  }
  static constexpr std::size_t smem_bwd_dkdv(int G) { return smem_fwd(G) + 2u * TILE * sizeof(float); }
};

//! Tensor-core kernels: 4 warps of 16 rows each over a 64-slot tile; 16-bit rows padded by 16
//! bytes (ldmatrix without bank conflicts).
template <int D>
struct mma_tile {
  static_assert(D == 32 || D == 64, "tensor-core kernels: head_dim 32 or 64");
  static constexpr int ROWS = k_tile_rows;
  static constexpr int MAXG = k_mma_max_group;  // slot arrays of the tiled kernels
  static constexpr int THREADS = 128;
  static constexpr int WARPS = 4;
  static constexpr int LDS = D + 8;      // 16-bit rows of Q, K, V, dO
  static constexpr int LDP = ROWS + 8;   // 16-bit rows of P, dS (one-pass backward)
  static constexpr int LDF = ROWS + 1;   // fp32 rows of P / dS: conflict-free column reads
  static constexpr int CH = D * 2 / 16;  // 16-byte chunks per row
  static constexpr std::size_t tile_bytes = static_cast<std::size_t>(ROWS) * LDS * 2u;
  static constexpr std::size_t floats(int n) { return static_cast<std::size_t>(n) * sizeof(float); }

  //! One-pass forward: Q, K, V, slot ids and coordinates, the bias column.
  static constexpr std::size_t smem_fwd(int bias_rows) { return 3u * tile_bytes + 2u * ROWS * sizeof(index_t) + floats(bias_rows); }
  //! One-pass forward, `hpc` heads per CTA: as smem_fwd plus the per-lane mask codes (int16, 64
  //! keys x 64 rows) and one bias column per head.
  static constexpr int CODES = ROWS * ROWS;
  static constexpr std::size_t smem_fwd_heads(int bias_rows, int hpc) {
    return 3u * tile_bytes + CODES * sizeof(std::int16_t) + 2u * ROWS * sizeof(index_t) +
           static_cast<std::size_t>(hpc) * floats(bias_rows);
  }
  //! Tiled forward: Q, K, V tiles, the group's slot ids and coordinates, the bias column.
  static constexpr std::size_t smem_fwd_tiled(int bias_rows) {
    return 3u * tile_bytes + 2u * MAXG * sizeof(index_t) + floats(bias_rows);
  }

  //! One-pass backward: Q, K, V, dO and P, dS ([query][key], 16 bit) tiles, which the per-warp
  //! d(bias) table rows overlay once they are dead (a multiple of 16 bytes)...
  static constexpr std::size_t bwd_tiles = 4u * tile_bytes + 2u * ROWS * LDP * 2u;
  static constexpr std::size_t bwd_head(int bias_rows, bool dbias) {
    return dbias && WARPS * floats(bias_rows) > bwd_tiles ? WARPS * floats(bias_rows) : bwd_tiles;
  }
  //! ... then slot ids, coordinates, lse, delta, the bias column and, with d(bias), the fp32 dS
  //! tile. (D = 32, window 7, d(bias): 57,252 bytes.)
  static constexpr std::size_t smem_bwd(int bias_rows, bool dbias) {
    return bwd_head(bias_rows, dbias) + 4u * ROWS * 4u + floats(bias_rows) + (dbias ? floats(ROWS * LDF) : 0u);
  }
  //! Tiled backward: 4 tiles, the group's slot ids and coordinates, lse and delta of a tile, the
  //! bias column, an fp32 P / dS tile; the dq kernel adds one d(bias) table row per warp.
  static constexpr std::size_t smem_bwd_tiled(int bias_rows) {
    return 4u * tile_bytes + 2u * MAXG * 4u + 2u * ROWS * 4u + floats(bias_rows) + floats(ROWS * LDF);
  }
  static constexpr std::size_t smem_bwd_dq_tiled(int bias_rows, bool dbias) {
    return smem_bwd_tiled(bias_rows) + (dbias ? WARPS * floats(bias_rows) : 0u);
  }
};

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
