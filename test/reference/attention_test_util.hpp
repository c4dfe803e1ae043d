// Shared by the tests of the CPU reference attention (test_attention_*.cpp): logical
// [B, N, H, D] problems and their storage layouts, the window-by-window oracle, comparisons, the
// partitions every case runs over, and the record of measured errors (printed by
// test_attention_tolerances.cpp, which sorts last and so runs last).
#pragma once

#include <doctest/doctest.h>

#include <greenmim/random_masks.hpp>
#include <greenmim/models.hpp>
#include <greenmim/partition.hpp>
#include <greenmim/planner.hpp>
#include <greenmim/reference/attention.hpp>
#include <greenmim/reference/oracle.hpp>
#include <greenmim/windows.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

namespace gm_attention_test {

namespace gm = greenmim;
namespace ref = greenmim::reference;
using gm::index_t;
using ref::mask_mode;


// ---------------------------------------------------------------------------------------------
// Problems in "logical" form: contiguous [B, N, H, D] doubles plus the token axis' windows/coords.

struct logical {
  index_t B = 1, N = 0, H = 2, D = 4, p = 7;
  bool with_bias = true;
  double scale = 0;                     // 0: default
  std::vector<index_t> coords, windows; // per token
  std::vector<double> q, k, v, dout, bias;
  std::int64_t numel() const { return static_cast<std::int64_t>(B) * N * H * D; }
  std::int64_t bias_rows() const { return static_cast<std::int64_t>(2 * p - 1) * (2 * p - 1); }
};

inline double uni(gm::rng& r, double lo, double hi) { return lo + (hi - lo) * r.uniform(); }

inline void fill_random(logical& L, gm::rng& r, double amp = 1.0) {
  auto fill = [&](std::vector<double>& x, std::int64_t n, double a) {
    x.resize(static_cast<size_t>(n));
    for (auto& e : x) e = uni(r, -a, a);
  };
  fill(L.q, L.numel(), amp);
  fill(L.k, L.numel(), amp);
  fill(L.v, L.numel(), 1.0);
  fill(L.dout, L.numel(), 1.0);
  fill(L.bias, L.bias_rows() * L.H, 1.0);
}

// Token axis of one shared mask on a geometry: visible coords of a random mask-unit mask.
inline void shared_mask_tokens(logical& L, const gm::window_geometry& g, double ratio, std::uint64_t seed) {
  gm::mask_config cfg{224, 32, ratio};
  const std::vector<std::uint8_t> m = gm::random_mask(cfg, seed);
  REQUIRE(gm::visible_coords(gm::span<const std::uint8_t>(m), cfg.grid(), g.height, L.coords) == gm::status::success);
  L.N = static_cast<index_t>(L.coords.size());
  L.windows.assign(L.coords.size(), 0);
  REQUIRE(gm::token_windows(g, gm::span<const index_t>(L.coords), gm::span<index_t>(L.windows)) ==
          gm::status::success);
  L.p = g.window;
}

template <class T>
logical rounded(const logical& L) {
  logical R = L;
  for (auto* x : {&R.q, &R.k, &R.v, &R.dout, &R.bias})
    for (auto& e : *x) e = static_cast<double>(static_cast<T>(e));
  return R;
}

inline double max_abs(const std::vector<double>& a) {
  double m = 0;
  for (double x : a) m = std::max(m, std::fabs(x));
  return m;
}

// Max-norm relative error ||a - b||_inf / ||b||_inf (NaN if any entry is NaN).
inline double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(a[i] - b[i]);
    if (std::isnan(d)) return std::nan("");
    e = std::max(e, d);
  }
  const double m = max_abs(b);
  return m > 0 ? e / m : e;
}

// Largest errors measured, printed at the end when GREENMIM_TEST_VERBOSE is set.
inline std::map<std::string, double>& measured() {
  static std::map<std::string, double> m;
  return m;
}
inline void record(const std::string& what, double e) {
  double& x = measured()[what];
  x = std::max(x, e);
}

