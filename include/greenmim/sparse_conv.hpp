//! \file sparse_conv.hpp
//! Index tables for convolutions on visible tokens (the paper's "Incorporating with Sparse
//! Convolution"; Twins' PEG, GSA sub-sampling and patch embedding).
//!
//! Two kinds of convolution, two tables, both built on the host by direct indexing into a dense
//! `height x width` position map (no hashing), in O(height * width + N * k^2):
//!
//! 1. Submanifold k x k (k odd, stride 1, dilation 1, padding k/2): outputs at exactly the
//!    visible tokens, inputs read from visible tokens only (masked and outside sites are zero).
//!    `neighbor_table` [N, k*k]: entry (t, o) is the token index of the visible neighbour of
//!    token t at stencil offset o, or `pad_index` (-1) when that site is masked or outside the
//!    image. Offsets are row-major over the stencil: o = (dh + r) * k + (dw + r), r = k / 2,
//!    which is the order of a dense weight `[C_out, C_in, k, k]` flattened over (kh, kw); the
//!    convolution is PyTorch's cross-correlation, `y(p) = sum_o W[:, :, o] x(p + offset(o))`.
//!
//!    The backward's dx needs the transposed table: for input token s and offset o, the output
//!    token u that reads s at offset o (nbr[u, o] == s). For the submanifold case outputs and
//!    inputs are the same token set and the stencil is symmetric, so u sits at
//!    pos(s) - offset(o) = pos(s) + offset(k*k - 1 - o): the transposed table is the table itself
//!    with mirrored offsets, `nbr_t[s, o] == nbr[s, mirror_offset(k, o)]`
//!    (`transpose_neighbor_table` builds it generically, and the tests prove the identity). A
//!    kernel's dx therefore reads the forward table with mirrored offsets and needs no second
//!    table: `dx[s] = sum_o W[o] * dy[nbr[s, k*k-1-o]]`.
//!
//! 2. Block conv, kernel = stride = s (GSA sub-sampling with s = sr, patch embedding with
//!    s = 2): output (bh, bw) reads the s x s inputs (s*bh + i, s*bw + j). With a mask unit that
//!    is a multiple of s tokens every block is wholly visible or wholly masked, and the conv is
//!    exactly a gather of whole blocks then a GEMM (generalised patch merging). `block_table`
//!    [N_next, s*s]: entry (n, i*s + j) is the token index of input (s*bh + i, s*bw + j) of
//!    output n, i.e. row-major within the block (NOT Swin's merging order, see merging.hpp).
//!    Gathering `x[block[n, p], c]` into row n, column p*C_in + c (position-major, channel
//!    minor) gives the im2col matrix A [N_next, s*s*C_in]; the dense weight
//!    `W[C_out, C_in, s, s]` enters as `W.permute(0, 2, 3, 1).reshape(C_out, s*s*C_in)` =: W',
//!    and `y = A W'^T + bias`. Outputs (the next stage's visible tokens) come in row-major order
//!    of the block grid. Which output cells exist is the builder's `block_rule`:
//!    `block_rule::whole` (the default) keeps the wholly visible blocks and refuses a partly
//!    visible one with `status::misaligned` (it is never merged wrongly); `block_rule::any` keeps
//!    every block with at least one visible input, spconv's rule for a strided sparse conv, and
//!    marks its masked inputs `pad_index` (they read as zero: the output equals the dense conv
//!    over the zero-filled grid at that cell). With a mask unit that is a multiple of s the two
//!    rules give the same table. The grid must be divisible by s (Twins-L at 224 px: 56/8,
//!    28/4, 14/2, all exact).
//!
//! Token axes as everywhere in greenmim: one shared mask (token t = `coords[t]`, the same table
//! serves every sample of a batch), or the per-sample flat layout (`cu_seqlens`; sample b owns
//! tokens [cu[b], cu[b+1]) and neighbours / blocks never cross samples).
//!
//! Every builder writes into temporaries and swaps them into its outputs on success only.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "config.hpp"
#include "geometry.hpp"
#include "partition.hpp"
#include "status.hpp"
#include "view.hpp"

