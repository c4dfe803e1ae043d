//! \file encoder_plan.hpp
//! Everything a Swin-like encoder needs for one mask (or one batch of per-sample masks), built
//! in one call into one arena of int32: per stage the partitions of the plain and the shifted
//! windows, each token's flat position, the patch-merging indices to the next stage, per-sample
//! offsets, and for the last stage the rank of every unit (where a decoder puts each latent).
//!
//! One arena means one allocation and one host-to-device copy per mask, and a plan that crosses
//! process boundaries (a DataLoader worker) as one buffer. The builder writes the same arrays as
//! windows.hpp / partition.hpp / merging.hpp (test_encoder_plan.cpp checks it against them), in
//! one pass per stage and shift, without their per-call validation: the lists it builds are
//! valid by construction. The planners and scratch are kept between calls.
//!
//! The plan's types are in encoder_plan_types.hpp; the builders of one partition (a stage and
//! shift) are in detail/window_partitioners.hpp; this file scans the masks and lays out the arena.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "config.hpp"
#include "detail/window_partitioners.hpp"
#include "encoder_plan_types.hpp"
#include "geometry.hpp"
#include "planner.hpp"
#include "status.hpp"

namespace greenmim {

//! Builds encoder plans in two phases, as CUB's temporary-storage calls: `prepare` plans every
//! stage and lays out the arena (its size and every array's range), `write` fills caller memory
//! (a torch tensor, pinned memory) with it. `run` does both into an owning `encoder_plan`.
//! Keeps its planners and scratch between calls, so a warm planner allocates little. Not
//! thread-safe: one per thread.
class encoder_planner {
 public:
  //! Plans and lays out (no arena written): on success `layout` has every stage and
  //! `arena_size()` the entries `write` needs. `mask` is [num_masks, mask_h, mask_w] (nonzero =
  //! visible, row-major) at any resolution dividing the stage-1 grid (mask units or patches).
  //! `per_sample`: the token axis of every stage is all samples' tokens, sample-major
  //! (cu_seqlens); otherwise num_masks must be 1 (one mask shared by the batch). Token order,
  //! window ids and slot layout are those of partition.hpp. Fails with invalid_argument
  //! (geometry, a grid that does not halve num_stages-1 times), shape_mismatch (mask size, a
  //! mask that does not tile the grid), empty_input (no visible token), misaligned (a 2x2 block
  //! partly visible at some stage: the mask is finer than the last stride), the planner's
  //! statuses (size_exceeds_group: a window above a fixed G or cap), overflow; `write` is then
  //! not allowed. O(M * grid^2 + planning).
  status prepare(span<const std::uint8_t> mask, index_t num_masks, index_t mask_h, index_t mask_w, bool per_sample,
                 const encoder_geometry& geo, const encoder_plan_options& opt, encoder_plan& layout) {
    ready_ = false;
    if (status s = check(mask, num_masks, mask_h, mask_w, per_sample, geo); s != status::success) return s;
    mask_ = mask.data();
    M_ = num_masks;
    mh_ = mask_h;
    mw_ = mask_w;
    grid_ = geo.grid;
    per_sample_ = per_sample;
    const size_t S = static_cast<size_t>(geo.num_stages);
    if (st_.size() < S) st_.resize(S);
    if (planners_.size() < S) planners_.resize(S);
    encoder_plan r;
    r.num_masks = num_masks;
    r.per_sample = per_sample;
    r.stages.resize(S);
    size_ = 0;
    for (size_t s = 0; s < S; ++s) {
      stage_state& x = st_[s];
      encoder_stage& o = r.stages[s];
      o.height = o.width = geo.grid >> s;
      if (s == 0) scan(0, x);
      if (s == 0 && x.n == 0) return status::empty_input;
      o.num_tokens = x.n;
      const index_t channels = geo.embed_dim << s;
      if (planners_[s].cost_model().channels != channels) planners_[s] = planner<flops_cost>(flops_cost{channels});
      for (int k = 0; k < 2; ++k) {
        const window_geometry g = make_window_geometry(o.height, o.width, geo.window, k == 0 ? 0 : geo.window / 2);
        x.shared_shift = k == 1 && g.shift == 0;
        if (x.shared_shift) {
          o.part[1] = o.part[0];
          continue;
        }
        detail::row_partitioner& wp = x.part[k];
        const status e = wp.build(g, rows(x), planners_[s], opt, scratch_.sizes, o.part[k]);
        if (e != status::success) return e;
        o.part[k].gather = take(wp.slots());
        o.part[k].scatter = take(x.n);
        o.part[k].slot_window = take(wp.slots());
        o.part[k].slot_coord = take(wp.slots());
      }
      o.position = take(o.num_tokens);
      if (per_sample) o.cu_seqlens = take(static_cast<std::int64_t>(M_) + 1);
      if (s + 1 < S) {
        scan(static_cast<index_t>(s + 1), st_[s + 1]);
        if (status e = merge(static_cast<index_t>(s), o.height, x, st_[s + 1]); e != status::success) return e;
        o.merge = take(4 * static_cast<std::int64_t>(st_[s + 1].n));
      } else {
        o.unit_rank = take(static_cast<std::int64_t>(M_) * o.height * o.width);
      }
    }
    layout_ = r;
    layout = std::move(r);
    ready_ = true;
    return status::success;
  }

