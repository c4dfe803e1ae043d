//! \file twins_plan.hpp
//! Everything a Twins-SVT encoder (alt_gvt) needs on the visible tokens of one mask (or one batch
//! of per-sample masks), built in one call into one arena of int32, as encoder_plan.hpp does for
//! Swin. Per stage:
//!
//! - the visible tokens (flat positions, per-sample offsets);
//! - the partition of the locally grouped attention (LSA: windows of the stage's window, never
//!   shifted, grouped by the planner);
//! - the 3x3 submanifold neighbour table of the PEG (sparse_conv.hpp);
//! - the GSA keys: the kernel = stride = sr block table (sr > 1; sr = 1: the keys are the tokens),
//!   their per-sample offsets and, for per-sample masks whose samples differ in size, the padded
//!   layout a batched attention needs (each query's slot in a [samples, max queries] grid, each
//!   padded key slot's key or -1);
//! - the kernel = stride = 2 block table of the next stage's patch embedding, whose outputs are
//!   the next stage's tokens;
//! - at the last stage, the rank of every unit (where a decoder puts each latent).
//!
//! Which output cells a block conv has is `block_rule::any` (spconv's rule): a block with a
//! visible input is an output, its masked inputs read as zero. With a mask unit that covers whole
//! blocks at every stage (32 px units at 224 px) every block is wholly visible or wholly masked
//! and the rule makes no difference; a finer mask (e.g. per patch) is planned, not refused: each
//! stage's tokens are the blocks of the previous one that hold a visible token.
//!
//! **Token order: block-major.** Stage s's tokens (s = 0 .. S-1) are ordered by the cells of the
//! last stage (each f_s x f_s of stage s, f_s = 2^(S-1-s)), row-major, and inside each such cell
//! in Morton (Z) order (`morton_rank`); per-sample masks put the samples one after the other. Every
//! aligned k x k block with k a power of two dividing f_s is then a run of k*k consecutive tokens
//! in Morton order, so a block conv whose blocks are whole (GreenMIM's 32 px units at every stage
//! of Twins-L) is a reshape of its input: output j's inputs are tokens j*k*k + morton_rank(i, j')
//! (`block_table_is_reshape`), and the conv is one GEMM over a view of x, no gather (the package
//! takes that path). The GSA keys (when sr divides f_s) and the next stage's tokens follow the same
//! order; the attention partitions and the neighbour tables index tokens through tables and take
//! any order; the last stage (f = 1) is row-major.
//!
//! The tables are those of the general builders (windows.hpp, planner.hpp, partition.hpp,
//! sparse_conv.hpp) on the tokens in this order, block tables' outputs put into it, laid out one
//! after the other; test_twins_plan.cpp checks the arena against them. The LSA partition is built
//! by detail/window_partitioners.hpp's window_partitioner, as encoder_plan.hpp builds Swin's,
//! without the general builders' validation of lists that are valid by construction.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "encoder_plan.hpp"
#include "partition.hpp"
#include "planner.hpp"
#include "sparse_conv.hpp"
#include "status.hpp"
#include "windows.hpp"

namespace greenmim {

//! A square Twins encoder: stage s has a `grid >> s` token grid, LSA windows of `windows[s]`
//! (dividing the stage's grid: Twins pads other grids with zero tokens, which a visible-token
//! encoder has no counterpart for), GSA sub-sampling `sr_ratios[s]` (dividing the grid) and
//! `channels[s]` for the planner's cost model. The three lists have one entry per stage.
struct twins_geometry {
  index_t grid = 56;
  std::vector<index_t> windows{7, 7, 7, 7};
  std::vector<index_t> sr_ratios{8, 4, 2, 1};
  std::vector<index_t> channels{128, 256, 512, 1024};