// ---------------------------------------------------------------------------------------------
// Storage layouts: the same logical [B, N, H, D] tensors in different memory layouts.

enum layout : int { contiguous = 0, packed, transposed, gapped, num_layouts };

// Three [B, N, H, D] views into one buffer (q, k, v or dq, dk, dv); elements of the buffer not
// covered by any view keep `sentinel`.
template <class T>
struct triple {
  std::vector<T> buf;
  gm::tensor_view<T, 4> v[3];
  std::vector<std::uint8_t> covered;

  triple(index_t B, index_t N, index_t H, index_t D, int lay, T sentinel = T(777)) {
    const std::int64_t n = static_cast<std::int64_t>(B) * N * H * D;
    std::int64_t size = 3 * n;
    if (lay == packed) {
      buf.assign(static_cast<size_t>(size), sentinel);
      auto full = gm::make_view(buf.data(), B, N, 3, H, D);
      REQUIRE(ref::split_qkv(full, v[0], v[1], v[2]) == gm::status::success);
    } else if (lay == gapped) {
      const std::int64_t sh = D + 3, sn = H * sh + 1, sb = N * sn + 2, one = B * sb + 5;
      buf.assign(static_cast<size_t>(3 * one), sentinel);
      for (int j = 0; j < 3; ++j) {
        v[j].data = buf.data() + j * one;
        const std::int64_t e[4] = {B, N, H, D}, s[4] = {sb, sn, sh, 1};
        for (int i = 0; i < 4; ++i) { v[j].extent[i] = e[i]; v[j].stride[i] = s[i]; }
      }
    } else {
      buf.assign(static_cast<size_t>(size), sentinel);
      for (int j = 0; j < 3; ++j) {
        if (lay == contiguous) {
          v[j] = gm::make_view(buf.data() + j * n, B, N, H, D);
        } else {  // storage order (h, b, d, n)
          v[j].data = buf.data() + j * n;
          const std::int64_t e[4] = {B, N, H, D};
          const std::int64_t s[4] = {static_cast<std::int64_t>(N) * D, 1, static_cast<std::int64_t>(B) * N * D, N};
          for (int i = 0; i < 4; ++i) { v[j].extent[i] = e[i]; v[j].stride[i] = s[i]; }
        }
      }
    }
    covered.assign(buf.size(), 0);
    for (int j = 0; j < 3; ++j)
      for (index_t b = 0; b < B; ++b)
        for (index_t t = 0; t < N; ++t)
          for (index_t h = 0; h < H; ++h)
            for (index_t d = 0; d < D; ++d) covered[static_cast<size_t>(&v[j](b, t, h, d) - buf.data())] = 1;
  }
  void write(int j, const std::vector<double>& x) {
    const auto& w = v[j];
    std::int64_t i = 0;
    for (std::int64_t b = 0; b < w.extent[0]; ++b)
      for (std::int64_t t = 0; t < w.extent[1]; ++t)
        for (std::int64_t h = 0; h < w.extent[2]; ++h)
          for (std::int64_t d = 0; d < w.extent[3]; ++d) w(b, t, h, d) = static_cast<T>(x[static_cast<size_t>(i++)]);
  }
  std::vector<double> read(int j) const {
    const auto& w = v[j];
    std::vector<double> x;
    for (std::int64_t b = 0; b < w.extent[0]; ++b)
      for (std::int64_t t = 0; t < w.extent[1]; ++t)
        for (std::int64_t h = 0; h < w.extent[2]; ++h)
          for (std::int64_t d = 0; d < w.extent[3]; ++d) x.push_back(static_cast<double>(w(b, t, h, d)));
    return x;
  }
  bool gaps_untouched(T sentinel = T(777)) const {
    for (size_t i = 0; i < buf.size(); ++i)
      if (!covered[i] && !(buf[i] == sentinel)) return false;
    return true;
  }
  gm::tensor_view<const T, 4> c(int j) const { return v[j]; }
};

