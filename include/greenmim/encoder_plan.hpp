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
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "config.hpp"
#include "geometry.hpp"
#include "planner.hpp"
#include "status.hpp"

#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
#include <emmintrin.h>
#define GREENMIM_SSE2 1
#endif

namespace greenmim {

//! A square encoder: stage s has a `(grid >> s)` square token grid, `embed_dim << s` channels
//! (the cost model's C) and windows of `window` tokens (Swin's small-stage rule applies).
struct encoder_geometry {
  index_t grid = 56;       //!< stage-1 token grid side (image / patch)
  index_t window = 7;      //!< window side in tokens
  index_t num_stages = 4;
  index_t embed_dim = 128; //!< channels of stage 1
};

struct encoder_plan_options {
  strategy strat = strategy::fast;
  index_t group_size = 0;      //!< > 0 fixes G at every stage (fast and paper only)
  //! Fixes G at each stage to its window's area p*p (capped at the stage's token count, as any
  //! fixed G; fast and paper only): plans of different masks then differ in their number of
  //! groups alone (what torch.compile's dynamic shapes need).
  bool window_area_groups = false;
  index_t max_group_size = 0;  //!< > 0 caps G at every stage; 0: see stage_cap
  //! When set (and neither group_size nor max_group_size is, with fast or paper): the cap of a
  //! stage whose effective window is `w` (e.g. a kernel's fast-path limit); 0 means none.
  index_t (*stage_cap)(index_t w) = nullptr;
};

//! An array of the arena: entries [offset, offset + size).
struct arena_range {
  std::int64_t offset = 0;
  std::int64_t size = 0;
};

struct encoder_partition {
  index_t group_size = 0, num_groups = 0, num_windows = 0;
  index_t window = 0, shift = 0;  //!< after Swin's small-stage rule
  bool budget_exhausted = false;
  double cost = 0, lower_bound = 0, plan_us = 0;
  //! [n_g*G] gather, slot_window, slot_coord; [N] scatter (partition_types.hpp's layout)
  arena_range gather, scatter, slot_window, slot_coord;
};

struct encoder_stage {
  index_t height = 0, width = 0, num_tokens = 0;  //!< num_tokens: the token axis (per sample if shared)
  //! Plain and shifted windows; a stage without a shift (one window) has part[1] == part[0].
  encoder_partition part[2];
  arena_range position;    //!< [N] flat position of each token: h*W + w (shared), b*H*W + h*W + w
  arena_range merge;       //!< [4 * N_next] patch-merging gather (merging.hpp), empty at the last stage
  arena_range cu_seqlens;  //!< [M+1] per-sample token offsets, empty with a shared mask
  arena_range unit_rank;   //!< last stage only, [M*H*W]: rank among the visible (>= 0) or -1 - rank among the masked
};

struct encoder_plan {
  index_t num_masks = 0;
  bool per_sample = false;
  std::vector<encoder_stage> stages;
  std::vector<index_t> arena;
};

namespace detail {

// Fixed-size stores of B (a multiple of 4) int32, as 16-byte vector stores where SSE2 is there
// (compilers keep the plain loops scalar when the arrays may alias).
template <int B>
inline void store_iota(index_t* out, index_t first) {  // out[k] = first + k
#ifdef GREENMIM_SSE2
  __m128i v = _mm_add_epi32(_mm_set1_epi32(first), _mm_setr_epi32(0, 1, 2, 3));
  for (int k = 0; k < B; k += 4) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k), v);
    v = _mm_add_epi32(v, _mm_set1_epi32(4));
  }
#else
  for (int k = 0; k < B; ++k) out[k] = first + k;
#endif
}
template <int B>
inline void store_fill(index_t* out, index_t value) {
#ifdef GREENMIM_SSE2
  const __m128i v = _mm_set1_epi32(value);
  for (int k = 0; k < B; k += 4) _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k), v);
#else
  for (int k = 0; k < B; ++k) out[k] = value;
#endif
}
template <int B>
inline void store_add(index_t* out, index_t value, const index_t* in) {  // out[k] = value + in[k]
#ifdef GREENMIM_SSE2
  const __m128i v = _mm_set1_epi32(value);
  for (int k = 0; k < B; k += 4)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k),
                     _mm_add_epi32(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + k))));
#else
  for (int k = 0; k < B; ++k) out[k] = value + in[k];