  //! Entries of the arena the last successful `prepare` laid out.
  std::int64_t arena_size() const { return size_; }

  //! Writes the arena of the last successful `prepare` (`arena_size()` entries at `arena`).
  //! Returns invalid_argument when there is none (or `arena` is null).
  status write(index_t* arena) const {
    if (!ready_ || (!arena && size_ > 0)) return status::invalid_argument;
    for (size_t s = 0; s < layout_.stages.size(); ++s) {
      const stage_state& x = st_[s];
      const encoder_stage& o = layout_.stages[s];
      const detail::token_rows tr = rows(x);
      for (int k = 0; k < (x.shared_shift ? 1 : 2); ++k) x.part[k].write(tr, o.part[k], arena);
      write_positions(x, o, arena + o.position.offset);
      if (per_sample_) copy(x.cu, arena + o.cu_seqlens.offset);
      if (o.merge.size) {
        if (x.block_merge) write_block_merge(o.height, x, st_[s + 1], arena + o.merge.offset);
        else copy(x.g4, arena + o.merge.offset);
      }
      if (o.unit_rank.size) write_unit_ranks(static_cast<index_t>(s), arena + o.unit_rank.offset);
    }
    return status::success;
  }

  //! prepare + write into `out.arena`.
  status run(span<const std::uint8_t> mask, index_t num_masks, index_t mask_h, index_t mask_w, bool per_sample,
             const encoder_geometry& geo, const encoder_plan_options& opt, encoder_plan& out) {
    encoder_plan r;
    if (status s = prepare(mask, num_masks, mask_h, mask_w, per_sample, geo, opt, r); s != status::success) return s;
    r.arena.resize(static_cast<size_t>(size_));
    if (status s = write(r.arena.data()); s != status::success) return s;
    out = std::move(r);
    return status::success;
  }

 private:
  struct stage_state {
    std::vector<index_t> cu;  //!< per-sample token offsets
    //! the tokens as rows of patterns (detail::token_rows): row b*H + h
    std::vector<index_t> row_start, row_base, row_pat, mask_row, pat_start, pat_cols;
    std::vector<index_t> coords, g4;  //!< the general merge only: tokens (packed, row-major per sample), merge
    index_t n = 0, H = 0;
    detail::row_partitioner part[2];  //!< plain and shifted windows
    bool shared_shift = false;
    bool block_merge = false;  //!< mask cells cover whole 2x2 blocks: the merge is written from rows (no g4)
  };

  detail::token_rows rows(const stage_state& x) const {
    detail::token_rows r;
    r.M = M_;
    r.H = x.H;
    r.num_patterns = static_cast<index_t>(x.pat_start.size()) - 1;
    r.row_start = x.row_start.data();
    r.row_base = x.row_base.data();
    r.row_pat = x.row_pat.data();
    r.mask_row = x.mask_row.data();
    r.pat_start = x.pat_start.data();
    r.pat_cols = x.pat_cols.data();
    return r;
  }