  index_t num_stages() const { return static_cast<index_t>(windows.size()); }
};

//! The Morton (Z-order) rank of (i, j) in a 2^b x 2^b cell: i's bits at the odd positions, j's
//! at the even ones. morton_rank(i, j) = 2 i + j in a 2 x 2 cell (row-major).
inline index_t morton_rank(index_t i, index_t j) {
  index_t r = 0;
  for (int b = 0; (i >> b) || (j >> b); ++b) r |= (((j >> b) & 1) << (2 * b)) | (((i >> b) & 1) << (2 * b + 1));
  return r;
}

//! The cells of a `side` x `side` grid in block-major order (packed coordinates): the f x f
//! coarse cells row-major, each in Morton order. `f` is a power of two dividing `side`.
inline void block_major_cells(index_t side, index_t f, std::vector<index_t>& cells) {
  std::vector<index_t> inner(static_cast<size_t>(f) * f);  // Morton rank -> (i, j) inside a coarse cell
  for (index_t i = 0; i < f; ++i)
    for (index_t j = 0; j < f; ++j) inner[static_cast<size_t>(morton_rank(i, j))] = pack_coord(i, j);
  cells.clear();
  cells.reserve(static_cast<size_t>(side) * side);
  for (index_t ch = 0; ch < side; ch += f)
    for (index_t cw = 0; cw < side; cw += f)
      for (index_t c : inner) cells.push_back(pack_coord(ch + coord_h(c), cw + coord_w(c)));
}

//! True when block table `t` is a reshape of its input: every input is in one block and output
//! n's tap (i, j) is token n*s*s + morton_rank(i, j) (whole blocks in block-major order, s a
//! power of two). Then the conv is y[n] = W' x[n*s*s : (n+1)*s*s] flattened, W''s rows in Morton
//! order of the taps. O(N).
inline bool block_table_is_reshape(const block_table& t) {
  const index_t s = t.stride, ss = s * s;
  if (static_cast<std::int64_t>(t.num_outputs()) * ss != t.num_inputs ||
      static_cast<std::int64_t>(t.gather.size()) != t.num_inputs)
    return false;
  std::vector<index_t> rank(static_cast<size_t>(ss));
  for (index_t i = 0; i < s; ++i)
    for (index_t j = 0; j < s; ++j) rank[static_cast<size_t>(i * s + j)] = morton_rank(i, j);
  for (index_t n = 0; n < t.num_outputs(); ++n)
    for (index_t r = 0; r < ss; ++r)
      if (t.gather[static_cast<size_t>(n) * ss + r] != n * ss + rank[static_cast<size_t>(r)]) return false;
  return true;
}

struct twins_stage {
  index_t height = 0, width = 0;
  index_t num_tokens = 0;  //!< the token axis (per sample with a shared mask)
  index_t num_keys = 0;    //!< the GSA key axis (per sample with a shared mask)
  index_t max_tokens = 0, max_keys = 0;  //!< the largest sample's (= num_* with a shared mask)
  bool uniform = true;     //!< every sample has max_tokens tokens and max_keys keys
  bool key_holes = false, embed_holes = false;  //!< a block table has a partly visible block
  bool key_reshape = false, embed_reshape = false;  //!< a block table is a reshape (block_table_is_reshape)
  encoder_partition lsa;   //!< the LSA windows (plain; `shift` 0)
  arena_range position;    //!< [N] h*W + w (shared), b*H*W + h*W + w (per sample)
  arena_range cu_seqlens;  //!< [M+1] per-sample token offsets; empty with a shared mask
  arena_range neighbors;   //!< [N*9] PEG 3x3 neighbour table
  arena_range keys;        //!< [K*sr*sr] GSA block table (sr > 1); empty at sr 1 (keys = tokens)
  arena_range key_cu_seqlens;  //!< [M+1] per-sample key offsets; empty with a shared mask
  arena_range query_slot;  //!< [N] slot of each token in [M, max_tokens] (per sample, not uniform)
  arena_range key_gather;  //!< [M*max_keys] key of each padded slot, or -1 (per sample, not uniform)
  arena_range embed;       //!< [N_next*4] the next stage's patch-embedding block table; empty last
  arena_range unit_rank;   //!< last stage, [M*H*W]: rank among visible (>= 0) or -1 - rank among masked
};

struct twins_plan {
  index_t num_masks = 0;
  bool per_sample = false;
  std::vector<twins_stage> stages;
  std::vector<index_t> arena;
};

//! Builds Twins plans in two phases like `encoder_planner`: `prepare` plans and lays out the
//! arena, `write` fills caller memory. Keeps its planners between calls; one per thread.
class twins_planner {
 public:
  //! `mask` is [num_masks, mask_h, mask_w] (nonzero = visible) at any resolution dividing the
  //! stage-1 grid. `opt` as encoder_plan_options (strategy, fixed G, window-area G, caps).
  //! Fails with invalid_argument (geometry: a grid that does not halve, a window or sr that does
  //! not divide its stage's grid, lists of different lengths), shape_mismatch (mask size or
  //! tiling), empty_input (no visible token), the planner's statuses, overflow.
  //! O(M * grid^2 + planning).
  status prepare(span<const std::uint8_t> mask, index_t num_masks, index_t mask_h, index_t mask_w, bool per_sample,
                 const twins_geometry& geo, const encoder_plan_options& opt, twins_plan& layout) {
    ready_ = false;
    if (status s = check(mask, num_masks, mask_h, mask_w, per_sample, geo); s != status::success) return s;
    const size_t S = static_cast<size_t>(geo.num_stages());
    M_ = num_masks;
    per_sample_ = per_sample;
    if (st_.size() < S) st_.resize(S);
    if (planners_.size() < S) planners_.resize(S);
    twins_plan r;
    r.num_masks = num_masks;
    r.per_sample = per_sample;
    r.stages.resize(S);
    size_ = 0;
    for (size_t s = 0; s < S; ++s) {  // each stage's cells in block-major order (f_s = 2^(S-1-s)), kept between calls
      stage_state& x = st_[s];
      const index_t side = geo.grid >> s, f = index_t{1} << (S - 1 - s);
      if (x.side != side || x.f != f || x.cells.size() != static_cast<size_t>(side) * side) {
        x.side = side;
        x.f = f;
        block_major_cells(side, f, x.cells);
        x.key_cells_of = 0;  // the keys' cells follow the grid
      }
    }
    scan(mask, mask_h, mask_w, geo.grid, st_[0]);
    if (st_[0].cu.back() == 0) return status::empty_input;
    for (size_t s = 0; s < S; ++s) {
      stage_state& x = st_[s];
      twins_stage& o = r.stages[s];
      o.height = o.width = x.side;
      const index_t N = x.cu.back();
      const std::vector<index_t>& cu = x.cu;
      const span<const index_t> cus(cu), coords(x.coords);
      if (status e = lsa(geo.windows[s], geo.channels[s], opt, planners_[s], x, o.lsa); e != status::success) return e;
      // the PEG's neighbour table needs no preparing: `write` builds it straight into the arena
      const index_t sr = geo.sr_ratios[s];
      x.key_cu = cu;
      if (sr > 1) {
        if (status e = blocks(x.side, sr, cus, coords, x.keys); e != status::success) return e;
        if (x.f % sr == 0) {  // the keys in block-major order too (sr divides f, a power of two)
          if (x.key_cells_of != sr) {
            block_major_cells(x.side / sr, x.f / sr, x.key_cells);
            x.key_cells_of = sr;
          }
          to_block_major(x.side / sr, x.key_cells, x.keys);
        }
        x.key_cu = x.keys.next_cu_seqlens;
        o.key_holes = has_holes(x.keys);
        o.key_reshape = block_table_is_reshape(x.keys);
      }
      o.num_tokens = N;
      o.num_keys = x.key_cu.back();
      o.max_tokens = max_count(cu);
      o.max_keys = max_count(x.key_cu);
      o.uniform = uniform(cu, o.max_tokens) && uniform(x.key_cu, o.max_keys);
      o.position = take(N);
      if (per_sample) o.cu_seqlens = take(M_ + 1);
      o.neighbors = take(static_cast<std::int64_t>(N) * 9);
      if (sr > 1) o.keys = take(static_cast<std::int64_t>(x.keys.gather.size()));
      if (per_sample) o.key_cu_seqlens = take(M_ + 1);
      if (per_sample && !o.uniform) {
        o.query_slot = take(N);
        o.key_gather = take(static_cast<std::int64_t>(M_) * o.max_keys);
      }
      if (s + 1 < S) {
        if (status e = blocks(x.side, 2, cus, coords, x.embed); e != status::success) return e;
        stage_state& y = st_[s + 1];
        to_block_major(y.side, y.cells, x.embed);  // the next stage's tokens, block-major
        o.embed_holes = has_holes(x.embed);
        o.embed_reshape = block_table_is_reshape(x.embed);
        o.embed = take(static_cast<std::int64_t>(x.embed.gather.size()));
        y.cu = per_sample ? x.embed.next_cu_seqlens : std::vector<index_t>{0, x.embed.num_outputs()};
        y.coords.swap(x.embed.next_coords);  // the next stage's tokens (write reads only x.embed.gather)
      } else {
        o.unit_rank = take(static_cast<std::int64_t>(M_) * x.side * x.side);
      }
      if (!detail::fits_index(size_)) return status::overflow;
    }
    layout_ = r;
    layout = std::move(r);
    ready_ = true;
    return status::success;
  }