#endif
}
template <int B>
inline void store_or(index_t* out, index_t bits, const index_t* in) {  // out[k] = bits | in[k]
#ifdef GREENMIM_SSE2
  const __m128i v = _mm_set1_epi32(bits);
  for (int k = 0; k < B; k += 4)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k),
                     _mm_or_si128(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + k))));
#else
  for (int k = 0; k < B; ++k) out[k] = bits | in[k];
#endif
}


//! Plans the window sizes `sizes` (nw windows of geometry `g`) into `groups` and fills every
//! field of `out` but the arena ranges. Shared by the partitioners below.
inline status plan_windows(const window_geometry& g, const std::vector<index_t>& sizes, index_t nw,
                           planner<flops_cost>& pl, const encoder_plan_options& opt, plan& groups,
                           encoder_partition& out) {
  planner_options po;
  po.strat = opt.strat;
  po.group_size = opt.window_area_groups ? g.window * g.window : opt.group_size;
  po.max_group_size = opt.max_group_size;
  const bool sweeps = (opt.strat == strategy::fast || opt.strat == strategy::paper) && po.group_size == 0;
  if (po.max_group_size == 0 && opt.stage_cap && sweeps) po.max_group_size = opt.stage_cap(g.window);
  const auto t0 = std::chrono::steady_clock::now();
  if (status e = pl.run(span<const index_t>(sizes), po, groups); e != status::success) return e;
  out.plan_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  const index_t G = groups.group_size, ng = groups.num_groups();
  if (static_cast<std::int64_t>(ng) * G > (std::int64_t{1} << 30)) return status::overflow;
  out.group_size = G;
  out.num_groups = ng;
  out.num_windows = nw;
  out.window = g.window;
  out.shift = g.shift;
  out.budget_exhausted = groups.budget_exhausted;
  out.cost = groups.cost;
  out.lower_bound = groups.lower_bound;
  return status::success;
}

//! One partition of an encoder plan (a stage and shift of Swin, a stage of Twins' LSA), built
//! without the general builders' per-call validation: the token lists it gets are valid by
//! construction. `build` sorts the tokens into windows (a counting sort by window id) and runs the
//! planner; the caller lays the four arrays out in its arena and `write` fills them. Keeps its
//! scratch between calls. Tokens: sample b owns [cu[b], cu[b+1]) of `coords` (packed, any order
//! within a sample); the token axis is the samples' tokens, sample-major.
class window_partitioner {
 public:
  //! Scratch of `build`, shared by a planner's partitioners (one stays hot in cache).
  struct scratch {
    std::vector<index_t> row, col, wid, sizes, cursor;
  };

  //! Plans the windows of geometry `g` over `M` samples into `out` (every field but the arena
  //! ranges, which the caller takes: slots() entries for gather, slot_window and slot_coord, N for
  //! scatter). Fails with overflow, or the planner's statuses.
  status build(const window_geometry& g, index_t M, const index_t* coords, const index_t* cu, planner<flops_cost>& pl,
               const encoder_plan_options& opt, scratch& sc, encoder_partition& out) {
    const index_t H = g.height, off = g.offset(), nww = g.windows_w(), nwps = g.num_windows();
    const std::int64_t nw64 = static_cast<std::int64_t>(M) * nwps;
    if (nw64 > (std::int64_t{1} << 30)) return status::overflow;
    const index_t nw = static_cast<index_t>(nw64), N = cu[M];
    sc.row.resize(static_cast<size_t>(H));
    sc.col.resize(static_cast<size_t>(H));
    for (index_t i = 0; i < H; ++i) {
      sc.row[static_cast<size_t>(i)] = ((i + off) / g.window) * nww;
      sc.col[static_cast<size_t>(i)] = (i + off) / g.window;
    }
    sc.wid.resize(static_cast<size_t>(N));
    sc.sizes.assign(static_cast<size_t>(nw), 0);
    for (index_t b = 0; b < M; ++b)
      for (index_t t = cu[b]; t < cu[b + 1]; ++t) {
        const index_t c = coords[t];
        const index_t w = b * nwps + sc.row[static_cast<size_t>(coord_h(c))] + sc.col[static_cast<size_t>(coord_w(c))];
        sc.wid[static_cast<size_t>(t)] = w;
        ++sc.sizes[static_cast<size_t>(w)];
      }
    offsets_.resize(static_cast<size_t>(nw) + 1);
    offsets_[0] = 0;
    for (size_t w = 0; w < static_cast<size_t>(nw); ++w) offsets_[w + 1] = offsets_[w] + sc.sizes[w];
    sc.cursor.assign(offsets_.begin(), offsets_.end() - 1);
    tokens_.resize(static_cast<size_t>(N));
    for (index_t t = 0; t < N; ++t) tokens_[static_cast<size_t>(sc.cursor[static_cast<size_t>(sc.wid[static_cast<size_t>(t)])]++)] = t;

    return plan_windows(g, sc.sizes, nw, pl, opt, groups_, out);
  }