struct outputs {
  std::vector<double> out, lse, dq, dk, dv, dbias;
};

// The bias table of L as a T view; the transposed layout stores it head-major.
template <class T>
gm::tensor_view<const T, 2> bias_view(const logical& L, int lay, std::vector<T>& store) {
  gm::tensor_view<const T, 2> b;
  if (!L.with_bias) return b;
  const std::int64_t R = L.bias_rows();
  store.assign(static_cast<size_t>(R * L.H), T(0));
  b.extent[0] = R;
  b.extent[1] = L.H;
  if (lay == transposed) {
    b.stride[0] = 1;
    b.stride[1] = R;
  } else {
    b.stride[0] = L.H;
    b.stride[1] = 1;
  }
  for (std::int64_t r = 0; r < R; ++r)
    for (std::int64_t h = 0; h < L.H; ++h)
      store[static_cast<size_t>(r * b.stride[0] + h * b.stride[1])] = static_cast<T>(L.bias[static_cast<size_t>(r * L.H + h)]);
  b.data = store.data();
  return b;
}

// Grouped forward (and backward) in precision T through layout `lay`; results in logical order.
template <class T>
void run_grouped(const logical& L, const gm::partition_indices& P, int lay, outputs& res, bool backward = true,
                 mask_mode mode = mask_mode::exact, double mask_value = -100) {
  triple<T> in(L.B, L.N, L.H, L.D, lay);
  in.write(0, L.q);
  in.write(1, L.k);
  in.write(2, L.v);
  std::vector<T> bstore;
  triple<T> out(L.B, L.N, L.H, L.D, (lay + 1) % num_layouts);
  std::vector<T> lse(static_cast<size_t>(L.B) * L.N * L.H, T(-555));
  ref::attention_args<T> a;
  a.q = in.c(0);
  a.k = in.c(1);
  a.v = in.c(2);
  a.part = gm::make_partition_view(P);
  a.bias = bias_view<T>(L, lay, bstore);
  a.window = L.p;
  a.scale = static_cast<T>(L.scale);
  a.mask = mode;
  a.mask_value = static_cast<T>(mask_value);
  a.out = out.v[0];
  a.lse = gm::make_view(lse.data(), L.B, L.N, L.H);
  REQUIRE(ref::group_attention_forward(a) == gm::status::success);
  CHECK(out.gaps_untouched());
  res.out = out.read(0);
  res.lse.assign(lse.begin(), lse.end());
  if (!backward) return;
  triple<T> dout(L.B, L.N, L.H, L.D, (lay + 2) % num_layouts);
  dout.write(0, L.dout);
  triple<T> grads(L.B, L.N, L.H, L.D, (lay + 3) % num_layouts);
  std::vector<T> dbias(static_cast<size_t>(L.with_bias ? L.bias_rows() * L.H : 0), T(0));
  ref::attention_backward_args<T> g;
  g.q = a.q;
  g.k = a.k;
  g.v = a.v;
  g.o = out.c(0);
  g.dout = dout.c(0);
  g.lse = gm::make_view(static_cast<const T*>(lse.data()), L.B, L.N, L.H);
  g.part = a.part;
  g.bias = a.bias;
  g.window = a.window;
  g.scale = a.scale;
  g.mask = mode;
  g.mask_value = a.mask_value;
  g.dq = grads.v[0];
  g.dk = grads.v[1];
  g.dv = grads.v[2];
  if (L.with_bias) g.dbias = gm::make_view(dbias.data(), L.bias_rows(), L.H);
  REQUIRE(ref::group_attention_backward(g) == gm::status::success);
  CHECK(grads.gaps_untouched());
  res.dq = grads.read(0);
  res.dk = grads.read(1);
  res.dv = grads.read(2);
  res.dbias.assign(dbias.begin(), dbias.end());
}

