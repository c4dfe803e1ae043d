// Grouped window attention on the geometries beyond 224 px / window 7 (models.hpp presets and
// user-built shapes): SimMIM's 192 px / window 6, Swin V2's 256 px / window 8 and 16, 192 px /
// window 12, and a 48-token window the CUDA kernels refuse (the CPU reference still runs it).
// Every stage and both blocks, forward and backward, against the window-by-window oracle.
#include <doctest/doctest.h>

#include <greenmim/random_masks.hpp>
#include <greenmim/merging.hpp>
#include <greenmim/kernel_limits.hpp>
#include <greenmim/models.hpp>
#include <greenmim/partition.hpp>
#include <greenmim/planner.hpp>
#include <greenmim/reference/attention.hpp>
#include <greenmim/reference/oracle.hpp>
#include <greenmim/windows.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace gm = greenmim;
namespace ref = greenmim::reference;
using gm::index_t;
using gm::make_view;

namespace {

double max_rel(const std::vector<double>& a, const std::vector<double>& b) {
  double e = 0, m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    e = std::max(e, std::fabs(a[i] - b[i]));
    m = std::max(m, std::fabs(b[i]));
  }
  return m > 0 ? e / m : e;
}

//! One block (stage `s`, shifted or not) of `m` on `coords`: grouped (planned, partitioned)
//! forward and backward in double against the oracle. Returns the largest relative error.
double grouped_vs_oracle(const gm::model_shape& m, int s, bool shifted, const std::vector<index_t>& coords,
                         gm::rng& r) {
  const gm::window_geometry g = m.geometry(s, shifted);
  gm::window_list wl;
  REQUIRE(gm::build_windows(g, gm::span<const index_t>(coords), wl) == gm::status::success);
  const std::vector<index_t> sizes = wl.sizes();
  gm::plan pl;
  REQUIRE(gm::make_plan(gm::span<const index_t>(sizes), gm::planner_options{}, gm::flops_cost{m.channels[s]}, pl) ==
          gm::status::success);
  gm::partition_indices part;
  REQUIRE(gm::build_partition(pl, wl, part) == gm::status::success);

  const index_t B = 1, N = static_cast<index_t>(coords.size()), H = 2, D = 4, p = g.window;
  const std::int64_t n = static_cast<std::int64_t>(B) * N * H * D, rows = static_cast<std::int64_t>(2 * p - 1) * (2 * p - 1);
  auto fill = [&](std::int64_t size, double amp) {
    std::vector<double> x(static_cast<std::size_t>(size));
    for (double& e : x) e = amp * (2 * r.uniform() - 1);
    return x;
  };
  const std::vector<double> q = fill(n, 1), k = fill(n, 1), v = fill(n, 1), dout = fill(n, 1), bias = fill(rows * H, 0.5);
  auto cv = [&](const std::vector<double>& x) { return make_view(x.data(), B, N, H, D); };
  const auto bias_view = make_view(bias.data(), rows, H);

  std::vector<double> out(static_cast<std::size_t>(n)), lse(static_cast<std::size_t>(B) * N * H);
  ref::attention_args<double> a;
  a.q = cv(q);
  a.k = cv(k);
  a.v = cv(v);
  a.part = gm::make_partition_view(part);
  a.bias = bias_view;
  a.window = p;
  a.out = make_view(out.data(), B, N, H, D);
  a.lse = make_view(lse.data(), B, N, H);
  REQUIRE(ref::group_attention_forward(a) == gm::status::success);
  std::vector<double> dq(out.size()), dk(out.size()), dv(out.size()), dbias(bias.size(), 0.0);
  ref::attention_backward_args<double> ga;
  ga.q = a.q;
  ga.k = a.k;
  ga.v = a.v;
  ga.o = make_view(static_cast<const double*>(out.data()), B, N, H, D);
  ga.dout = cv(dout);
  ga.lse = make_view(static_cast<const double*>(lse.data()), B, N, H);
  ga.part = a.part;
  ga.bias = bias_view;
  ga.window = p;
  ga.dq = make_view(dq.data(), B, N, H, D);
  ga.dk = make_view(dk.data(), B, N, H, D);
  ga.dv = make_view(dv.data(), B, N, H, D);
  ga.dbias = make_view(dbias.data(), rows, H);
  REQUIRE(ref::group_attention_backward(ga) == gm::status::success);

  std::vector<index_t> token_window(static_cast<std::size_t>(N));
  for (index_t w = 0; w < wl.num_windows(); ++w)
    for (index_t t : wl.window(w)) token_window[static_cast<std::size_t>(t)] = w;
  std::vector<double> o_out(out.size()), o_lse(lse.size()), o_dq(out.size()), o_dk(out.size()), o_dv(out.size()),
      o_dbias(bias.size(), 0.0);
  ref::oracle_args<double> o;
  o.q = a.q;
  o.k = a.k;
  o.v = a.v;
  o.token_window = gm::span<const index_t>(token_window);
  o.token_coord = gm::span<const index_t>(wl.coords);
  o.bias = bias_view;
  o.window = p;
  o.out = make_view(o_out.data(), B, N, H, D);
  o.lse = make_view(o_lse.data(), B, N, H);
  REQUIRE(ref::window_attention_oracle(o) == gm::status::success);
  ref::oracle_backward_args<double> ob;
  ob.q = a.q;
  ob.k = a.k;
  ob.v = a.v;
  ob.dout = ga.dout;
  ob.token_window = o.token_window;
  ob.token_coord = o.token_coord;
  ob.bias = bias_view;
  ob.window = p;
  ob.dq = make_view(o_dq.data(), B, N, H, D);
  ob.dk = make_view(o_dk.data(), B, N, H, D);
  ob.dv = make_view(o_dv.data(), B, N, H, D);
  ob.dbias = make_view(o_dbias.data(), rows, H);
  REQUIRE(ref::window_attention_oracle_backward(ob) == gm::status::success);
  return std::max({max_rel(out, o_out), max_rel(lse, o_lse), max_rel(dq, o_dq), max_rel(dk, o_dk), max_rel(dv, o_dv),
                   max_rel(dbias, o_dbias)});
}