  //! Slots of the last build (num_groups * group_size).
  std::int64_t slots() const { return static_cast<std::int64_t>(groups_.num_groups()) * groups_.group_size; }

  //! Writes the last build's gather, scatter, slot_window and slot_coord at `o`'s ranges: group g's
  //! windows in plan order, each window's tokens ascending, padding at the end.
  void write(const index_t* coords, const encoder_partition& o, index_t* arena) const {
    index_t* gather = arena + o.gather.offset;
    index_t* scatter = arena + o.scatter.offset;
    index_t* slot_window = arena + o.slot_window.offset;
    index_t* slot_coord = arena + o.slot_coord.offset;
    // Per window: gather is a copy of its token run and slot_window a fill (both vectorise);
    // only scatter and slot_coord go token by token. The write is store-bound: four streams.
    for (index_t gi = 0; gi < o.num_groups; ++gi) {
      index_t slot = gi * o.group_size;
      const index_t end = slot + o.group_size;
      for (index_t w : groups_.group(gi)) {
        const index_t first = offsets_[static_cast<size_t>(w)], n = offsets_[static_cast<size_t>(w) + 1] - first;
        const index_t* tokens = tokens_.data() + first;
        std::memcpy(gather + slot, tokens, static_cast<size_t>(n) * sizeof(index_t));
        std::fill_n(slot_window + slot, n, w);
        for (index_t k = 0; k < n; ++k) {
          scatter[tokens[k]] = slot + k;
          slot_coord[slot + k] = coords[tokens[k]];
        }
        slot += n;
      }
      std::fill(gather + slot, gather + end, pad_index);
      std::fill(slot_window + slot, slot_window + end, pad_index);
      std::fill(slot_coord + slot, slot_coord + end, index_t{0});
    }
  }

 private:
  std::vector<index_t> offsets_, tokens_;  // windows in CSR form, tokens ascending within one
  greenmim::plan groups_;
};

//! The visible tokens of one stage as rows (encoder_planner's scan): row r = b*H + h of sample b
//! holds tokens [row_start[r], row_start[r+1]) at the columns of its pattern row_pat[r], the
//! ascending list pat_cols[pat_start[q] .. pat_start[q+1]) (the visible columns of a mask row).
//! Rows whose mask row (mask_row[h]) is the same share a pattern.
struct token_rows {
  index_t M = 0, H = 0, num_patterns = 0;
  const index_t* row_start = nullptr;  //!< [M*H + 1]
  const index_t* row_base = nullptr;   //!< [M*H]: row_start[r] - pat_start[row_pat[r]]
  const index_t* row_pat = nullptr;    //!< [M*H]
  const index_t* mask_row = nullptr;   //!< [H]
  const index_t* pat_start = nullptr;  //!< [num_patterns + 1]
  const index_t* pat_cols = nullptr;   //!< readable 16 entries past pat_start[num_patterns]
};