  //! Entries of the arena the last successful `prepare` laid out.
  std::int64_t arena_size() const { return size_; }

  //! Writes the arena of the last successful `prepare`; invalid_argument when there is none.
  status write(index_t* arena) const {
    if (!ready_ || (!arena && size_ > 0)) return status::invalid_argument;
    for (size_t s = 0; s < layout_.stages.size(); ++s) {
      const stage_state& x = st_[s];
      const twins_stage& o = layout_.stages[s];
      x.part.write(x.coords.data(), o.lsa, arena);
      index_t* p = arena + o.position.offset;
      const index_t area = x.side * x.side;
      for (index_t b = 0; b + 1 < static_cast<index_t>(x.cu.size()); ++b)
        for (index_t t = x.cu[static_cast<size_t>(b)]; t < x.cu[static_cast<size_t>(b) + 1]; ++t) {
          const index_t c = x.coords[static_cast<size_t>(t)];
          p[t] = (per_sample_ ? b * area : 0) + coord_h(c) * x.side + coord_w(c);
        }
      if (o.cu_seqlens.size) put(x.cu, arena, o.cu_seqlens);
      if (status e = write_neighbors(x, arena + o.neighbors.offset); e != status::success) return e;
      if (o.keys.size) put(x.keys.gather, arena, o.keys);
      if (o.key_cu_seqlens.size) put(x.key_cu, arena, o.key_cu_seqlens);
      if (o.query_slot.size) write_padding(x, o, arena);
      if (o.embed.size) put(x.embed.gather, arena, o.embed);
      if (o.unit_rank.size) write_unit_ranks(x, arena + o.unit_rank.offset);
    }
    return status::success;
  }

