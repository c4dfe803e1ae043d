//! \file detail/window_partitioners.hpp
//! Private: the two builders of one window partition of an encoder plan, without the general
//! builders' per-call validation (the token lists they get are valid by construction):
//! `window_partitioner` sorts any token list into windows (Twins' LSA), `row_partitioner` walks
//! the tokens as rows of mask patterns without sorting (Swin's plain and shifted windows, the hot
//! path of encoder_planner). Both plan the window sizes into groups and write the same four
//! arrays (gather, scatter, slot_window, slot_coord), bit for bit; test_encoder_plan.cpp checks
//! them against partition.hpp. Also the SSE2 block stores they write with.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../config.hpp"
#include "../encoder_plan_types.hpp"
#include "../geometry.hpp"
#include "../planner.hpp"
#include "../status.hpp"

#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
#include <emmintrin.h>
#define GREENMIM_SSE2 1
#endif

namespace greenmim {
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

}  // namespace greenmim