//! Every stage (visible tokens carried across stages by patch merging) and both blocks.
void check_model(const gm::model_shape& m, int masks) {
  INFO(m.name << " image " << m.image_size << " window " << m.window);
  REQUIRE(gm::validate_model_shape(m) == gm::status::success);
  const gm::mask_config cfg = gm::make_mask_config(m);
  gm::rng r(17, 3);
  for (int k = 0; k < masks; ++k) {
    const auto units = gm::random_mask(cfg, 23, static_cast<std::uint64_t>(k));
    std::vector<index_t> coords;
    REQUIRE(gm::visible_coords(gm::span<const std::uint8_t>(units), cfg.grid(), m.grid(0), coords) == gm::status::success);
    for (int s = 0; s < 4; ++s) {
      for (int blk = 0; blk < 2; ++blk) {
        INFO("stage " << s + 1 << " shifted " << blk);
        CHECK(grouped_vs_oracle(m, s, blk == 1, coords, r) < 1e-12);
      }
      if (s == 3) break;
      std::vector<index_t> gather4, next;
      REQUIRE(gm::merge_indices(m.grid(s), m.grid(s), gm::span<const index_t>(coords), gather4, next) ==
              gm::status::success);
      coords = next;
    }
  }
}

}  // namespace

TEST_CASE("geometries: grouped == window oracle on 192/w6, 256/w8, 256/w16, 192/w12 (every stage, both blocks)") {
  check_model(*gm::find_model("swin-b-192w6"), 3);
  check_model(*gm::find_model("swinv2_base_window8_256"), 2);
  check_model(*gm::find_model("swinv2_base_window16_256"), 2);
  check_model(*gm::find_model("swinv2_large_window12_192"), 1);
}

TEST_CASE("geometries: a window the CUDA kernels refuse (48 > GM_MAX_WINDOW) runs on the CPU reference") {
  gm::model_shape m;
  std::string why;
  REQUIRE(gm::make_model_shape(*gm::find_model("swin-b"), gm::model_geometry{384, 0, 48, 0}, m, &why) ==
          gm::status::success);
  CHECK(gm::cuda_attention_refusal(m.geometry(0, false).window, 1, m.head_dim) == "window 48 > GM_MAX_WINDOW 32");
  CHECK(gm::cuda_attention_refusal(m.geometry(2, false).window, 1, m.head_dim).empty());  // stage 3: 24 x 24
  const gm::mask_config cfg = gm::make_mask_config(m, 0.9);  // fewer tokens: a quick test
  const auto units = gm::random_mask(cfg, 4, 0);
  std::vector<index_t> coords;
  REQUIRE(gm::visible_coords(gm::span<const std::uint8_t>(units), cfg.grid(), m.grid(0), coords) == gm::status::success);
  gm::rng r(9);
  for (int blk = 0; blk < 2; ++blk) CHECK(grouped_vs_oracle(m, 0, blk == 1, coords, r) < 1e-12);
}