  static status check(span<const std::uint8_t> mask, index_t M, index_t mh, index_t mw, bool per_sample,
                      const encoder_geometry& geo) {
    if (geo.num_stages < 1 || geo.num_stages > 16 || geo.grid < 1 || geo.grid > 32767 || geo.window < 1 ||
        geo.window > 32767 || geo.embed_dim < 1 || geo.embed_dim > (1 << 20))
      return status::invalid_argument;
    if (geo.grid % (index_t{1} << (geo.num_stages - 1))) return status::invalid_argument;
    if ((static_cast<std::int64_t>(geo.embed_dim) << (geo.num_stages - 1)) > (1 << 24)) return status::overflow;
    if (M < 1 || mh < 1 || mw < 1 || (!per_sample && M != 1)) return status::invalid_argument;
    if (geo.grid % mh || geo.grid % mw) return status::shape_mismatch;
    if (mask.size() != static_cast<std::int64_t>(M) * mh * mw) return status::shape_mismatch;
    // the arena holds about 12 entries per stage-1 token at most
    if (static_cast<std::int64_t>(M) * geo.grid * geo.grid > (std::int64_t{1} << 27)) return status::overflow;
    return status::success;
  }

  arena_range take(std::int64_t n) {
    arena_range r{size_, n};
    size_ += n;
    return r;
  }
  static void copy(const std::vector<index_t>& v, index_t* dst) {
    if (!v.empty()) std::memcpy(dst, v.data(), v.size() * sizeof(index_t));
  }

  //! Visible tokens of stage s as rows (x.row_*, x.pat_*, x.mask_row; x.cu, x.n). A pattern is
  //! the visible token columns of a mask row, found by scanning it as runs of columns that share
  //! one mask cell (8 at stage 1 for 32 px units and 4 px patches); mask rows with the same cells
  //! share one (up to 12 mask columns), and a token row takes its mask row's.
  void scan(index_t s, stage_state& x) {
    const index_t H = grid_ >> s, fh = grid_ / mh_, fw = grid_ / mw_;
    runs_.clear();  // (mask column, first token column, end)
    for (index_t w = 0; w < H; ++w) {
      const index_t c = (w << s) / fw;
      if (runs_.empty() || runs_[runs_.size() - 3] != c) runs_.insert(runs_.end(), {c, w, w + 1});
      else runs_.back() = w + 1;
    }
    const size_t num_rows = static_cast<size_t>(M_) * mh_;
    const bool intern = mw_ <= 12;
    if (intern) pattern_of_bits_.assign(size_t{1} << mw_, -1);
    mask_row_pat_.resize(num_rows);
    x.pat_start.clear();
    index_t k = 0;
    for (size_t q = 0; q < num_rows; ++q) {
      const std::uint8_t* row = mask_ + static_cast<std::int64_t>(q) * mw_;
      index_t* slot = nullptr;
      if (intern) {
        unsigned bits = 0;
        for (index_t c = 0; c < mw_; ++c) bits |= (row[c] != 0 ? 1u : 0u) << c;
        slot = &pattern_of_bits_[bits];
        if (*slot >= 0) {
          mask_row_pat_[q] = *slot;
          continue;
        }
      }
      const index_t id = static_cast<index_t>(x.pat_start.size());
      if (slot) *slot = id;
      mask_row_pat_[q] = id;
      x.pat_start.push_back(k);
      if (x.pat_cols.size() < static_cast<size_t>(k) + H + 16) x.pat_cols.resize(2 * (static_cast<size_t>(k) + H + 16));
      index_t* cols = x.pat_cols.data();
      for (size_t r = 0; r < runs_.size(); r += 3)
        if (row[runs_[r]])
          for (index_t w = runs_[r + 1]; w < runs_[r + 2]; ++w) cols[k++] = w;
    }
    x.pat_start.push_back(k);  // pat_cols stays readable 16 entries past k (row_partitioner::write)
    x.mask_row.resize(static_cast<size_t>(H));
    for (index_t h = 0; h < H; ++h) x.mask_row[static_cast<size_t>(h)] = (h << s) / fh;
    x.H = H;
    x.row_start.resize(static_cast<size_t>(M_) * H + 1);
    x.row_pat.resize(static_cast<size_t>(M_) * H);
    x.row_base.resize(static_cast<size_t>(M_) * H);
    x.cu.resize(static_cast<size_t>(M_) + 1);
    x.cu[0] = 0;
    index_t t = 0;
    for (index_t b = 0; b < M_; ++b) {
      for (index_t h = 0; h < H; ++h) {
        const size_t r = static_cast<size_t>(b) * H + h;
        const index_t q = mask_row_pat_[static_cast<size_t>(b) * mh_ + x.mask_row[static_cast<size_t>(h)]];
        const index_t first = x.pat_start[static_cast<size_t>(q)];
        x.row_start[r] = t;
        x.row_base[r] = t - first;
        x.row_pat[r] = q;
        t += x.pat_start[static_cast<size_t>(q) + 1] - first;
      }
      x.cu[static_cast<size_t>(b) + 1] = t;
    }
    x.row_start[static_cast<size_t>(M_) * H] = t;
    x.n = t;
  }