namespace greenmim {

// ---- index math shared by the CPU reference and the kernels ------------------------------------

//! Row offset dh in [-k/2, k/2] of stencil offset o of a k x k stencil (o row-major).
GREENMIM_HOST_DEVICE constexpr index_t stencil_dh(index_t k, index_t o) { return o / k - k / 2; }
//! Column offset dw in [-k/2, k/2] of stencil offset o.
GREENMIM_HOST_DEVICE constexpr index_t stencil_dw(index_t k, index_t o) { return o % k - k / 2; }
//! Stencil offset of (dh, dw): (dh + k/2) * k + (dw + k/2).
GREENMIM_HOST_DEVICE constexpr index_t stencil_offset(index_t k, index_t dh, index_t dw) {
  return (dh + k / 2) * k + (dw + k / 2);
}
//! The offset pointing the other way: (-dh, -dw), i.e. k*k - 1 - o. The transposed submanifold
//! table is the table read at mirrored offsets.
GREENMIM_HOST_DEVICE constexpr index_t mirror_offset(index_t k, index_t o) { return k * k - 1 - o; }
//! Input (h, w) of position p = i*s + j of output block (bh, bw) of a kernel = stride = s conv.
GREENMIM_HOST_DEVICE constexpr index_t block_h(index_t s, index_t bh, index_t p) { return s * bh + p / s; }
GREENMIM_HOST_DEVICE constexpr index_t block_w(index_t s, index_t bw, index_t p) { return s * bw + p % s; }

// ---- tables ------------------------------------------------------------------------------------

//! Which output cells of a kernel = stride block conv exist (see the file comment).
enum class block_rule : std::uint8_t {
  whole,  //!< wholly visible blocks only; a partly visible block is refused (`status::misaligned`)
  any,    //!< every block with a visible input (spconv); its masked inputs are `pad_index` (zero)
};

//! Submanifold neighbour table (see the file comment). `nbr[t * taps() + o]`.
struct neighbor_table {
  index_t kernel = 3;             //!< k (odd)
  index_t num_tokens = 0;         //!< N
  std::vector<index_t> nbr;       //!< [N, k*k] neighbour token or pad_index

  index_t taps() const { return kernel * kernel; }
  //! Neighbour of token t at offset o, or pad_index. Precondition: indices in range.
  index_t at(index_t t, index_t o) const { return nbr[static_cast<size_t>(t) * taps() + o]; }
};

//! Block-conv table (see the file comment). `gather[n * s*s + p]`.
struct block_table {
  index_t stride = 2;                   //!< s (= kernel)
  index_t num_inputs = 0;               //!< N of the input token axis
  std::vector<index_t> gather;          //!< [N_next, s*s] input token of each block position
  std::vector<index_t> next_coords;     //!< [N_next] packed block coordinates, row-major per sample
  std::vector<index_t> next_cu_seqlens; //!< [B+1] per-sample layout; {0, N_next} for a shared mask