// The oracle in double on contiguous storage.
inline void run_oracle(const logical& L, outputs& res, bool backward = true) {
  std::vector<double> out(static_cast<size_t>(L.numel())), lse(static_cast<size_t>(L.B) * L.N * L.H);
  ref::oracle_args<double> a;
  a.q = gm::make_view(static_cast<const double*>(L.q.data()), L.B, L.N, L.H, L.D);
  a.k = gm::make_view(static_cast<const double*>(L.k.data()), L.B, L.N, L.H, L.D);
  a.v = gm::make_view(static_cast<const double*>(L.v.data()), L.B, L.N, L.H, L.D);
  a.token_window = gm::span<const index_t>(L.windows);
  a.token_coord = gm::span<const index_t>(L.coords);
  if (L.with_bias) a.bias = gm::make_view(static_cast<const double*>(L.bias.data()), L.bias_rows(), L.H);
  a.window = L.p;
  a.scale = L.scale;
  a.out = gm::make_view(out.data(), L.B, L.N, L.H, L.D);
  a.lse = gm::make_view(lse.data(), L.B, L.N, L.H);
  REQUIRE(ref::window_attention_oracle(a) == gm::status::success);
  res.out = out;
  res.lse = lse;
  if (!backward) return;
  std::vector<double> dq(out.size()), dk(out.size()), dv(out.size()),
      dbias(static_cast<size_t>(L.with_bias ? L.bias_rows() * L.H : 0), 0.0);
  ref::oracle_backward_args<double> g;
  g.q = a.q;
  g.k = a.k;
  g.v = a.v;
  g.dout = gm::make_view(static_cast<const double*>(L.dout.data()), L.B, L.N, L.H, L.D);
  g.token_window = a.token_window;
  g.token_coord = a.token_coord;
  g.bias = a.bias;
  g.window = a.window;
  g.scale = a.scale;
  g.dq = gm::make_view(dq.data(), L.B, L.N, L.H, L.D);
  g.dk = gm::make_view(dk.data(), L.B, L.N, L.H, L.D);
  g.dv = gm::make_view(dv.data(), L.B, L.N, L.H, L.D);
  if (L.with_bias) g.dbias = gm::make_view(dbias.data(), L.bias_rows(), L.H);
  REQUIRE(ref::window_attention_oracle_backward(g) == gm::status::success);
  res.dq = dq;
  res.dk = dk;
  res.dv = dv;
  res.dbias = dbias;
}

// Compares every output of `a` against `b`; records the largest error under `tag`.
inline void compare(const outputs& a, const outputs& b, double tol, const std::string& tag, bool backward = true) {
  const double ef = std::max(rel_err(a.out, b.out), rel_err(a.lse, b.lse));
  CHECK(ef <= tol);
  record(tag + " forward", ef);
  if (!backward) return;
  double eb = std::max({rel_err(a.dq, b.dq), rel_err(a.dk, b.dk), rel_err(a.dv, b.dv)});
  if (!b.dbias.empty()) eb = std::max(eb, rel_err(a.dbias, b.dbias));
  CHECK(eb <= tol);
  record(tag + " backward", eb);
}

// ---------------------------------------------------------------------------------------------
// Partitions.