//! A partition of the tokens of `token_rows` into windows, the same arrays as window_partitioner
//! (bit for bit), without sorting tokens. Rows split into bands (rows of one window row and one
//! mask row: one pattern per sample); a band's tokens in window column wc are a block, the same
//! run of its pattern on each row (pattern positions seg_[q][wc] .. seg_[q][wc+1], consecutive
//! token ids on a row). `build` sums block sizes into window sizes and plans; `write` walks each
//! group's windows row by row (slot order), then each row's runs (token order).
class row_partitioner {
 public:
  status build(const window_geometry& g, const token_rows& tr, planner<flops_cost>& pl,
               const encoder_plan_options& opt, std::vector<index_t>& sizes, encoder_partition& out) {
    H_ = g.height;
    p_ = g.window;
    off_ = g.offset();
    nww_ = g.windows_w();
    nwps_ = g.num_windows();
    const std::int64_t nw64 = static_cast<std::int64_t>(tr.M) * nwps_;
    if (nw64 > (std::int64_t{1} << 30)) return status::overflow;
    const index_t nw = static_cast<index_t>(nw64), stride = nww_ + 1;
    // bands: [band_[i], band_[i+1]) rows, window row wr's bands are band_first_[wr] .. band_first_[wr+1]
    band_.clear();
    band_first_.assign(static_cast<size_t>(g.windows_h()) + 1, 0);
    for (index_t h = 0; h < H_; ++h) {
      const bool window_start = h == 0 || (h + off_) % p_ == 0;
      if (window_start || tr.mask_row[h] != tr.mask_row[h - 1]) band_.push_back(h);
      if (window_start) band_first_[static_cast<size_t>((h + off_) / p_)] = static_cast<index_t>(band_.size()) - 1;
    }
    band_first_.back() = static_cast<index_t>(band_.size());
    band_.push_back(H_);
    // seg_[q * stride + wc]: index in pat_cols of pattern q's first column in window column wc or later
    seg_.resize(static_cast<size_t>(tr.num_patterns) * static_cast<size_t>(stride));
    for (index_t q = 0; q < tr.num_patterns; ++q) {
      const index_t* c = tr.pat_cols + tr.pat_start[q];
      const index_t L = tr.pat_start[q + 1] - tr.pat_start[q];
      index_t* sg = seg_.data() + static_cast<size_t>(q) * static_cast<size_t>(stride);
      index_t k = 0;
      sg[0] = tr.pat_start[q];
      for (index_t wc = 0; wc < nww_; ++wc) {
        const index_t lim = (wc + 1) * p_ - off_;
        while (k < L && c[k] < lim) ++k;
        sg[wc + 1] = tr.pat_start[q] + k;
      }
    }
    run_start_.resize(static_cast<size_t>(tr.num_patterns) + 1);
    run_col_.clear();
    run_len_.clear();
    for (index_t q = 0; q < tr.num_patterns; ++q) {
      run_start_[static_cast<size_t>(q)] = static_cast<index_t>(run_col_.size());
      const index_t* sg = seg_.data() + static_cast<size_t>(q) * static_cast<size_t>(stride);
      for (index_t wc = 0; wc < nww_; ++wc)
        if (sg[wc + 1] > sg[wc]) {
          run_col_.push_back(wc);
          run_len_.push_back(sg[wc + 1] - sg[wc]);
        }
    }
    run_start_.back() = static_cast<index_t>(run_col_.size());
    win_row_.resize(static_cast<size_t>(nwps_));
    for (index_t j = 0; j < nwps_; ++j) win_row_[static_cast<size_t>(j)] = j / nww_;
    win_h_.resize(static_cast<size_t>(g.windows_h()) + 1);
    for (index_t wr = 0; wr <= g.windows_h(); ++wr) win_h_[static_cast<size_t>(wr)] = std::min(H_, std::max(index_t{0}, wr * p_ - off_));
    h_win_.resize(static_cast<size_t>(H_));
    for (index_t h = 0; h < H_; ++h) h_win_[static_cast<size_t>(h)] = (h + off_) / p_ * nww_;
    win_slot_.resize(static_cast<size_t>(nw));
    sizes.assign(static_cast<size_t>(nw), 0);
    win_b_.resize(static_cast<size_t>(nw));
    for (index_t b = 0; b < tr.M; ++b) {
      std::fill_n(win_b_.data() + static_cast<size_t>(b) * nwps_, nwps_, b);
      for (size_t i = 0; i + 1 < band_.size(); ++i) {
        const index_t h = band_[i], rows = band_[i + 1] - h;
        const index_t* sg = seg_.data() + static_cast<size_t>(tr.row_pat[b * H_ + h]) * static_cast<size_t>(stride);
        if (sg[nww_] == sg[0]) continue;
        index_t* sz = sizes.data() + static_cast<size_t>(b) * nwps_ + static_cast<size_t>(h_win_[static_cast<size_t>(h)]);
        for (index_t wc = 0; wc < nww_; ++wc) sz[wc] += rows * (sg[wc + 1] - sg[wc]);
      }
    }
    return plan_windows(g, sizes, nw, pl, opt, groups_, out);
  }

  std::int64_t slots() const { return static_cast<std::int64_t>(groups_.num_groups()) * groups_.group_size; }