  index_t num_outputs() const { return static_cast<index_t>(next_coords.size()); }
  index_t positions() const { return stride * stride; }
};

namespace detail {

inline status check_conv_grid(index_t height, index_t width) {
  if (height <= 0 || width <= 0 || height > 32767 || width > 32767) return status::invalid_argument;
  return status::success;
}

inline status check_cu_seqlens(span<const index_t> cu, std::int64_t n) {
  if (cu.size() < 1) return status::shape_mismatch;
  const std::int64_t batch = cu.size() - 1;
  if (cu[0] != 0 || cu[batch] != n) return status::shape_mismatch;
  for (std::int64_t b = 0; b < batch; ++b)
    if (cu[b + 1] < cu[b]) return status::shape_mismatch;
  return status::success;
}

//! Writes first + i into grid cell of coords[i]; on failure restores what it wrote. Returns the
//! status; `placed` = number of cells written (to restore later).
inline status place_tokens(index_t height, index_t width, span<const index_t> coords, index_t first,
                           std::vector<index_t>& grid, std::int64_t& placed) {
  for (placed = 0; placed < coords.size(); ++placed) {
    const index_t c = coords[placed];
    const index_t h = coord_h(c), w = coord_w(c);
    if (c < 0 || h >= height || w >= width) return status::out_of_range;
    index_t& cell = grid[static_cast<std::int64_t>(h) * width + w];
    if (cell != pad_index) return status::invalid_argument;  // two tokens at one coordinate
    cell = first + static_cast<index_t>(placed);
  }
  return status::success;
}

inline void clear_tokens(index_t width, span<const index_t> coords, std::int64_t placed, std::vector<index_t>& grid) {
  for (std::int64_t i = 0; i < placed; ++i)
    grid[static_cast<std::int64_t>(coord_h(coords[i])) * width + coord_w(coords[i])] = pad_index;
}

//! Neighbour rows of one sample (tokens first + i), written into out[(first + i) * k*k + o].
inline status neighbors_one(index_t height, index_t width, index_t k, span<const index_t> coords, index_t first,
                            std::vector<index_t>& grid, index_t* out) {
  std::int64_t placed = 0;
  status st = place_tokens(height, width, coords, first, grid, placed);
  if (st == status::success) {
    const index_t r = k / 2, taps = k * k;
    for (std::int64_t i = 0; i < coords.size(); ++i) {
      const index_t h = coord_h(coords[i]), w = coord_w(coords[i]);
      index_t* row = out + (first + i) * static_cast<std::int64_t>(taps);
      if (h >= r && h < height - r && w >= r && w < width - r) {  // interior: no bounds tests
        const index_t* g = grid.data() + static_cast<std::int64_t>(h - r) * width + (w - r);
        for (index_t a = 0; a < k; ++a, g += width)
          for (index_t b = 0; b < k; ++b) *row++ = g[b];
      } else {
        for (index_t o = 0; o < taps; ++o) {
          const index_t hh = h + stencil_dh(k, o), ww = w + stencil_dw(k, o);
          row[o] = (hh >= 0 && hh < height && ww >= 0 && ww < width)
                       ? grid[static_cast<std::int64_t>(hh) * width + ww]
                       : pad_index;
        }
      }
    }
  }
  clear_tokens(width, coords, placed, grid);
  return st;
}

//! Blocks of one sample; appends to gather/next. `count` is scratch of (height/s)*(width/s)
//! entries, all 0 on entry and on return: visible tokens per block, so a block is read only when
//! it has a visible token and the partly visible ones are found in O(N + blocks). Under
//! `block_rule::whole` a partly visible block fails with `misaligned`; under `block_rule::any` it
//! is read like a whole one (its masked cells hold `pad_index`).
inline status blocks_one(index_t height, index_t width, index_t s, span<const index_t> coords, index_t first,
                         std::vector<index_t>& grid, std::vector<index_t>& count, std::vector<index_t>& gather,
                         std::vector<index_t>& next, block_rule rule) {
  std::int64_t placed = 0;
  status st = place_tokens(height, width, coords, first, grid, placed);
  const index_t bw_n = width / s, ss = s * s;
  for (std::int64_t i = 0; i < placed; ++i) ++count[(coord_h(coords[i]) / s) * bw_n + coord_w(coords[i]) / s];
  if (st == status::success) {
    for (index_t bh = 0; bh < height / s && st == status::success; ++bh)
      for (index_t bw = 0; bw < bw_n; ++bw) {
        const index_t c = count[bh * bw_n + bw];
        if (c == 0) continue;
        if (c != ss && rule == block_rule::whole) { st = status::misaligned; break; }
        for (index_t i = 0; i < s; ++i) {
          const index_t* row = grid.data() + static_cast<std::int64_t>(s * bh + i) * width + s * bw;
          gather.insert(gather.end(), row, row + s);
        }
        next.push_back(pack_coord(bh, bw));
      }
  }
  for (std::int64_t i = 0; i < placed; ++i) count[(coord_h(coords[i]) / s) * bw_n + coord_w(coords[i]) / s] = 0;
  clear_tokens(width, coords, placed, grid);
  return st;
}

inline status check_block_args(index_t height, index_t width, index_t s) {
  if (status st = check_conv_grid(height, width); st != status::success) return st;
  if (s <= 0 || s > 64 || height % s != 0 || width % s != 0) return status::invalid_argument;
  return status::success;
}

}  // namespace detail

//! Submanifold neighbour table of one token set (shared mask) on a `height x width` grid:
//! token t = `coords[t]` (packed, any order). `kernel` odd in [1, 15]. Fails with
//! `invalid_argument` (bad grid or kernel, two tokens at one coordinate), `out_of_range`
//! (coordinate outside the grid), `overflow` (N * k*k does not fit index_t); `out` untouched on
//! failure. O(height * width + N * k^2).
inline status build_neighbor_table(index_t height, index_t width, index_t kernel, span<const index_t> coords,
                                   neighbor_table& out) {
  if (status s = detail::check_conv_grid(height, width); s != status::success) return s;
  if (kernel <= 0 || kernel % 2 == 0 || kernel > 15) return status::invalid_argument;
  if (!detail::fits_index(coords.size() * kernel * kernel)) return status::overflow;
  neighbor_table r;
  r.kernel = kernel;
  r.num_tokens = static_cast<index_t>(coords.size());
  r.nbr.resize(static_cast<size_t>(coords.size() * kernel * kernel));
  std::vector<index_t> grid(static_cast<size_t>(height) * width, pad_index);
  if (status s = detail::neighbors_one(height, width, kernel, coords, 0, grid, r.nbr.data()); s != status::success)
    return s;
  out = std::move(r);
  return status::success;
}

//! Per-sample flat layout: sample b owns tokens [cu_seqlens[b], cu_seqlens[b+1]) of `coords`,
//! each on its own `height x width` grid; neighbours never cross samples. `cu_seqlens` must start
//! at 0, be non-decreasing and end at `coords.size()` (`shape_mismatch`); other failures as
//! `build_neighbor_table`. O(B + height * width + N * k^2).
inline status build_neighbor_table_per_sample(index_t height, index_t width, index_t kernel,
                                              span<const index_t> cu_seqlens, span<const index_t> coords,
                                              neighbor_table& out) {
  if (status s = detail::check_conv_grid(height, width); s != status::success) return s;
  if (kernel <= 0 || kernel % 2 == 0 || kernel > 15) return status::invalid_argument;
  if (status s = detail::check_cu_seqlens(cu_seqlens, coords.size()); s != status::success) return s;
  if (!detail::fits_index(coords.size() * kernel * kernel)) return status::overflow;
  neighbor_table r;
  r.kernel = kernel;
  r.num_tokens = static_cast<index_t>(coords.size());
  r.nbr.resize(static_cast<size_t>(coords.size() * kernel * kernel));
  std::vector<index_t> grid(static_cast<size_t>(height) * width, pad_index);
  for (std::int64_t b = 0; b + 1 < cu_seqlens.size(); ++b) {
    const span<const index_t> sample = coords.subspan(cu_seqlens[b], cu_seqlens[b + 1] - cu_seqlens[b]);
    if (status s = detail::neighbors_one(height, width, kernel, sample, cu_seqlens[b], grid, r.nbr.data());
        s != status::success)
      return s;
  }
  out = std::move(r);
  return status::success;
}

//! Generic transpose of a neighbour table: `out.nbr[s, o] = u` for the (unique) output u with
//! `in.nbr[u, o] == s`, pad_index when no output reads s at offset o. For a submanifold table
//! this equals the table read at `mirror_offset` (what kernels use); this builder exists to state
//! and test that identity. Fails with `out_of_range` (an entry outside [-1, N)),
//! `invalid_argument` (two outputs read one input at the same offset: not a submanifold table),
//! `shape_mismatch` (nbr size). O(N * k^2).
inline status transpose_neighbor_table(const neighbor_table& in, neighbor_table& out) {
  const std::int64_t taps = static_cast<std::int64_t>(in.kernel) * in.kernel;
  if (in.kernel <= 0 || static_cast<std::int64_t>(in.nbr.size()) != taps * in.num_tokens) return status::shape_mismatch;
  neighbor_table r;
  r.kernel = in.kernel;
  r.num_tokens = in.num_tokens;
  r.nbr.assign(in.nbr.size(), pad_index);
  for (index_t u = 0; u < in.num_tokens; ++u)
    for (index_t o = 0; o < taps; ++o) {
      const index_t s = in.nbr[u * taps + o];
      if (s == pad_index) continue;
      if (s < 0 || s >= in.num_tokens) return status::out_of_range;
      index_t& cell = r.nbr[s * taps + o];
      if (cell != pad_index) return status::invalid_argument;
      cell = u;
    }
  out = std::move(r);
  return status::success;
}

//! Block table of one token set (shared mask): kernel = stride = `s`, grid divisible by s.
//! Fails with `invalid_argument` (bad grid, s outside [1, 64] or not dividing the grid, two
//! tokens at one coordinate), `out_of_range`, `misaligned` (a block partly visible under
//! `block_rule::whole`), `overflow`; `out` untouched on failure. Every visible token lands in
//! exactly one block (with `block_rule::whole`, when the token set is aligned to s). Under
//! `block_rule::any` a partly visible block is an output whose masked inputs are `pad_index`.
//! O(height * width + N) (the scratch grid's fill; the work itself is O(N + blocks)).
inline status build_block_table(index_t height, index_t width, index_t s, span<const index_t> coords,
                                block_table& out, block_rule rule = block_rule::whole) {
  if (status st = detail::check_block_args(height, width, s); st != status::success) return st;
  if (!detail::fits_index(coords.size())) return status::overflow;
  block_table r;
  r.stride = s;
  r.num_inputs = static_cast<index_t>(coords.size());
  r.gather.reserve(static_cast<size_t>(coords.size()));
  r.next_coords.reserve(static_cast<size_t>(coords.size() / (s * s)));
  std::vector<index_t> grid(static_cast<size_t>(height) * width, pad_index);
  std::vector<index_t> count(static_cast<size_t>(height / s) * (width / s), 0);
  if (status st = detail::blocks_one(height, width, s, coords, 0, grid, count, r.gather, r.next_coords, rule);
      st != status::success)
    return st;
  r.next_cu_seqlens = {0, r.num_outputs()};
  out = std::move(r);
  return status::success;
}

//! Per-sample flat layout: as `build_block_table` per sample; `out.next_cu_seqlens` [B+1] and
//! `out.next_coords` describe the next stage's flat axis (sample-major, row-major within a
//! sample), `out.gather` indexes the input flat axis. `cu_seqlens` as in
//! `build_neighbor_table_per_sample`. O(B + height * width + N).
inline status build_block_table_per_sample(index_t height, index_t width, index_t s, span<const index_t> cu_seqlens,
                                           span<const index_t> coords, block_table& out,
                                           block_rule rule = block_rule::whole) {
  if (status st = detail::check_block_args(height, width, s); st != status::success) return st;
  if (status st = detail::check_cu_seqlens(cu_seqlens, coords.size()); st != status::success) return st;
  if (!detail::fits_index(coords.size())) return status::overflow;
  block_table r;
  r.stride = s;
  r.num_inputs = static_cast<index_t>(coords.size());
  r.gather.reserve(static_cast<size_t>(coords.size()));
  const std::int64_t batch = cu_seqlens.size() - 1;
  r.next_cu_seqlens.assign(static_cast<size_t>(batch) + 1, 0);
  std::vector<index_t> grid(static_cast<size_t>(height) * width, pad_index);
  std::vector<index_t> count(static_cast<size_t>(height / s) * (width / s), 0);
  for (std::int64_t b = 0; b < batch; ++b) {
    const span<const index_t> sample = coords.subspan(cu_seqlens[b], cu_seqlens[b + 1] - cu_seqlens[b]);
    if (status st =
            detail::blocks_one(height, width, s, sample, cu_seqlens[b], grid, count, r.gather, r.next_coords, rule);
        st != status::success)
      return st;
    r.next_cu_seqlens[b + 1] = r.num_outputs();
  }
  out = std::move(r);
  return status::success;
}

}  // namespace greenmim