  //! x.coords from x's rows (only the general merge needs them).
  static void fill_coords(stage_state& x) {
    x.coords.resize(static_cast<size_t>(x.n));
    const size_t rows = x.row_pat.size();
    for (size_t r = 0; r < rows; ++r) {
      const index_t h = static_cast<index_t>(r % static_cast<size_t>(x.H));
      const index_t* c = x.pat_cols.data() + x.pat_start[static_cast<size_t>(x.row_pat[r])];
      for (index_t t = x.row_start[r]; t < x.row_start[r + 1]; ++t) x.coords[static_cast<size_t>(t)] = pack_coord(h, *c++);
    }
  }

  //! Patch merging of stage s (x) into stage s + 1 (y) (merging.hpp's order: (0,0), (1,0), (0,1),
  //! (1,1)). A 2x2 block must be all visible or all masked. When mask cells are a whole number of
  //! 2x2 blocks of stage s (fh and fw multiples of 2^(s+1)), every block is, and write computes
  //! the indices from the rows (write_block_merge); otherwise they are checked and built here.
  status merge(index_t s, index_t H, stage_state& x, stage_state& y) {
    if (H % 2) return status::invalid_argument;
    const index_t block = index_t{2} << s;
    x.block_merge = (grid_ / mh_) % block == 0 && (grid_ / mw_) % block == 0;
    if (x.block_merge) return status::success;
    fill_coords(x);
    fill_coords(y);
    index_of_.assign(static_cast<size_t>(H) * H, pad_index);  // stage-x token of each cell, one sample at a time
    x.g4.resize(4 * static_cast<size_t>(y.n));
    index_t* g4 = x.g4.data();
    auto cell = [&](index_t t) { return coord_h(x.coords[static_cast<size_t>(t)]) * H + coord_w(x.coords[static_cast<size_t>(t)]); };
    for (index_t b = 0; b < M_; ++b) {
      const index_t first = x.cu[static_cast<size_t>(b)], last = x.cu[static_cast<size_t>(b) + 1];
      if (last - first != 4 * (y.cu[static_cast<size_t>(b) + 1] - y.cu[static_cast<size_t>(b)])) return status::misaligned;
      for (index_t t = first; t < last; ++t) index_of_[static_cast<size_t>(cell(t))] = t;
      for (index_t u = y.cu[static_cast<size_t>(b)]; u < y.cu[static_cast<size_t>(b) + 1]; ++u) {
        const index_t h = 2 * coord_h(y.coords[static_cast<size_t>(u)]), w = 2 * coord_w(y.coords[static_cast<size_t>(u)]);
        for (index_t k = 0; k < 4; ++k) {
          const index_t t = index_of_[static_cast<size_t>((h + (k & 1)) * H + w + (k >> 1))];
          if (t == pad_index) return status::misaligned;
          *g4++ = t;
        }
      }
      for (index_t t = first; t < last; ++t) index_of_[static_cast<size_t>(cell(t))] = pad_index;
    }
    return status::success;
  }