  //! window_partitioner::write's arrays: group g's windows in plan order, each window's tokens
  //! ascending (its rows top to bottom, a row's run left to right), padding at the end. Two
  //! passes, each writing forward and never reading the arena: in slot order, every row of every
  //! window of a group (a row's run is its pattern's entries in the window's columns, possibly
  //! none; the loop counts are the geometry's, not the mask's) writes gather, slot_window and
  //! slot_coord, recording each window's first slot; then scatter in token order, row by row, each
  //! of the row's pattern's non-empty runs continuing its window's slots. A run is at most p
  //! tokens: with p <= 16 it is written as a fixed block of 8 or 16 (vector stores, no
  //! data-dependent branch); entries past the run are overwritten by the next run or the group's
  //! padding (slot order) or by the next run (token order). Groups and rows whose blocks could
  //! pass the end of an array go entry by entry. (Before 2026-11-26 one slot-order pass wrote
  //! scatter too, as masked read-modify-write blocks: the whole arena of Swin-B for 128 masks took
  //! 1.14 ms to write against 0.76 ms now, this 2-core VM.)
  void write(const token_rows& tr, const encoder_partition& o, index_t* arena) const {
    if (p_ <= 8) write_blocks<8>(tr, o, arena);
    else if (p_ <= 16) write_blocks<16>(tr, o, arena);
    else write_blocks<0>(tr, o, arena);
  }

 private:
  //! The tables write reads, as plain pointers: the vector stores may alias anything, so members
  //! would be reloaded after each one.
  struct tables {
    index_t* gather;
    index_t* scatter;
    index_t* slot_window;
    index_t* slot_coord;
    index_t H, nww, nwps, stride, G;
    const index_t* seg;
    const index_t* win_b;
    const index_t* win_row;
    const index_t* win_h;
    const index_t* h_win;
    const index_t* row_pat;
    const index_t* row_base;
    const index_t* row_start;
    const index_t* pat_cols;
    const index_t* group_windows;
    const index_t* group_offsets;
    index_t* win_slot;
    const index_t* run_start;
    const index_t* run_col;
    const index_t* run_len;
  };

  //! Group gi in slot order (gather, slot_window, slot_coord; each window's first slot in
  //! win_slot). Fast: runs and padding as blocks of B, which may pass the group's end by up to B
  //! entries (the caller keeps them inside the arrays); otherwise entry by entry.
  template <int B, bool Fast>
  static void write_group(const tables& t, index_t gi) {
    const index_t end = (gi + 1) * t.G;
    index_t slot = gi * t.G;
    for (index_t e = t.group_offsets[gi], e1 = t.group_offsets[gi + 1]; e < e1; ++e) {
      const index_t w = t.group_windows[e];
      const index_t b = t.win_b[w], j = w - b * t.nwps;
      const index_t wr = t.win_row[j], wc = j - wr * t.nww;
      const index_t* const rp = t.row_pat + static_cast<size_t>(b) * t.H;
      const index_t* const rb = t.row_base + static_cast<size_t>(b) * t.H;
      t.win_slot[w] = slot;
      for (index_t h = t.win_h[wr], h1 = t.win_h[wr + 1]; h < h1; ++h) {
        const index_t* sg = t.seg + static_cast<size_t>(rp[h]) * static_cast<size_t>(t.stride) + wc;
        const index_t a = sg[0], n = sg[1] - a;
        const index_t t0 = rb[h] + a, hb = pack_coord(h, 0);
        const index_t* cols = t.pat_cols + a;
        if (Fast) {
          store_iota<B>(t.gather + slot, t0);
          store_fill<B>(t.slot_window + slot, w);
          store_or<B>(t.slot_coord + slot, hb, cols);
        } else {
          for (index_t k = 0; k < n; ++k) {
            t.gather[slot + k] = t0 + k;
            t.slot_window[slot + k] = w;
            t.slot_coord[slot + k] = hb | cols[k];
          }
        }
        slot += n;
      }
    }
    if (Fast) {
      for (; slot < end; slot += B) {
        store_fill<B>(t.gather + slot, pad_index);
        store_fill<B>(t.slot_window + slot, pad_index);
        store_fill<B>(t.slot_coord + slot, 0);
      }
    } else {
      std::fill(t.gather + slot, t.gather + end, pad_index);
      std::fill(t.slot_window + slot, t.slot_window + end, pad_index);
      std::fill(t.slot_coord + slot, t.slot_coord + end, index_t{0});
    }
  }