  //! prepare + write into `out.arena`.
  status run(span<const std::uint8_t> mask, index_t num_masks, index_t mask_h, index_t mask_w, bool per_sample,
             const twins_geometry& geo, const encoder_plan_options& opt, twins_plan& out) {
    twins_plan r;
    if (status s = prepare(mask, num_masks, mask_h, mask_w, per_sample, geo, opt, r); s != status::success) return s;
    r.arena.resize(static_cast<size_t>(size_));
    if (status s = write(r.arena.data()); s != status::success) return s;
    out = std::move(r);
    return status::success;
  }

 private:
  struct stage_state {
    index_t side = 0, f = 1;    //!< the grid's side; the last stage's cells are f x f here
    std::vector<index_t> cells;  //!< the grid's cells in block-major order (packed)
    std::vector<index_t> key_cells;  //!< the GSA key grid's cells in block-major order, for sr = key_cells_of
    index_t key_cells_of = 0;
    std::vector<index_t> coords, cu, key_cu;  //!< tokens (packed, block-major per sample), offsets
    detail::window_partitioner part;  //!< the LSA windows
    block_table keys, embed;
  };

  static status check(span<const std::uint8_t> mask, index_t M, index_t mh, index_t mw, bool per_sample,
                      const twins_geometry& geo) {
    const index_t S = geo.num_stages();
    if (S < 1 || S > 16 || static_cast<index_t>(geo.sr_ratios.size()) != S ||
        static_cast<index_t>(geo.channels.size()) != S || geo.grid < 1 || geo.grid > 32767)
      return status::invalid_argument;
    if (geo.grid % (index_t{1} << (S - 1))) return status::invalid_argument;
    for (index_t s = 0; s < S; ++s) {
      const index_t side = geo.grid >> s, w = geo.windows[static_cast<size_t>(s)],
                    sr = geo.sr_ratios[static_cast<size_t>(s)], c = geo.channels[static_cast<size_t>(s)];
      if (w < 1 || side % w || sr < 1 || sr > 64 || side % sr || c < 1 || c > (1 << 24))
        return status::invalid_argument;
    }
    if (M < 1 || mh < 1 || mw < 1 || (!per_sample && M != 1)) return status::invalid_argument;
    if (geo.grid % mh || geo.grid % mw) return status::shape_mismatch;
    if (mask.size() != static_cast<std::int64_t>(M) * mh * mw) return status::shape_mismatch;
    if (static_cast<std::int64_t>(M) * geo.grid * geo.grid > (std::int64_t{1} << 26)) return status::overflow;
    return status::success;
  }

