// Shared by the conv GPU tests (test_depthwise_conv_gpu.cpp, test_block_conv_gpu.cpp,
// test_conv_gpu.cpp): random inputs, dtype round trips, mask coordinates, and the two cases that
// run an op forward and backward against the CPU reference (depthwise_case, block_case).
#pragma once

#include "gpu_test_util.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <greenmim/reference/conv.hpp>
#include <greenmim/sparse_conv.hpp>
#include <greenmim/twins_plan.hpp>

#include "../../kernels/detail/conv_split.hpp"

namespace gm_conv_test {


using namespace gm_test;
using greenmim::index_t;
using greenmim::make_view;
using greenmim::span;

//! Rounded to dtype and back, as doubles.
inline std::vector<double> as_double(const htensor& h) {
  std::vector<double> v(h.size());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = h.get(i);
  return v;
}

inline htensor random_htensor(gm_dtype dt, std::size_t n, std::mt19937_64& rng) {
  htensor h(dt, n);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (std::size_t i = 0; i < n; ++i) h.set(i, nd(rng));
  return h;
}

inline std::vector<float> random_floats(std::size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

inline std::vector<double> widen(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

using bytes = std::vector<unsigned char>;

//! A device output's bytes in dtype `dt`, as doubles.
inline std::vector<double> as_doubles(const bytes& b, gm_dtype dt) {
  htensor h(dt, b.size() / gm_dtype_size(dt));
  h.bytes = b;
  return as_double(h);
}

inline std::vector<double> download_double(const dbuf<unsigned char>& d, gm_dtype dt) { return as_doubles(d.download(), dt); }

//! Visible coordinates of a random mask with `unit` tokens per mask unit on a grid x grid stage.
inline std::vector<index_t> unit_mask_coords(std::mt19937_64& rng, index_t grid, index_t unit, double ratio) {
  greenmim::mask_config cfg;
  cfg.ratio = ratio;
  cfg.image_size = 32 * (grid / unit);
  const auto um = greenmim::random_mask(cfg, rng(), 0);
  std::vector<index_t> c;
  greenmim::check(greenmim::visible_coords(span<const std::uint8_t>(um), cfg.grid(), grid, c));
  return c;
}

//! The s x s block table of one sample's visible coordinates `c` on a 16 x 16 stage.
inline greenmim::block_table block_table_16(const std::vector<index_t>& c, index_t s = 4) {
  const std::vector<index_t> cu{0, static_cast<index_t>(c.size())};
  greenmim::block_table bt;
  greenmim::check(greenmim::build_block_table_per_sample(16, 16, s, span<const index_t>(cu), span<const index_t>(c), bt));
  return bt;
}

inline bytes float_bytes(const std::vector<float>& v) {
  bytes b(v.size() * sizeof(float));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

//! float32 bytes as doubles.
inline std::vector<double> floats_as_doubles(const bytes& b) {
  std::vector<double> v(b.size() / sizeof(float));
  for (std::size_t i = 0; i < v.size(); ++i) {
    float f;
    std::memcpy(&f, b.data() + i * sizeof(float), sizeof f);
    v[i] = f;
  }
  return v;
}

//! The depthwise conv's entry points on `a` (its tensors set): can_implement and the forward, the
//! workspace size (which must be `ws_want` bytes), the backward over a NaN-filled workspace, then the
//! backward again over another poisoned one, whose dweight and dbias must come out bitwise the same
//! (the weight gradients are deterministic). Returns the first backward's dweight and dbias.
inline std::pair<std::vector<float>, std::vector<float>> depthwise_run_twice(const gm_depthwise_conv_args& a,
                                                                            std::size_t ws_want,
                                                                            const dbuf<float>& dweight,
                                                                            const dbuf<float>& dbias) {
  GM_CHECK_CUDA(gm_depthwise_conv_fwd_can_implement(&a));
  GM_CHECK_CUDA(gm_depthwise_conv_fwd(&a, nullptr));
  std::size_t ws_bytes = 0;
  GM_CHECK_CUDA(gm_depthwise_conv_bwd_workspace_size(&a, &ws_bytes));
  CHECK(ws_bytes == ws_want);
  dbuf<unsigned char> ws(ws_bytes + 16);
  ws.fill_bytes(0xFF);
  GM_CHECK_CUDA(gm_depthwise_conv_bwd(&a, ws.p, ws_bytes, nullptr));
  GM_CHECK_CUDA(cudaDeviceSynchronize());
  std::pair<std::vector<float>, std::vector<float>> out{dweight.download(), dbias.download()};
  ws.fill_bytes(0x7F);
  GM_CHECK_CUDA(gm_depthwise_conv_bwd(&a, ws.p, ws_bytes, nullptr));
  GM_CHECK_CUDA(cudaDeviceSynchronize());
  CHECK(float_bytes(dweight.download()) == float_bytes(out.first));
  CHECK(float_bytes(dbias.download()) == float_bytes(out.second));
  return out;
}

//! Forward and backward of the depthwise conv with x and dy read through `sx` / `sdy` ([B, N, C]
//! strides, elements) in buffers of `span` elements whose rows hold the dense tensors `hx`, `hdy`.
//! Checks the workspace size and that dweight and dbias come out bitwise the same over a poisoned
//! workspace. Returns y, dx, dweight and dbias's bytes.
inline std::vector<bytes> depthwise_strided(const greenmim::neighbor_table& t, std::int64_t B, std::int64_t C, gm_dtype dt,
                                     const htensor& hx, const htensor& hdy, const std::vector<float>& w,
                                     const std::vector<float>& bias, const std::int64_t (&sx)[3],
                                     const std::int64_t (&sdy)[3], bool residual = true) {
  const std::int64_t N = t.num_tokens;
  const std::size_t es = gm_dtype_size(dt);
  auto span_of = [&](const std::int64_t (&s)[3]) { return static_cast<std::size_t>((B - 1) * s[0] + (N - 1) * s[1] + C); };
  // buffers sized by the strides; only the rows are written (the rest of a large one is never touched)
  auto place = [&](const htensor& h, const std::int64_t (&s)[3]) {
    dbuf<unsigned char> d(span_of(s) * es);
    if (s[0] == N * C && s[1] == C) {  // dense: one copy
      d.upload(h.bytes);
      return d;
    }
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t n = 0; n < N; ++n)
        REQUIRE(cudaMemcpy(d.p + (b * s[0] + n * s[1]) * static_cast<std::int64_t>(es), h.bytes.data() + ((b * N + n) * C) * es,
                           static_cast<std::size_t>(C) * es, cudaMemcpyHostToDevice) == cudaSuccess);
    return d;
  };
  dbuf<unsigned char> x = place(hx, sx), dy = place(hdy, sdy);
  dbuf<unsigned char> y(static_cast<std::size_t>(B * N * C) * es), dx(static_cast<std::size_t>(B * N * C) * es);
  y.fill_bytes(0xFF);  // NaN: an output row left unwritten shows
  dx.fill_bytes(0xFF);
  dbuf<index_t> nbr = to_device(t.nbr);
  dbuf<float> wd = to_device(w), bd = to_device(bias), dweight(static_cast<std::size_t>(C) * 9), dbias(static_cast<std::size_t>(C));
  gm_depthwise_conv_args a{};
  a.dtype = dt;
  a.x = make_tensor(x.p, {B, N, C}, {sx[0], sx[1], sx[2]});
  a.dy = make_tensor(dy.p, {B, N, C}, {sdy[0], sdy[1], sdy[2]});
  a.y = make_tensor(y.p, {B, N, C}, {N * C, C, 1});
  a.dx = make_tensor(dx.p, {B, N, C}, {N * C, C, 1});
  a.nbr = nbr.p;
  a.kernel = 3;
  a.weight = wd.p;
  a.bias = bd.p;
  a.dweight = dweight.p;
  a.dbias = dbias.p;
  a.residual = residual ? 1 : 0;
  const auto grads = depthwise_run_twice(
      a, static_cast<std::size_t>(greenmim::detail::cuda::dw_grad_split_for(N, B, C).parts() * C * 10) * sizeof(float),
      dweight, dbias);
  return {y.download(), dx.download(), float_bytes(grads.first), float_bytes(grads.second)};
}


//! Runs forward and backward, checks them against the reference; returns every output's bytes.
inline std::vector<bytes> depthwise_case(const char* name, const std::vector<index_t>& cu, const std::vector<index_t>& coords, index_t grid,
                    std::int64_t B, std::int64_t C, gm_dtype dt, bool residual, std::mt19937_64& rng) {
  INFO(name << " dtype " << gm_dtype_name(dt) << " B " << B << " C " << C << " residual " << residual);
  greenmim::neighbor_table t;
  greenmim::check(greenmim::build_neighbor_table_per_sample(grid, grid, 3, span<const index_t>(cu),
                                                            span<const index_t>(coords), t));
  const std::int64_t N = t.num_tokens;
  const htensor hx = random_htensor(dt, static_cast<std::size_t>(B * N * C), rng);
  const htensor hdy = random_htensor(dt, static_cast<std::size_t>(B * N * C), rng);
  const auto w = random_floats(static_cast<std::size_t>(C) * 9, rng), bias = random_floats(static_cast<std::size_t>(C), rng);
  const std::int64_t dense[3] = {N * C, C, 1};
  const auto out = depthwise_strided(t, B, C, dt, hx, hdy, w, bias, dense, dense, residual);
  // reference in double on the device's inputs
  const auto xd = as_double(hx), dyd = as_double(hdy), wd = widen(w), bd = widen(bias);
  std::vector<double> y_ref(xd.size()), dx_ref(xd.size()), dw_ref(wd.size()), db_ref(bd.size());
  const span<const index_t> tn(t.nbr);
  REQUIRE(greenmim::reference::depthwise_conv_forward<double>(tn, 3, make_view(xd.data(), B, N, C),
                                                              make_view(wd.data(), C, 9), span<const double>(bd),
                                                              residual, make_view(y_ref.data(), B, N, C)) ==
          greenmim::status::success);
  REQUIRE(greenmim::reference::depthwise_conv_backward<double>(
              tn, 3, make_view(xd.data(), B, N, C), make_view(wd.data(), C, 9), make_view(dyd.data(), B, N, C), residual,
              make_view(dx_ref.data(), B, N, C), make_view(dw_ref.data(), C, 9), span<double>(db_ref)) ==
          greenmim::status::success);
  const double tol = tolerance(dt);
  CHECK(rel_error(as_doubles(out[0], dt), y_ref) <= tol);
  CHECK(rel_error(as_doubles(out[1], dt), dx_ref) <= tol);
  CHECK(rel_error(floats_as_doubles(out[2]), dw_ref) <= 1e-5);
  CHECK(rel_error(floats_as_doubles(out[3]), db_ref) <= 1e-5);
  return out;
}

//! `grads`: 0 = dweight and dbias, 1 = dweight alone, 2 = dbias alone.
inline std::vector<bytes> block_case(const char* name, const std::vector<index_t>& cu, const std::vector<index_t>& coords, index_t grid,
                index_t s, std::int64_t B, std::int64_t Ci, std::int64_t Co, gm_dtype dt, std::mt19937_64& rng,
                int grads = 0) {
  INFO(name << " dtype " << gm_dtype_name(dt) << " s " << s << " B " << B << " C_in " << Ci << " C_out " << Co
            << " grads " << grads);
  greenmim::block_table bt;
  greenmim::check(greenmim::build_block_table_per_sample(grid, grid, s, span<const index_t>(cu),
                                                         span<const index_t>(coords), bt));
  const std::int64_t N = bt.num_inputs, Nn = bt.num_outputs(), P = static_cast<std::int64_t>(s) * s;
  const std::size_t es = gm_dtype_size(dt);
  const htensor hx = random_htensor(dt, static_cast<std::size_t>(B * N * Ci), rng);
  const htensor hdy = random_htensor(dt, static_cast<std::size_t>(B * Nn * Co), rng);
  const auto w = random_floats(static_cast<std::size_t>(Co * Ci * P), rng), bias = random_floats(static_cast<std::size_t>(Co), rng);
  dbuf<unsigned char> x = to_device(hx), dy = to_device(hdy);
  dbuf<unsigned char> y(static_cast<std::size_t>(B * Nn * Co) * es), dx(static_cast<std::size_t>(B * N * Ci) * es);
  y.fill_bytes(0xFF);
  dx.fill_bytes(0xFF);
  dbuf<index_t> gather = to_device(bt.gather);
  dbuf<float> wd_d = to_device(w), bias_d = to_device(bias), dweight(w.size()), dbias(bias.size());
  gm_block_conv_args a{};
  a.dtype = dt;
  a.x = make_tensor(x.p, {B, N, Ci}, {N * Ci, Ci, 1});
  a.y = make_tensor(y.p, {B, Nn, Co}, {Nn * Co, Co, 1});
  a.dy = make_tensor(dy.p, {B, Nn, Co}, {Nn * Co, Co, 1});
  a.dx = make_tensor(dx.p, {B, N, Ci}, {N * Ci, Ci, 1});
  a.gather = gather.p;
  a.stride = s;
  a.weight = wd_d.p;
  a.bias = bias_d.p;
  a.dweight = grads == 2 ? nullptr : dweight.p;
  a.dbias = grads == 1 ? nullptr : dbias.p;
  dweight.fill_bytes(0xFF);
  dbias.fill_bytes(0xFF);
  GM_CHECK_CUDA(gm_block_conv_fwd_can_implement(&a));
  std::size_t fwd_ws = 0, bwd_ws = 0;
  GM_CHECK_CUDA(gm_block_conv_fwd_workspace_size(&a, &fwd_ws));
  GM_CHECK_CUDA(gm_block_conv_bwd_workspace_size(&a, &bwd_ws));
  dbuf<unsigned char> ws(fwd_ws > bwd_ws ? fwd_ws : bwd_ws);
  ws.fill_bytes(0xFF);  // NaN partials if a split were read before written
  GM_CHECK_CUDA(gm_block_conv_fwd(&a, ws.p, fwd_ws, nullptr));
  GM_CHECK_CUDA(gm_block_conv_bwd_can_implement(&a));
  GM_CHECK_CUDA(gm_block_conv_bwd(&a, ws.p, bwd_ws, nullptr));
  GM_CHECK_CUDA(cudaDeviceSynchronize());
  const auto xd = as_double(hx), dyd = as_double(hdy), wdd = widen(w), bd = widen(bias);
  std::vector<double> y_ref(static_cast<std::size_t>(B * Nn * Co)), dx_ref(xd.size()), dw_ref(wdd.size()), db_ref(bd.size());
  const span<const index_t> g(bt.gather);
  REQUIRE(greenmim::reference::block_conv_forward<double>(g, s, make_view(xd.data(), B, N, Ci),
                                                          make_view(wdd.data(), Co, Ci, s, s), span<const double>(bd),
                                                          make_view(y_ref.data(), B, Nn, Co)) == greenmim::status::success);
  REQUIRE(greenmim::reference::block_conv_backward<double>(
              g, s, make_view(xd.data(), B, N, Ci), make_view(wdd.data(), Co, Ci, s, s), make_view(dyd.data(), B, Nn, Co),
              make_view(dx_ref.data(), B, N, Ci), make_view(dw_ref.data(), Co, Ci, s, s), span<double>(db_ref)) ==
          greenmim::status::success);
  const double tol = tolerance(dt);
  CHECK(rel_error(download_double(y, dt), y_ref) <= tol);
  CHECK(rel_error(download_double(dx, dt), dx_ref) <= tol);
  const auto dw1 = dweight.download(), db1 = dbias.download();
  if (grads != 2) CHECK(rel_error(widen(dw1), dw_ref) <= 1e-5);
  else CHECK(std::all_of(dw1.begin(), dw1.end(), [](float v) { return v != v; }));  // not requested: untouched
  if (grads != 1) CHECK(rel_error(widen(db1), db_ref) <= 1e-5);
  else CHECK(std::all_of(db1.begin(), db1.end(), [](float v) { return v != v; }));
  // bitwise deterministic with split reductions: again over a workspace poisoned differently
  const bytes y1 = y.download(), dx1 = dx.download();
  ws.fill_bytes(0x7F);
  GM_CHECK_CUDA(gm_block_conv_fwd(&a, ws.p, fwd_ws, nullptr));
  GM_CHECK_CUDA(gm_block_conv_bwd(&a, ws.p, bwd_ws, nullptr));
  GM_CHECK_CUDA(cudaDeviceSynchronize());
  CHECK(y.download() == y1);
  CHECK(dx.download() == dx1);
  CHECK(float_bytes(dweight.download()) == float_bytes(dw1));
  CHECK(float_bytes(dbias.download()) == float_bytes(db1));
  return {y1, dx1, float_bytes(dw1), float_bytes(db1)};
}


}  // namespace gm_conv_test

#if defined(GREENMIM_CUDA_EMULATION)
#include "cuda_emu.hpp"

namespace gm_conv_test {

//! The emulated kernels' outputs `run_all(inputs)` (bytes) under the forward schedule, and the same
//! bit for bit under the reverse, a random (seeded from `rng`) and the greedy schedule: no race
//! between barriers. Returns the forward schedule's outputs; leaves the schedule forward.
template <class RunAll>
std::vector<bytes> check_schedules_agree(const RunAll& run_all, std::uint64_t inputs, std::mt19937_64& rng) {
  gm_emu::set_schedule(gm_emu::schedule::forward);
  const std::vector<bytes> want = run_all(inputs);
  const std::vector<std::pair<gm_emu::schedule, std::uint64_t>> others = {
      {gm_emu::schedule::reverse, 0}, {gm_emu::schedule::random, rng()}, {gm_emu::schedule::greedy, 0}};
  for (const auto& sch : others) {
    INFO("schedule " << static_cast<int>(sch.first) << " seed " << sch.second);
    gm_emu::set_schedule(sch.first, sch.second);
    const std::vector<bytes> got = run_all(inputs);
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == want[i]);
  }
  gm_emu::set_schedule(gm_emu::schedule::forward);
  return want;
}

}  // namespace gm_conv_test
#endif