  //! Row r's scatter entries (token order): its pattern's run in each window column continues
  //! that window's slots (cursor: the row's window row's next slots). Fast: runs as blocks of B,
  //! up to B entries past the row.
  template <int B, bool Fast>
  static void write_scatter_row(const tables& t, size_t r, index_t h, index_t* cursor) {
    const index_t q = t.row_pat[r];
    index_t at = t.row_start[r];
    index_t* cur = cursor + t.h_win[h];
    for (index_t e = t.run_start[q], e1 = t.run_start[q + 1]; e < e1; ++e) {
      const index_t wc = t.run_col[e], n = t.run_len[e], s0 = cur[wc];
      cur[wc] = s0 + n;
      if (Fast) {
        store_iota<B>(t.scatter + at, s0);
      } else {
        for (index_t k = 0; k < n; ++k) t.scatter[at + k] = s0 + k;
      }
      at += n;
    }
  }

  template <int B>
  void write_blocks(const token_rows& tr, const encoder_partition& o, index_t* arena) const {
    tables t;
    t.gather = arena + o.gather.offset;
    t.scatter = arena + o.scatter.offset;
    t.slot_window = arena + o.slot_window.offset;
    t.slot_coord = arena + o.slot_coord.offset;
    t.H = H_;
    t.nww = nww_;
    t.nwps = nwps_;
    t.stride = nww_ + 1;
    t.G = o.group_size;
    t.seg = seg_.data();
    t.win_b = win_b_.data();
    t.win_row = win_row_.data();
    t.win_h = win_h_.data();
    t.h_win = h_win_.data();
    t.row_pat = tr.row_pat;
    t.row_base = tr.row_base;
    t.row_start = tr.row_start;
    t.pat_cols = tr.pat_cols;
    t.group_windows = groups_.windows.data();
    t.group_offsets = groups_.group_offsets.data();
    t.win_slot = win_slot_.data();
    t.run_start = run_start_.data();
    t.run_col = run_col_.data();
    t.run_len = run_len_.data();
    // groups whose blocks stay inside the arrays go the fast way, the last few entry by entry
    const index_t ng = o.num_groups;
    const std::int64_t total = static_cast<std::int64_t>(ng) * t.G;
    index_t gi = 0;
    if (B > 0)
      for (; gi < ng && static_cast<std::int64_t>(gi + 1) * t.G + B <= total; ++gi) write_group<B, true>(t, gi);
    for (; gi < ng; ++gi) write_group<B, false>(t, gi);
    // scatter, in token order, sample by sample: each window's cursor starts at its first slot
    const index_t M = tr.M, H = t.H;
    const index_t last = tr.row_start[static_cast<size_t>(M) * H] - B;  // rows ending by here: fast
    for (index_t b = 0; b < M; ++b) {
      index_t* const cursor = t.win_slot + static_cast<size_t>(b) * t.nwps;
      for (index_t h = 0; h < H; ++h) {
        const size_t r = static_cast<size_t>(b) * H + h;
        if (B > 0 && t.row_start[r + 1] <= last) write_scatter_row<B, true>(t, r, h, cursor);
        else write_scatter_row<B, false>(t, r, h, cursor);
      }
    }
  }

  index_t H_ = 0, p_ = 1, off_ = 0, nww_ = 1, nwps_ = 1;
  std::vector<index_t> band_, band_first_;  //!< bands of rows, by window row
  std::vector<index_t> seg_;                //!< per pattern and window column: index in pat_cols
  std::vector<index_t> win_b_;              //!< sample of each window
  std::vector<index_t> win_row_;            //!< window row of each window of a sample
  std::vector<index_t> h_win_;              //!< per token row: its window row's first window (wr * nww)
  //! per pattern q: its non-empty window columns, entries run_start_[q] .. run_start_[q+1] of
  //! run_col_ (the column) and run_len_ (its tokens on one row)
  std::vector<index_t> run_start_, run_col_, run_len_;
  std::vector<index_t> win_h_;              //!< window row wr covers token rows win_h_[wr] .. win_h_[wr+1]
  mutable std::vector<index_t> win_slot_;   //!< write's scratch: each window's first (then next) slot
  greenmim::plan groups_;
};

}  // namespace detail

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