  //! Each token's flat position (stage x), row by row: the row's offset plus its pattern's columns,
  //! in blocks of 8 that may pass the row's end (the next row overwrites them) except near the
  //! array's end.
  void write_positions(const stage_state& x, const encoder_stage& o, index_t* p) const {
    const index_t* const row_start = x.row_start.data();
    const index_t* const row_pat = x.row_pat.data();
    const index_t* const pat_start = x.pat_start.data();
    const index_t* const pat_cols = x.pat_cols.data();
    const index_t H = o.height, last = row_start[static_cast<size_t>(M_) * H] - 8;
    for (index_t b = 0; b < M_; ++b) {
      const index_t base = per_sample_ ? b * H * o.width : 0;
      for (index_t h = 0; h < H; ++h) {
        const size_t r = static_cast<size_t>(b) * H + h;
        const index_t t0 = row_start[r], L = row_start[r + 1] - t0, v = base + h * o.width;
        const index_t* c = pat_cols + pat_start[static_cast<size_t>(row_pat[r])];
        if (row_start[r + 1] <= last) {
          for (index_t i = 0; i < L; i += 8) detail::store_add<8>(p + t0 + i, v, c + i);  // c: readable 16 past
        } else {
          for (index_t i = 0; i < L; ++i) p[t0 + i] = v + c[i];
        }
      }
    }
  }

  //! merge's indices when mask cells cover whole 2x2 blocks: the stage-(s+1) token at position i
  //! of row h' covers columns 2i, 2i+1 of stage-s rows 2h' and 2h' + 1 (their patterns are its
  //! pattern with every column doubled).
  void write_block_merge(index_t H, const stage_state& x, const stage_state& y, index_t* g4) const {
    const index_t Hy = H / 2;
    for (index_t b = 0; b < M_; ++b)
      for (index_t h = 0; h < Hy; ++h) {
        const size_t ry = static_cast<size_t>(b) * Hy + h, rx = static_cast<size_t>(b) * H + 2 * h;
        const index_t u0 = y.row_start[ry], L = y.row_start[ry + 1] - u0;
        const index_t a = x.row_start[rx], c = x.row_start[rx + 1];
        index_t* o = g4 + 4 * static_cast<std::int64_t>(u0);
#ifdef GREENMIM_SSE2
        __m128i v = _mm_setr_epi32(a, c, a + 1, c + 1);
        for (index_t i = 0; i < L; ++i) {
          _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 4 * i), v);
          v = _mm_add_epi32(v, _mm_set1_epi32(2));
        }
#else
        for (index_t i = 0; i < L; ++i) {
          o[4 * i] = a + 2 * i;
          o[4 * i + 1] = c + 2 * i;
          o[4 * i + 2] = a + 2 * i + 1;
          o[4 * i + 3] = c + 2 * i + 1;
        }
#endif
      }
  }

  void write_unit_ranks(index_t s, index_t* p) const {
    const index_t H = grid_ >> s, fh = grid_ / mh_, fw = grid_ / mw_;
    cells_.resize(2 * static_cast<size_t>(H));  // each row's and column's mask cell (no division per entry)
    index_t* const mrow = cells_.data();
    index_t* const mcol = mrow + H;
    for (index_t i = 0; i < H; ++i) {
      mrow[i] = ((i << s) / fh) * mw_;
      mcol[i] = (i << s) / fw;
    }
    for (index_t b = 0; b < M_; ++b) {
      const std::uint8_t* m = mask_ + static_cast<std::int64_t>(b) * mh_ * mw_;
      index_t vis = 0, hid = 0;
      for (index_t h = 0; h < H; ++h) {
        const std::uint8_t* row = m + mrow[h];
        for (index_t w = 0; w < H; ++w) {
          const index_t on = row[mcol[w]] != 0;
          *p++ = on ? vis : -1 - hid;
          vis += on;
          hid += 1 - on;
        }
      }
    }
  }

  const std::uint8_t* mask_ = nullptr;
  index_t M_ = 0, mh_ = 1, mw_ = 1, grid_ = 1;
  bool per_sample_ = false, ready_ = false;
  std::int64_t size_ = 0;
  encoder_plan layout_;
  std::vector<stage_state> st_;
  std::vector<planner<flops_cost>> planners_;
  std::vector<index_t> runs_, index_of_, pattern_of_bits_, mask_row_pat_;
  mutable std::vector<index_t> cells_;  //!< write_unit_ranks' scratch
  detail::window_partitioner::scratch scratch_;
};

}  // namespace greenmim