// Independent builder (no partition.hpp): windows = tokens with equal window id, shuffled and
// first-fit into groups of G = max window + [0, extra] slots, randomly choosing among groups
// with room. `scramble` permutes the slots inside each group (windows interleaved, padding
// anywhere): not what the builders emit, but nothing in the reference may depend on slot order.
inline gm::partition_indices hand_partition(const std::vector<index_t>& token_window,
                                     const std::vector<index_t>& coords, gm::rng& r, index_t extra,
                                     bool scramble) {
  std::map<index_t, std::vector<index_t>> win;
  for (size_t t = 0; t < token_window.size(); ++t) win[token_window[t]].push_back(static_cast<index_t>(t));
  std::vector<index_t> ids;
  index_t maxw = 0;
  for (auto& kv : win) {
    ids.push_back(kv.first);
    maxw = std::max<index_t>(maxw, static_cast<index_t>(kv.second.size()));
  }
  for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[r.below(i)]);
  const index_t G = maxw + static_cast<index_t>(r.below(static_cast<std::uint64_t>(extra) + 1));
  std::vector<std::vector<index_t>> groups;
  std::vector<index_t> fill;
  for (index_t id : ids) {
    const index_t w = static_cast<index_t>(win[id].size());
    size_t k = r.below(groups.size() + 1);
    if (k < groups.size() && fill[k] + w > G) {
      k = groups.size();
      for (size_t j = 0; j < groups.size(); ++j)
        if (fill[j] + w <= G) { k = j; break; }
    }
    if (k == groups.size()) { groups.emplace_back(); fill.push_back(0); }
    groups[k].push_back(id);
    fill[k] += w;
  }
  gm::partition_indices P;
  P.group_size = G;
  P.num_groups = static_cast<index_t>(groups.size());
  P.num_tokens = static_cast<index_t>(token_window.size());
  P.scatter.assign(token_window.size(), -1);
  for (auto& grp : groups) {
    std::vector<index_t> slots;
    for (index_t id : grp)
      for (index_t t : win[id]) slots.push_back(t);
    slots.resize(static_cast<size_t>(G), gm::pad_index);
    if (scramble)
      for (size_t i = slots.size(); i > 1; --i) std::swap(slots[i - 1], slots[r.below(i)]);
    for (index_t t : slots) {
      const index_t s = static_cast<index_t>(P.gather.size());
      P.gather.push_back(t);
      P.slot_window.push_back(t < 0 ? gm::pad_index : token_window[static_cast<size_t>(t)]);
      P.slot_coord.push_back(t < 0 ? 0 : coords[static_cast<size_t>(t)]);
      if (t >= 0) P.scatter[static_cast<size_t>(t)] = s;
    }
  }
  return P;
}

// The project's path: window_list -> make_plan(strategy) -> build_partition.
inline gm::partition_indices planned_partition(const gm::window_list& wl, gm::strategy strat, index_t channels) {
  const std::vector<index_t> sizes = wl.sizes();
  gm::plan pl;
  gm::planner_options opt;
  opt.strat = strat;
  REQUIRE(gm::make_plan(gm::span<const index_t>(sizes), opt, gm::flops_cost{channels}, pl) == gm::status::success);
  gm::partition_indices P;
  REQUIRE(gm::build_partition(pl, wl, P) == gm::status::success);
  return P;
}

struct named_partition {
  std::string name;
  gm::partition_indices part;
};

// All partitions a test runs over: hand-made (plain and scrambled), the four planner strategies
// and the released 'masking' mode (one group in token order).
inline std::vector<named_partition> all_partitions(const logical& L, const gm::window_list& wl, gm::rng& r) {
  std::vector<named_partition> v;
  v.push_back({"hand", hand_partition(L.windows, L.coords, r, 6, false)});
  v.push_back({"hand-scrambled", hand_partition(L.windows, L.coords, r, 6, true)});
  const gm::strategy strats[] = {gm::strategy::fast, gm::strategy::paper, gm::strategy::per_window,
                                 gm::strategy::single};
  for (gm::strategy s : strats) v.push_back({gm::strategy_name(s), planned_partition(wl, s, L.H * L.D)});
  gm::partition_indices single;
  REQUIRE(gm::build_single_group(wl, single) == gm::status::success);
  v.push_back({"masking-mode", single});
  return v;
}

// In the shared-mask layout the planner's window index equals the geometry window id, so the
// builder's slot_window matches L.windows.
inline gm::window_list shared_windows(const logical& L, const gm::window_geometry& g) {
  gm::window_list wl;
  REQUIRE(gm::build_windows(g, gm::span<const index_t>(L.coords), wl) == gm::status::success);
  return wl;
}


}  // namespace gm_attention_test
