// Tests of the CPU reference of grouped window attention (reference/attention.hpp):
// grouped == window-by-window oracle (forward and backward) over random masks, shifts, window
// sizes, plans and hand-made partitions; finite differences; per-sample flattened batches;
// bad inputs; NaN/Inf propagation without leaks across windows of one group.
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

namespace gm = greenmim;
namespace ref = greenmim::reference;
using gm::index_t;
using ref::mask_mode;

namespace {

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

double uni(gm::rng& r, double lo, double hi) { return lo + (hi - lo) * r.uniform(); }

void fill_random(logical& L, gm::rng& r, double amp = 1.0) {
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
void shared_mask_tokens(logical& L, const gm::window_geometry& g, double ratio, std::uint64_t seed) {
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

double max_abs(const std::vector<double>& a) {
  double m = 0;
  for (double x : a) m = std::max(m, std::fabs(x));
  return m;
}

// Max-norm relative error ||a - b||_inf / ||b||_inf (NaN if any entry is NaN).
double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
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
std::map<std::string, double>& measured() {
  static std::map<std::string, double> m;
  return m;
}
void record(const std::string& what, double e) {
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
void run_oracle(const logical& L, outputs& res, bool backward = true) {
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
void compare(const outputs& a, const outputs& b, double tol, const std::string& tag, bool backward = true) {
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
gm::partition_indices hand_partition(const std::vector<index_t>& token_window,
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
gm::partition_indices planned_partition(const gm::window_list& wl, gm::strategy strat, index_t channels) {
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
std::vector<named_partition> all_partitions(const logical& L, const gm::window_list& wl, gm::rng& r) {
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
gm::window_list shared_windows(const logical& L, const gm::window_geometry& g) {
  gm::window_list wl;
  REQUIRE(gm::build_windows(g, gm::span<const index_t>(L.coords), wl) == gm::status::success);
  return wl;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

TEST_CASE("reference attention: grouped == window-by-window oracle (double, 1e-12)") {
  gm::rng r(2022, 1);
  int runs = 0;
  for (index_t p : {7, 14}) {
    for (index_t grid : {14, 28, 56}) {
      if (p == 14 && grid == 56) continue;  // 196-token windows: covered by float below
      for (bool shifted : {false, true}) {
        const gm::window_geometry g = gm::make_window_geometry(grid, grid, p, shifted ? p / 2 : 0);
        for (double ratio : {0.0, 0.5, 0.75, 0.9}) {
          if (ratio == 0.0 && grid > 14) continue;
          logical L;
          L.B = grid == 56 ? 1 : 2;
          L.H = 2;
          L.D = grid == 56 ? 4 : 8;
          shared_mask_tokens(L, g, ratio, 1000 + runs);
          L.p = g.window;
          fill_random(L, r, runs % 3 == 0 ? 3.0 : 1.0);  // some peaky softmaxes
          L.with_bias = runs % 5 != 4;
          const gm::window_list wl = shared_windows(L, g);
          outputs want;
          run_oracle(L, want);
          for (const auto& np : all_partitions(L, wl, r)) {
            if (np.part.num_groups == 1 && L.N > 800) continue;  // G = N > 800: slow, adds nothing
            CAPTURE(p);
            CAPTURE(grid);
            CAPTURE(shifted);
            CAPTURE(ratio);
            CAPTURE(np.name);
            outputs got;
            run_grouped<double>(L, np.part, runs % num_layouts, got);
            compare(got, want, 1e-12, "double");
            ++runs;
          }
        }
      }
    }
  }
  CHECK(runs > 100);
}

TEST_CASE("reference attention: float grouped == double oracle (1e-5)") {
  gm::rng r(7, 2);
  int runs = 0;
  struct cfg { index_t p, grid; double ratio; };
  for (cfg c : {cfg{7, 56, 0.75}, cfg{7, 28, 0.5}, cfg{7, 14, 0.75}, cfg{14, 56, 0.75}, cfg{14, 28, 0.5}}) {
    for (bool shifted : {false, true}) {
      const gm::window_geometry g = gm::make_window_geometry(c.grid, c.grid, c.p, shifted ? c.p / 2 : 0);
      logical L;
      L.B = c.grid == 56 ? 1 : 2;
      L.H = 2;
      L.D = 16;
      shared_mask_tokens(L, g, c.ratio, 77 + runs);
      fill_random(L, r, 2.0);
      const gm::window_list wl = shared_windows(L, g);
      const logical R = rounded<float>(L);  // the oracle sees exactly the float inputs
      outputs want;
      run_oracle(R, want);
      for (const auto& np : all_partitions(L, wl, r)) {
        if (np.part.num_groups == 1 && L.N > 400) continue;  // G = N: slow and adds nothing in float
        CAPTURE(c.p);
        CAPTURE(c.grid);
        CAPTURE(np.name);
        outputs got;
        run_grouped<float>(R, np.part, runs % num_layouts, got);
        compare(got, want, 1e-5, "float");
        ++runs;
      }
    }
  }
}

TEST_CASE("reference attention: additive mask (-100) equals the oracle; finite mask matches a dense group") {
  gm::rng r(11, 3);
  const gm::window_geometry g = gm::make_window_geometry(28, 28, 7, 3);
  logical L;
  L.B = 2;
  shared_mask_tokens(L, g, 0.75, 5);
  fill_random(L, r);
  const gm::window_list wl = shared_windows(L, g);
  outputs want;
  run_oracle(L, want);
  for (const auto& np : all_partitions(L, wl, r)) {
    CAPTURE(np.name);
    outputs got;
    run_grouped<double>(L, np.part, contiguous, got, true, mask_mode::additive, -100.0);
    compare(got, want, 1e-12, "additive -100");
  }

  // mask_value -1: cross-window pairs and zero padding take part; compare with a dense softmax
  // over all G slots of each group written out here.
  const gm::partition_indices P = hand_partition(L.windows, L.coords, r, 5, true);
  outputs got;
  run_grouped<double>(L, P, gapped, got, false, mask_mode::additive, -1.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(L.D));
  double err = 0;
  const index_t G = P.group_size;
  for (index_t b = 0; b < L.B; ++b)
    for (index_t h = 0; h < L.H; ++h)
      for (index_t gi = 0; gi < P.num_groups; ++gi)
        for (index_t i = 0; i < G; ++i) {
          const index_t ti = P.gather[gi * G + i];
          if (ti < 0) continue;
          auto at = [&](const std::vector<double>& x, index_t t, index_t d) {
            return t < 0 ? 0.0 : x[static_cast<size_t>(((static_cast<std::int64_t>(b) * L.N + t) * L.H + h) * L.D + d)];
          };
          std::vector<double> s(static_cast<size_t>(G));
          double m = -1e300;
          for (index_t j = 0; j < G; ++j) {
            const index_t tj = P.gather[gi * G + j];
            double acc = 0;
            for (index_t d = 0; d < L.D; ++d) acc += scale * at(L.q, ti, d) * at(L.k, tj, d);
            if (tj >= 0 && L.windows[ti] == L.windows[tj]) {
              const index_t ci = L.coords[ti], cj = L.coords[tj];
              acc += L.bias[static_cast<size_t>(
                  gm::rel_pos_index(gm::coord_h(ci), gm::coord_w(ci), gm::coord_h(cj), gm::coord_w(cj), L.p) * L.H + h)];
            } else {
              acc += -1.0;
            }
            s[j] = acc;
            m = std::max(m, acc);
          }
          double l = 0;
          for (auto& x : s) l += (x = std::exp(x - m));
          for (index_t d = 0; d < L.D; ++d) {
            double o = 0;
            for (index_t j = 0; j < G; ++j) o += s[j] / l * at(L.v, P.gather[gi * G + j], d);
            err = std::max(err, std::fabs(o - at(got.out, ti, d)));
          }
          err = std::max(err, std::fabs(m + std::log(l) - got.lse[static_cast<size_t>((static_cast<std::int64_t>(b) * L.N + ti) * L.H + h)]));
        }
  CHECK(err < 1e-12);
  // ... and it is NOT the oracle any more (the mask is finite).
  CHECK(rel_err(got.out, want.out) > 1e-6);
}

namespace {

// Central finite differences of loss = sum(dout * out) with respect to every input of the grouped
// forward (q, k, v, bias) against the grouped backward; and the same for the oracle.
void finite_difference_check(logical L, const gm::partition_indices& P, mask_mode mode, double mask_value,
                             bool oracle) {
  auto loss = [&](const logical& X) {
    outputs o;
    if (oracle)
      run_oracle(X, o, false);
    else
      run_grouped<double>(X, P, contiguous, o, false, mode, mask_value);
    double s = 0;
    for (size_t i = 0; i < o.out.size(); ++i) s += X.dout[i] * o.out[i];
    return s;
  };
  outputs an;
  if (oracle)
    run_oracle(L, an);
  else
    run_grouped<double>(L, P, contiguous, an, true, mode, mask_value);
  const double eps = 1e-5;
  auto fd = [&](std::vector<double> logical::*member) {
    std::vector<double> g((L.*member).size());
    for (size_t i = 0; i < g.size(); ++i) {
      const double x = (L.*member)[i];
      (L.*member)[i] = x + eps;
      const double lp = loss(L);
      (L.*member)[i] = x - eps;
      const double lm = loss(L);
      (L.*member)[i] = x;
      g[i] = (lp - lm) / (2 * eps);
    }
    return g;
  };
  const double eq = rel_err(an.dq, fd(&logical::q)), ek = rel_err(an.dk, fd(&logical::k)),
               ev = rel_err(an.dv, fd(&logical::v)), eb = rel_err(an.dbias, fd(&logical::bias));
  CHECK(eq < 1e-7);
  CHECK(ek < 1e-7);
  CHECK(ev < 1e-7);
  CHECK(eb < 1e-7);
  record(std::string(oracle ? "fd oracle" : mode == mask_mode::exact ? "fd grouped exact" : "fd grouped additive"),
         std::max({eq, ek, ev, eb}));
}

}  // namespace

TEST_CASE("reference attention: backward == central finite differences (double)") {
  gm::rng r(3, 4);
  const gm::window_geometry g = gm::make_window_geometry(14, 14, 7, 3);
  logical L;
  L.B = 1;
  L.H = 2;
  L.D = 3;  // odd head_dim on purpose
  shared_mask_tokens(L, g, 0.75, 9);
  fill_random(L, r, 1.5);
  // a hand partition that really merges windows into shared groups
  const std::vector<index_t> sizes = gm::window_sizes(g, gm::span<const index_t>(L.coords));
  const index_t nonempty = static_cast<index_t>(sizes.size() - std::count(sizes.begin(), sizes.end(), 0));
  gm::partition_indices P = hand_partition(L.windows, L.coords, r, 4, false);
  for (int tries = 0; tries < 50 && P.num_groups >= nonempty; ++tries) P = hand_partition(L.windows, L.coords, r, 4, false);
  REQUIRE(P.num_groups < nonempty);
  SUBCASE("grouped, exact mask") { finite_difference_check(L, P, mask_mode::exact, 0, false); }
  SUBCASE("grouped, additive mask -2 (cross-window pairs carry gradient)") {
    finite_difference_check(L, P, mask_mode::additive, -2.0, false);
  }
  SUBCASE("oracle") { finite_difference_check(L, P, mask_mode::exact, 0, true); }
}

TEST_CASE("reference attention: per-sample flattened batches equal per-sample oracles") {
  gm::rng r(5, 5);
  int runs = 0;
  for (index_t p : {7, 14}) {
    for (bool shifted : {false, true}) {
      for (bool aligned : {true, false}) {
        const index_t grid = p == 7 ? 14 : 28;
        const gm::window_geometry g = gm::make_window_geometry(grid, grid, p, shifted ? p / 2 : 0);
        const index_t S = 4;
        // Per-sample visible sets: random mask-unit masks (one stream per sample) or arbitrary
        // keep sets with per-sample keep rates (one sample keeps nothing; with p = 7 one keeps
        // everything).
        std::vector<std::uint8_t> keep(static_cast<size_t>(S) * grid * grid, 0);
        for (index_t b = 0; b < S; ++b) {
          if (aligned) {
            gm::mask_config cfg{224, 32, b == 0 ? 0.9 : 0.75};
            const std::vector<std::uint8_t> m = gm::random_mask(cfg, 99 + runs, static_cast<std::uint64_t>(b));
            const index_t u = grid / cfg.grid();
            for (index_t h = 0; h < grid; ++h)
              for (index_t w = 0; w < grid; ++w)
                keep[static_cast<size_t>((b * grid + h) * grid + w)] = m[static_cast<size_t>((h / u) * cfg.grid() + w / u)];
          } else {
            const double rate7[] = {0.0, 0.1, 0.5, 1.0}, rate14[] = {0.0, 0.05, 0.25, 0.6};
            const double rate = p == 7 ? rate7[b] : rate14[b];
            for (index_t i = 0; i < grid * grid; ++i)
              keep[static_cast<size_t>(b * grid * grid + i)] = r.uniform() < rate;
          }
        }
        std::vector<index_t> cu, coords;
        REQUIRE(gm::keep_mask_coords(gm::span<const std::uint8_t>(keep), S, grid, grid, cu, coords) == gm::status::success);
        gm::window_list wl;
        REQUIRE(gm::build_windows_per_sample(g, gm::span<const index_t>(cu), gm::span<const index_t>(coords), wl) ==
                gm::status::success);
        logical L;
        L.B = 1;
        L.H = 2;
        L.D = 8;
        L.p = g.window;
        L.N = wl.num_tokens;
        L.coords = wl.coords;
        L.windows.assign(static_cast<size_t>(L.N), -1);
        for (index_t w = 0; w < wl.num_windows(); ++w)
          for (index_t t : wl.window(w)) L.windows[static_cast<size_t>(t)] = w;
        fill_random(L, r, 2.0);
        // Per-sample oracles, each on its own token range with local window ids.
        outputs want;
        want.dbias.assign(L.bias.size(), 0.0);
        for (index_t b = 0; b < S; ++b) {
          logical Ls = L;
          Ls.N = cu[b + 1] - cu[b];
          const std::int64_t row = static_cast<std::int64_t>(L.H) * L.D;
          auto slice = [&](const auto& x, std::int64_t w) {
            return std::decay_t<decltype(x)>(x.begin() + cu[b] * w, x.begin() + cu[b + 1] * w);
          };
          Ls.q = slice(L.q, row);
          Ls.k = slice(L.k, row);
          Ls.v = slice(L.v, row);
          Ls.dout = slice(L.dout, row);
          Ls.coords = slice(L.coords, 1);
          Ls.windows.clear();
          for (index_t c : Ls.coords) Ls.windows.push_back(g.window_id(gm::coord_h(c), gm::coord_w(c)));
          outputs o;
          run_oracle(Ls, o);
          for (auto pr : {std::make_pair(&want.out, &o.out), std::make_pair(&want.dq, &o.dq),
                          std::make_pair(&want.dk, &o.dk), std::make_pair(&want.dv, &o.dv),
                          std::make_pair(&want.lse, &o.lse)})
            pr.first->insert(pr.first->end(), pr.second->begin(), pr.second->end());
          for (size_t i = 0; i < want.dbias.size(); ++i) want.dbias[i] += o.dbias[i];
        }
        for (const auto& np : all_partitions(L, wl, r)) {
          CAPTURE(p);
          CAPTURE(shifted);
          CAPTURE(aligned);
          CAPTURE(np.name);
          if (np.part.num_groups == 1 && L.N > 600 && np.name != "single") continue;  // keep one G = N run
          // windows of different samples share groups (always so with the single group)
          if (np.name == "single") {
            std::vector<std::uint8_t> seen(static_cast<size_t>(S), 0);
            for (index_t s = 0; s < np.part.group_size; ++s)
              if (np.part.gather[s] >= 0) seen[static_cast<size_t>(np.part.slot_window[s] / g.num_windows())] = 1;
            CHECK(std::count(seen.begin(), seen.end(), 1) >= 2);
          }
          outputs got;
          run_grouped<double>(L, np.part, runs % num_layouts, got);
          compare(got, want, 1e-12, "per-sample double");
          ++runs;
        }
      }
    }
  }
}

namespace {

// A small valid forward set-up to break one piece at a time.
struct bad_input_fixture {
  logical L;
  gm::partition_indices P;
  std::vector<double> q, k, v, out, lse, bias;
  ref::attention_args<double> a;

  bad_input_fixture() {
    gm::rng r(1, 9);
    const gm::window_geometry g = gm::make_window_geometry(14, 14, 7, 0);
    L.B = 2;
    shared_mask_tokens(L, g, 0.5, 3);
    fill_random(L, r);
    P = hand_partition(L.windows, L.coords, r, 0, false);
    P.group_size += 3;  // re-layout with three padding slots per group
    gm::partition_indices Q = P;
    Q.gather.clear();
    Q.slot_window.clear();
    Q.slot_coord.clear();
    const index_t G0 = P.group_size - 3;
    for (index_t gi = 0; gi < P.num_groups; ++gi) {
      for (index_t s = 0; s < P.group_size; ++s) {
        const bool real = s < G0;
        const size_t src = static_cast<size_t>(gi * G0 + s);
        Q.gather.push_back(real ? P.gather[src] : gm::pad_index);
        Q.slot_window.push_back(real ? P.slot_window[src] : gm::pad_index);
        Q.slot_coord.push_back(real ? P.slot_coord[src] : 0);
        if (real && Q.gather.back() >= 0) Q.scatter[static_cast<size_t>(Q.gather.back())] = static_cast<index_t>(Q.gather.size() - 1);
      }
    }
    P = Q;
    q = L.q;
    k = L.k;
    v = L.v;
    bias = L.bias;
    out.assign(q.size(), 12345.0);
    lse.assign(static_cast<size_t>(L.B) * L.N * L.H, 12345.0);
    a.q = gm::make_view(static_cast<const double*>(q.data()), L.B, L.N, L.H, L.D);
    a.k = gm::make_view(static_cast<const double*>(k.data()), L.B, L.N, L.H, L.D);
    a.v = gm::make_view(static_cast<const double*>(v.data()), L.B, L.N, L.H, L.D);
    a.bias = gm::make_view(static_cast<const double*>(bias.data()), L.bias_rows(), L.H);
    a.window = L.p;
    a.out = gm::make_view(out.data(), L.B, L.N, L.H, L.D);
    a.lse = gm::make_view(lse.data(), L.B, L.N, L.H);
  }
  bool untouched() const {
    for (double x : out)
      if (x != 12345.0) return false;
    for (double x : lse)
      if (x != 12345.0) return false;
    return true;
  }
  // Runs the forward with `args` and partition `part`: expects `want` and nothing written.
  void expect(gm::status want, ref::attention_args<double> args, const gm::partition_indices* part = nullptr) {
    const gm::partition_indices& pp = part ? *part : P;
    args.part = gm::make_partition_view(pp);
    CHECK(ref::can_implement(args) == want);
    CHECK(ref::group_attention_forward(args) == want);
    CHECK(untouched());
  }
  index_t first_pad() const {
    for (size_t s = 0; s < P.gather.size(); ++s)
      if (P.gather[s] < 0) return static_cast<index_t>(s);
    return -1;
  }
  index_t first_real() const {
    for (size_t s = 0; s < P.gather.size(); ++s)
      if (P.gather[s] >= 0) return static_cast<index_t>(s);
    return -1;
  }
};

}  // namespace

TEST_CASE("reference attention: bad inputs are refused with a status and nothing is written") {
  bad_input_fixture f;
  using gm::status;
  {
    auto a = f.a;
    a.part = gm::make_partition_view(f.P);
    REQUIRE(ref::can_implement(a) == status::success);
  }
  SUBCASE("shapes and strides") {
    auto a = f.a;
    a.k.extent[3] = f.L.D - 1;
    f.expect(status::shape_mismatch, a);
    a = f.a;
    a.v.extent[0] = f.L.B + 1;
    f.expect(status::shape_mismatch, a);
    a = f.a;
    a.out.extent[1] = f.L.N - 1;
    f.expect(status::shape_mismatch, a);
    a = f.a;
    a.lse.extent[2] = f.L.H + 1;
    f.expect(status::shape_mismatch, a);
    a = f.a;
    a.q.stride[3] = -1;
    f.expect(status::shape_mismatch, a);
    a = f.a;
    a.out.stride[1] = 0;  // every token would write the same row
    f.expect(status::shape_mismatch, a);
    a = f.a;
    a.out.stride[2] = 1;  // heads overlap inside a row
    f.expect(status::shape_mismatch, a);
    a = f.a;
    a.q.data = nullptr;
    f.expect(status::invalid_argument, a);
    a = f.a;
    a.q.extent[3] = a.k.extent[3] = a.v.extent[3] = a.out.extent[3] = 0;
    f.expect(status::invalid_argument, a);
    a = f.a;
    a.mask = static_cast<mask_mode>(7);
    f.expect(status::invalid_argument, a);
  }
  SUBCASE("bias table") {
    auto a = f.a;
    a.bias.extent[0] -= 1;
    f.expect(status::shape_mismatch, a);
    a = f.a;
    a.bias.extent[1] += 1;
    f.expect(status::shape_mismatch, a);
    a = f.a;
    a.window = 0;
    f.expect(status::invalid_argument, a);
    a = f.a;
    a.window = 6;  // table of a 6-window: wrong number of rows
    f.expect(status::shape_mismatch, a);
  }
  SUBCASE("partition indices") {
    const index_t pad = f.first_pad(), real = f.first_real();
    REQUIRE(pad >= 0);
    REQUIRE(real >= 0);
    const index_t t0 = f.P.gather[static_cast<size_t>(real)];
    {
      auto P = f.P;
      P.num_tokens += 1;
      f.expect(status::shape_mismatch, f.a, &P);
    }
    {
      auto P = f.P;
      P.gather[static_cast<size_t>(real)] = f.L.N;
      f.expect(status::out_of_range, f.a, &P);
    }
    {
      auto P = f.P;
      P.scatter[0] = P.num_slots();
      f.expect(status::out_of_range, f.a, &P);
    }
    {  // a token gathered twice (a padding slot reads token t0 too)
      auto P = f.P;
      P.gather[static_cast<size_t>(pad)] = t0;
      P.slot_window[static_cast<size_t>(pad)] = f.P.slot_window[static_cast<size_t>(real)];
      P.slot_coord[static_cast<size_t>(pad)] = f.P.slot_coord[static_cast<size_t>(real)];
      f.expect(status::not_covered, f.a, &P);
    }
    {  // a token gathered by no slot
      auto P = f.P;
      P.gather[static_cast<size_t>(real)] = gm::pad_index;
      P.slot_window[static_cast<size_t>(real)] = gm::pad_index;
      f.expect(status::not_covered, f.a, &P);
    }
    {  // gather and scatter not inverse
      auto P = f.P;
      const index_t other = P.scatter[static_cast<size_t>(t0 == 0 ? 1 : 0)];
      std::swap(P.gather[static_cast<size_t>(real)], P.gather[static_cast<size_t>(other)]);
      f.expect(status::not_covered, f.a, &P);
    }
    {
      auto P = f.P;
      P.slot_window[static_cast<size_t>(real)] = gm::pad_index;
      f.expect(status::out_of_range, f.a, &P);
    }
    {
      auto P = f.P;
      P.slot_window[static_cast<size_t>(pad)] = 0;
      f.expect(status::out_of_range, f.a, &P);
    }
    {  // two tokens of one window further apart than p: no bucket in the table
      auto P = f.P;
      const index_t c = P.slot_coord[static_cast<size_t>(real)];
      P.slot_coord[static_cast<size_t>(real)] = gm::pack_coord(gm::coord_h(c) + 40, gm::coord_w(c));
      f.expect(status::out_of_range, f.a, &P);
      auto a = f.a;  // without a bias table the coordinates are not used
      a.bias = gm::tensor_view<const double, 2>{};
      a.part = gm::make_partition_view(P);
      CHECK(ref::can_implement(a) == status::success);
    }
  }
  SUBCASE("backward") {
    auto fa = f.a;
    fa.part = gm::make_partition_view(f.P);
    REQUIRE(ref::group_attention_forward(fa) == status::success);
    std::vector<double> dq(f.q.size(), 5.0), dk(f.q.size(), 5.0), dv(f.q.size(), 5.0), db(f.bias.size(), 5.0);
    ref::attention_backward_args<double> g;
    g.q = fa.q;
    g.k = fa.k;
    g.v = fa.v;
    g.o = fa.out;
    g.dout = fa.q;
    g.lse = fa.lse;
    g.part = fa.part;
    g.bias = fa.bias;
    g.window = fa.window;
    g.dq = gm::make_view(dq.data(), f.L.B, f.L.N, f.L.H, f.L.D);
    g.dk = gm::make_view(dk.data(), f.L.B, f.L.N, f.L.H, f.L.D);
    g.dv = gm::make_view(dv.data(), f.L.B, f.L.N, f.L.H, f.L.D);
    g.dbias = gm::make_view(db.data(), f.L.bias_rows(), f.L.H);
    REQUIRE(ref::can_implement(g) == status::success);
    auto expect = [&](status want, const ref::attention_backward_args<double>& x) {
      CHECK(ref::can_implement(x) == want);
      CHECK(ref::group_attention_backward(x) == want);
      for (auto* buf : {&dq, &dk, &dv, &db})
        for (double e : *buf) REQUIRE(e == 5.0);
    };
    auto x = g;
    x.lse.data = nullptr;
    expect(status::invalid_argument, x);
    x = g;
    x.dk.extent[1] -= 1;
    expect(status::shape_mismatch, x);
    x = g;
    x.o.extent[3] += 1;
    expect(status::shape_mismatch, x);
    x = g;
    x.bias = gm::tensor_view<const double, 2>{};  // dbias without a bias table
    expect(status::shape_mismatch, x);
    x = g;
    x.dbias.extent[0] -= 1;
    expect(status::shape_mismatch, x);
    x = g;
    x.dv.stride[0] = 0;
    expect(status::shape_mismatch, x);
  }
  SUBCASE("oracle") {
    ref::oracle_args<double> o;
    o.q = f.a.q;
    o.k = f.a.k;
    o.v = f.a.v;
    o.bias = f.a.bias;
    o.window = f.a.window;
    o.out = f.a.out;
    o.lse = f.a.lse;
    std::vector<index_t> win = f.L.windows, crd = f.L.coords;
    o.token_window = gm::span<const index_t>(win);
    o.token_coord = gm::span<const index_t>(crd);
    REQUIRE(ref::can_implement(o) == status::success);
    auto expect = [&](status want) {
      CHECK(ref::can_implement(o) == want);
      CHECK(ref::window_attention_oracle(o) == want);
      CHECK(f.untouched());
    };
    o.token_window = gm::span<const index_t>(win.data(), static_cast<std::int64_t>(win.size()) - 1);
    expect(status::shape_mismatch);
    o.token_window = gm::span<const index_t>(win);
    win[3] = -2;
    expect(status::out_of_range);
    win = f.L.windows;
    crd[0] = gm::pack_coord(gm::coord_h(crd[0]) + 30, gm::coord_w(crd[0]));
    expect(status::out_of_range);
    crd = f.L.coords;
    o.token_coord = gm::span<const index_t>(crd.data(), 2);
    expect(status::shape_mismatch);
  }
  SUBCASE("split_qkv and empty problems") {
    std::vector<double> buf(2 * 3 * 2 * 2 * 4);
    auto qkv = gm::make_view(static_cast<const double*>(buf.data()), 2, 3, 2, 2, 4);  // extent[2] = 2
    gm::tensor_view<const double, 4> q, k, v;
    CHECK(ref::split_qkv(qkv, q, k, v) == status::shape_mismatch);
    gm::partition_indices empty;
    auto a = f.a;
    a.q.extent[1] = a.k.extent[1] = a.v.extent[1] = a.out.extent[1] = a.lse.extent[1] = 0;
    a.part = gm::make_partition_view(empty);
    CHECK(ref::group_attention_forward(a) == status::success);
    CHECK(f.untouched());
    a = f.a;
    a.part = gm::make_partition_view(f.P);
    a.q.extent[0] = a.k.extent[0] = a.v.extent[0] = a.out.extent[0] = a.lse.extent[0] = 0;
    CHECK(ref::group_attention_forward(a) == status::success);
    CHECK(f.untouched());
  }
}

TEST_CASE("reference attention: dbias accumulates, runs are deterministic") {
  gm::rng r(8, 8);
  const gm::window_geometry g = gm::make_window_geometry(28, 28, 7, 3);
  logical L;
  shared_mask_tokens(L, g, 0.75, 21);
  fill_random(L, r);
  const gm::partition_indices P = planned_partition(shared_windows(L, g), gm::strategy::fast, L.H * L.D);
  outputs a, b;
  run_grouped<float>(L, P, contiguous, a);
  run_grouped<float>(L, P, contiguous, b);
  CHECK(a.out == b.out);
  CHECK(a.dq == b.dq);
  CHECK(a.dbias == b.dbias);
  // += semantics: start from ones
  triple<double> in(L.B, L.N, L.H, L.D, contiguous);
  in.write(0, L.q);
  in.write(1, L.k);
  in.write(2, L.v);
  std::vector<double> out(static_cast<size_t>(L.numel())), lse(static_cast<size_t>(L.B) * L.N * L.H);
  ref::attention_args<double> fa;
  fa.q = in.c(0);
  fa.k = in.c(1);
  fa.v = in.c(2);
  fa.part = gm::make_partition_view(P);
  fa.bias = gm::make_view(static_cast<const double*>(L.bias.data()), L.bias_rows(), L.H);
  fa.window = L.p;
  fa.out = gm::make_view(out.data(), L.B, L.N, L.H, L.D);
  fa.lse = gm::make_view(lse.data(), L.B, L.N, L.H);
  REQUIRE(ref::group_attention_forward(fa) == gm::status::success);
  triple<double> gr(L.B, L.N, L.H, L.D, contiguous);
  std::vector<double> db0(L.bias.size(), 0.0), db1(L.bias.size(), 1.0);
  ref::attention_backward_args<double> ba;
  ba.q = fa.q;
  ba.k = fa.k;
  ba.v = fa.v;
  ba.o = gm::make_view(static_cast<const double*>(out.data()), L.B, L.N, L.H, L.D);
  ba.dout = gm::make_view(static_cast<const double*>(L.dout.data()), L.B, L.N, L.H, L.D);
  ba.lse = gm::make_view(static_cast<const double*>(lse.data()), L.B, L.N, L.H);
  ba.part = fa.part;
  ba.bias = fa.bias;
  ba.window = fa.window;
  ba.dq = gr.v[0];
  ba.dk = gr.v[1];
  ba.dv = gr.v[2];
  ba.dbias = gm::make_view(db0.data(), L.bias_rows(), L.H);
  REQUIRE(ref::group_attention_backward(ba) == gm::status::success);
  ba.dbias = gm::make_view(db1.data(), L.bias_rows(), L.H);
  REQUIRE(ref::group_attention_backward(ba) == gm::status::success);
  for (size_t i = 0; i < db0.size(); ++i) REQUIRE(db1[i] == 1.0 + db0[i]);
  CHECK(max_abs(db0) > 0);
}

TEST_CASE("reference attention: NaN and Inf propagate inside their window only") {
  gm::rng r(4, 4);
  const gm::window_geometry g = gm::make_window_geometry(28, 28, 7, 3);
  logical L;
  shared_mask_tokens(L, g, 0.75, 33);
  fill_random(L, r);
  const gm::window_list wl = shared_windows(L, g);
  // every window in one group: a leak would show in other windows' rows
  const gm::partition_indices P = planned_partition(wl, gm::strategy::single, L.H * L.D);
  outputs clean;
  run_grouped<double>(L, P, contiguous, clean);
  const index_t t = L.N / 2;
  const index_t wt = L.windows[static_cast<size_t>(t)];
  const std::int64_t row = static_cast<std::int64_t>(L.H) * L.D;
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();

  // rows of token u (all heads) of a [B, N, H, D] tensor, sample 0
  auto rows_all = [&](const std::vector<double>& x, index_t u, auto pred) {
    for (std::int64_t i = 0; i < row; ++i)
      if (!pred(x[static_cast<size_t>(u * row + i)])) return false;
    return true;
  };
  auto is_nan = [](double x) { return std::isnan(x); };
  auto not_finite = [](double x) { return !std::isfinite(x); };
  // every token outside window wt unchanged (within rounding) and finite
  auto others_clean = [&](const std::vector<double>& got, const std::vector<double>& want, std::int64_t width) {
    double e = 0;
    for (index_t b = 0; b < L.B; ++b)
      for (index_t u = 0; u < L.N; ++u) {
        if (L.windows[static_cast<size_t>(u)] == wt) continue;
        for (std::int64_t i = 0; i < width; ++i) {
          const size_t k = static_cast<size_t>((static_cast<std::int64_t>(b) * L.N + u) * width + i);
          if (!std::isfinite(got[k])) return false;
          e = std::max(e, std::fabs(got[k] - want[k]));
        }
      }
    return e <= 1e-12 * std::max(1.0, max_abs(want));
  };
  for (mask_mode mode : {mask_mode::exact, mask_mode::additive}) {
    CAPTURE(static_cast<int>(mode));
    {  // NaN in q
      logical X = L;
      for (index_t h = 0; h < L.H; ++h) X.q[static_cast<size_t>(t * row + h * L.D)] = nan;
      outputs o;
      run_grouped<double>(X, P, gapped, o, true, mode);
      CHECK(rows_all(o.out, t, is_nan));
      CHECK(std::isnan(o.lse[static_cast<size_t>(t * L.H)]));
      if (mode == mask_mode::exact) {
        CHECK(others_clean(o.out, clean.out, row));
        CHECK(others_clean(o.lse, clean.lse, L.H));
      }
    }
    {  // NaN in k poisons its window
      logical X = L;
      X.k[static_cast<size_t>(t * row + 1)] = nan;
      outputs o;
      run_grouped<double>(X, P, packed, o, true, mode);
      for (index_t u = 0; u < L.N; ++u)
        if (L.windows[static_cast<size_t>(u)] == wt) CHECK(std::isnan(o.out[static_cast<size_t>(u * row)]));
      if (mode == mask_mode::exact) {
        CHECK(others_clean(o.out, clean.out, row));
        CHECK(others_clean(o.dq, clean.dq, row));
        CHECK(others_clean(o.dk, clean.dk, row));
        CHECK(others_clean(o.dv, clean.dv, row));
      }
    }
    {  // Inf in q gives NaN, Inf in v gives non-finite rows
      logical X = L;
      X.q[static_cast<size_t>(t * row)] = inf;
      X.v[static_cast<size_t>(t * row + 2)] = -inf;
      outputs o;
      run_grouped<double>(X, P, transposed, o, true, mode);
      CHECK(std::isnan(o.out[static_cast<size_t>(t * row)]));  // head 0 of t: inf score
      for (index_t u = 0; u < L.N; ++u)
        if (L.windows[static_cast<size_t>(u)] == wt) CHECK(!std::isfinite(o.out[static_cast<size_t>(u * row + 2)]));
      if (mode == mask_mode::exact) {
        CHECK(others_clean(o.out, clean.out, row));
        CHECK(others_clean(o.dk, clean.dk, row));
      }
    }
    {  // NaN in dout
      logical X = L;
      for (std::int64_t i = 0; i < row; ++i) X.dout[static_cast<size_t>(t * row + i)] = nan;
      outputs o;
      run_grouped<double>(X, P, contiguous, o, true, mode);
      CHECK(others_clean(o.out, clean.out, row));  // forward unaffected
      CHECK(rows_all(o.dq, t, not_finite));
      for (index_t u = 0; u < L.N; ++u)
        if (L.windows[static_cast<size_t>(u)] == wt) {
          CHECK(rows_all(o.dk, u, is_nan));
          CHECK(rows_all(o.dv, u, is_nan));
        }
      if (mode == mask_mode::exact) {
        CHECK(others_clean(o.dq, clean.dq, row));
        CHECK(others_clean(o.dk, clean.dk, row));
        CHECK(others_clean(o.dv, clean.dv, row));
      }
    }
  }
}

TEST_CASE("reference attention: measured tolerances (printed with GREENMIM_TEST_VERBOSE=1)") {
  // Runs last (file order); prints the largest errors recorded by the tests above.
  if (std::getenv("GREENMIM_TEST_VERBOSE") != nullptr)
    for (const auto& kv : measured()) std::printf("  %-32s max rel err %.3e\n", kv.first.c_str(), kv.second);
  for (const auto& kv : measured()) CHECK(kv.second < 1e-5);
}