  arena_range take(std::int64_t n) {
    arena_range r{size_, n};
    size_ += n;
    return r;
  }
  static void put(const std::vector<index_t>& v, index_t* arena, const arena_range& r) {
    if (!v.empty()) std::memcpy(arena + r.offset, v.data(), v.size() * sizeof(index_t));
  }
  static index_t max_count(const std::vector<index_t>& cu) {
    index_t m = 0;
    for (size_t b = 0; b + 1 < cu.size(); ++b) m = std::max(m, cu[b + 1] - cu[b]);
    return m;
  }
  static bool uniform(const std::vector<index_t>& cu, index_t m) {
    for (size_t b = 0; b + 1 < cu.size(); ++b)
      if (cu[b + 1] - cu[b] != m) return false;
    return true;
  }
  static bool has_holes(const block_table& t) {
    for (index_t v : t.gather)
      if (v == pad_index) return true;
    return false;
  }

  //! Stage-1 tokens: the grid cells whose mask cell is visible, block-major per sample (x.cells).
  //! x.cells walks aligned r x r blocks as runs of r*r entries (r the largest power of two dividing
  //! x.f and the mask cell's sides), each inside one mask cell: one mask read and one copy a run
  //! (49 runs of 64 a sample for Twins-L's 32 px units), not a read a cell.
  void scan(span<const std::uint8_t> mask, index_t mh, index_t mw, index_t grid, stage_state& x) {
    const index_t fh = grid / mh, fw = grid / mw;
    index_t r = 1;
    while (x.f % (2 * r) == 0 && fh % (2 * r) == 0 && fw % (2 * r) == 0) r *= 2;
    const size_t run = static_cast<size_t>(r) * r;
    row_.resize(static_cast<size_t>(grid));
    col_.resize(static_cast<size_t>(grid));
    for (index_t i = 0; i < grid; ++i) {
      row_[static_cast<size_t>(i)] = (i / fh) * mw;
      col_[static_cast<size_t>(i)] = i / fw;
    }
    x.coords.resize(static_cast<size_t>(M_) * grid * grid);
    index_t* out = x.coords.data();
    x.cu.assign(static_cast<size_t>(M_) + 1, 0);
    for (index_t b = 0; b < M_; ++b) {
      const std::uint8_t* m = mask.data() + static_cast<std::int64_t>(b) * mh * mw;
      for (size_t k = 0; k < x.cells.size(); k += run) {
        const index_t c = x.cells[k];  // the run's first cell: its mask cell is the whole run's
        if (!m[row_[static_cast<size_t>(coord_h(c))] + col_[static_cast<size_t>(coord_w(c))]]) continue;
        std::memcpy(out, x.cells.data() + k, run * sizeof(index_t));
        out += run;
      }
      x.cu[static_cast<size_t>(b) + 1] = static_cast<index_t>(out - x.coords.data());
    }
    x.coords.resize(static_cast<size_t>(x.cu.back()));
  }

  //! Puts the outputs of block table `t` into the order of `cells` (its output grid's cells,
  //! `side` x `side`), sample by sample: rows of t.gather and t.next_coords permuted, the
  //! per-sample offsets unchanged. O(samples * side^2 + outputs).
  void to_block_major(index_t side, const std::vector<index_t>& cells, block_table& t) const {
    const index_t ss = t.positions();
    if (grid_.size() < static_cast<size_t>(side) * side) grid_.resize(static_cast<size_t>(side) * side, pad_index);
    std::vector<index_t> gather(t.gather.size()), coords(t.next_coords.size());
    index_t k = 0;
    for (size_t b = 0; b + 1 < t.next_cu_seqlens.size(); ++b) {
      for (index_t o = t.next_cu_seqlens[b]; o < t.next_cu_seqlens[b + 1]; ++o) {
        const index_t c = t.next_coords[static_cast<size_t>(o)];
        grid_[static_cast<size_t>(coord_h(c) * side + coord_w(c))] = o;
      }
      for (index_t c : cells) {
        index_t& o = grid_[static_cast<size_t>(coord_h(c) * side + coord_w(c))];
        if (o == pad_index) continue;
        std::memcpy(gather.data() + static_cast<std::int64_t>(k) * ss, t.gather.data() + static_cast<std::int64_t>(o) * ss,
                    static_cast<size_t>(ss) * sizeof(index_t));
        coords[static_cast<size_t>(k++)] = c;
        o = pad_index;  // grid_ is all pad_index between uses
      }
    }
    t.gather.swap(gather);
    t.next_coords.swap(coords);
  }

  //! The PEG's 3x3 neighbour table of stage x (sparse_conv.hpp's, sample by sample) at `out`.
  status write_neighbors(const stage_state& x, index_t* out) const {
    const size_t cells = static_cast<size_t>(x.side) * x.side;
    if (grid_.size() < cells) grid_.assign(cells, pad_index);  // all pad_index between samples
    const span<const index_t> coords(x.coords);
    for (size_t b = 0; b + 1 < x.cu.size(); ++b) {
      const span<const index_t> sample = coords.subspan(x.cu[b], x.cu[b + 1] - x.cu[b]);
      if (status e = detail::neighbors_one(x.side, x.side, 3, sample, x.cu[b], grid_, out); e != status::success)
        return e;
    }
    return status::success;
  }

  status blocks(index_t side, index_t s, span<const index_t> cu, span<const index_t> coords, block_table& out) const {
    return per_sample_ ? build_block_table_per_sample(side, side, s, cu, coords, out, block_rule::any)
                       : build_block_table(side, side, s, coords, out, block_rule::any);
  }

  //! The LSA partition: plain windows of `window` (no shift, no small-stage rule), planned.
  status lsa(index_t window, index_t channels, const encoder_plan_options& opt, planner<flops_cost>& pl,
             stage_state& x, encoder_partition& out) {
    const window_geometry g{x.side, x.side, window, 0};
    if (!g.valid()) return status::invalid_argument;
    if (pl.cost_model().channels != channels) pl = planner<flops_cost>(flops_cost{channels});
    const status e = x.part.build(g, M_, x.coords.data(), x.cu.data(), pl, opt, scratch_, out);
    if (e != status::success) return e;
    out.gather = take(x.part.slots());
    out.scatter = take(x.cu.back());
    out.slot_window = take(x.part.slots());
    out.slot_coord = take(x.part.slots());
    return status::success;
  }

  //! Padded GSA layout of a per-sample stage: sample b's queries at slots [b*max_tokens, ...),
  //! its keys at [b*max_keys, ...), the rest -1.
  void write_padding(const stage_state& x, const twins_stage& o, index_t* arena) const {
    index_t* q = arena + o.query_slot.offset;
    index_t* k = arena + o.key_gather.offset;
    for (index_t b = 0; b < M_; ++b) {
      for (index_t t = x.cu[static_cast<size_t>(b)]; t < x.cu[static_cast<size_t>(b) + 1]; ++t)
        q[t] = b * o.max_tokens + (t - x.cu[static_cast<size_t>(b)]);
      const index_t k0 = x.key_cu[static_cast<size_t>(b)], n = x.key_cu[static_cast<size_t>(b) + 1] - k0;
      for (index_t j = 0; j < o.max_keys; ++j) k[b * o.max_keys + j] = j < n ? k0 + j : pad_index;
    }
  }

  void write_unit_ranks(const stage_state& x, index_t* p) const {
    std::vector<std::uint8_t> vis(static_cast<size_t>(x.side) * x.side);
    for (index_t b = 0; b < M_; ++b) {
      std::fill(vis.begin(), vis.end(), 0);
      for (index_t t = x.cu[static_cast<size_t>(b)]; t < x.cu[static_cast<size_t>(b) + 1]; ++t)
        vis[static_cast<size_t>(coord_h(x.coords[static_cast<size_t>(t)]) * x.side +
                                coord_w(x.coords[static_cast<size_t>(t)]))] = 1;
      index_t seen = 0, hidden = 0;
      for (std::uint8_t v : vis) *p++ = v ? seen++ : -1 - hidden++;
    }
  }

  index_t M_ = 0;
  bool per_sample_ = false, ready_ = false;
  std::int64_t size_ = 0;
  twins_plan layout_;
  std::vector<stage_state> st_;
  std::vector<planner<flops_cost>> planners_;
  detail::window_partitioner::scratch scratch_;
  std::vector<index_t> row_, col_;  //!< scan's mask row / column of a grid row / column
  mutable std::vector<index_t> grid_;  //!< write's scratch: a stage grid of token ids, pad_index between uses
};

}  // namespace greenmim
