// GPU tests of the convolutions on visible tokens (kernels/conv.cu) against the CPU reference
// (include/greenmim/reference/conv.hpp, in double on the inputs as the device sees them). Run on
// a device by greenmim_gpu_tests and on the CPU emulator by greenmim_emu_tests.
#include "gpu_test_util.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cmath>
#include <limits>
#include <cstring>
#include <string>
#include <vector>

#include <greenmim/reference/conv.hpp>
#include <greenmim/sparse_conv.hpp>
#include <greenmim/twins_plan.hpp>

#include "../../kernels/detail/conv_split.hpp"

namespace {

using namespace gm_test;
using greenmim::index_t;
using greenmim::make_view;
using greenmim::span;

//! Rounded to dtype and back, as doubles.
std::vector<double> as_double(const htensor& h) {
  std::vector<double> v(h.size());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = h.get(i);
  return v;
}

htensor random_htensor(gm_dtype dt, std::size_t n, std::mt19937_64& rng) {
  htensor h(dt, n);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (std::size_t i = 0; i < n; ++i) h.set(i, nd(rng));
  return h;
}

std::vector<float> random_floats(std::size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

std::vector<double> widen(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

using bytes = std::vector<unsigned char>;

//! A device output's bytes in dtype `dt`, as doubles.
std::vector<double> as_doubles(const bytes& b, gm_dtype dt) {
  htensor h(dt, b.size() / gm_dtype_size(dt));
  h.bytes = b;
  return as_double(h);
}

std::vector<double> download_double(const dbuf<unsigned char>& d, gm_dtype dt) { return as_doubles(d.download(), dt); }

//! Visible coordinates of a random mask with `unit` tokens per mask unit on a grid x grid stage.
std::vector<index_t> unit_mask_coords(std::mt19937_64& rng, index_t grid, index_t unit, double ratio) {
  greenmim::mask_config cfg;
  cfg.ratio = ratio;
  cfg.image_size = 32 * (grid / unit);
  const auto um = greenmim::random_mask(cfg, rng(), 0);
  std::vector<index_t> c;
  greenmim::check(greenmim::visible_coords(span<const std::uint8_t>(um), cfg.grid(), grid, c));
  return c;
}

//! The s x s block table of one sample's visible coordinates `c` on a 16 x 16 stage.
greenmim::block_table block_table_16(const std::vector<index_t>& c, index_t s = 4) {
  const std::vector<index_t> cu{0, static_cast<index_t>(c.size())};
  greenmim::block_table bt;
  greenmim::check(greenmim::build_block_table_per_sample(16, 16, s, span<const index_t>(cu), span<const index_t>(c), bt));
  return bt;
}

bytes float_bytes(const std::vector<float>& v) {
  bytes b(v.size() * sizeof(float));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

//! float32 bytes as doubles.
std::vector<double> floats_as_doubles(const bytes& b) {
  std::vector<double> v(b.size() / sizeof(float));
  for (std::size_t i = 0; i < v.size(); ++i) {
    float f;
    std::memcpy(&f, b.data() + i * sizeof(float), sizeof f);
    v[i] = f;
  }
  return v;
}

//! Forward and backward of the depthwise conv with x and dy read through `sx` / `sdy` ([B, N, C]
//! strides, elements) in buffers of `span` elements whose rows hold the dense tensors `hx`, `hdy`.
//! Checks the workspace size and that dweight and dbias come out bitwise the same over a poisoned
//! workspace. Returns y, dx, dweight and dbias's bytes.
std::vector<bytes> depthwise_strided(const greenmim::neighbor_table& t, std::int64_t B, std::int64_t C, gm_dtype dt,
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
  GM_CHECK_CUDA(gm_depthwise_conv_fwd_can_implement(&a));
  GM_CHECK_CUDA(gm_depthwise_conv_fwd(&a, nullptr));
  std::size_t ws_bytes = 0;
  GM_CHECK_CUDA(gm_depthwise_conv_bwd_workspace_size(&a, &ws_bytes));
  CHECK(ws_bytes == static_cast<std::size_t>(greenmim::detail::cuda::dw_grad_split_for(N, B, C).parts() * C * 10) *
                         sizeof(float));
  dbuf<unsigned char> ws(ws_bytes);
  GM_CHECK_CUDA(gm_depthwise_conv_bwd(&a, ws.p, ws_bytes, nullptr));
  GM_CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<bytes> out{y.download(), dx.download(), float_bytes(dweight.download()), float_bytes(dbias.download())};
  // bitwise deterministic weight gradients: run again over a poisoned workspace
  ws.fill_bytes(0x7F);
  GM_CHECK_CUDA(gm_depthwise_conv_bwd(&a, ws.p, ws_bytes, nullptr));
  GM_CHECK_CUDA(cudaDeviceSynchronize());
  CHECK(float_bytes(dweight.download()) == out[2]);
  CHECK(float_bytes(dbias.download()) == out[3]);
  return out;
}


//! Runs forward and backward, checks them against the reference; returns every output's bytes.
std::vector<bytes> depthwise_case(const char* name, const std::vector<index_t>& cu, const std::vector<index_t>& coords, index_t grid,
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
std::vector<bytes> block_case(const char* name, const std::vector<index_t>& cu, const std::vector<index_t>& coords, index_t grid,
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

}  // namespace

TEST_CASE("gpu depthwise conv (PEG): fwd and bwd vs the CPU reference, vector and scalar paths, deterministic dweight") {
  GM_SKIP_WITHOUT_DEVICE();
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed << " (GM_TEST_SEED)");
  std::mt19937_64 rng(seed);
  // shared mask (batch axis), 14 x 14 stage with 2 x 2-token mask units
  const auto c = unit_mask_coords(rng, 14, 2, 0.6);
  const std::vector<index_t> cu{0, static_cast<index_t>(c.size())};
  for (gm_dtype dt : {GM_FLOAT32, GM_FLOAT16, GM_BFLOAT16}) {
    depthwise_case("shared mask, C 16 (vectorized)", cu, c, 14, 2, 16, dt, true, rng);
    depthwise_case("shared mask, C 12 (scalar)", cu, c, 14, 2, 12, dt, false, rng);
  }
  // per-sample flat layout: any token sets, image borders, one sample empty
  std::vector<index_t> flat, cu2{0};
  std::bernoulli_distribution keep(0.45);
  for (int b = 0; b < 3; ++b) {
    for (index_t h = 0; h < 9; ++h)
      for (index_t w = 0; w < 9; ++w)
        if (b != 1 && keep(rng)) flat.push_back(greenmim::pack_coord(h, w));
    cu2.push_back(static_cast<index_t>(flat.size()));
  }
  depthwise_case("per-sample", cu2, flat, 9, 1, 24, GM_FLOAT32, true, rng);
  depthwise_case("per-sample", cu2, flat, 9, 1, 5, GM_BFLOAT16, true, rng);
  // several pieces of the dweight reduction (3 chunks of 8 samples x several 32-token tiles),
  // token rows per thread > 1 (C 16: 256 / 2 rows per block), and a block of 64 channel groups
  // cut in two (C 512)
  const auto c3 = unit_mask_coords(rng, 16, 2, 0.3);
  const std::vector<index_t> cu3{0, static_cast<index_t>(c3.size())};
  depthwise_case("shared mask, B 19, C 16", cu3, c3, 16, 19, 16, GM_BFLOAT16, true, rng);
  depthwise_case("shared mask, B 3, C 512", cu3, c3, 16, 3, 512, GM_FLOAT16, true, rng);
  depthwise_case("shared mask, B 9, C 40 (5 groups of 8)", cu3, c3, 16, 9, 40, GM_FLOAT32, false, rng);
  // many samples: 32 channel groups of 8 per block, 8 token rows
  depthwise_case("shared mask, B 100, C 256", cu3, c3, 16, 100, 256, GM_BFLOAT16, true, rng);
  // several samples per CTA on the scalar path and on fp32's two 16-byte halves
  depthwise_case("shared mask, B 100, C 36 (scalar, samples per CTA > 1)", cu3, c3, 16, 100, 36, GM_FLOAT32, true, rng);
  depthwise_case("shared mask, B 64, C 128 (fp32)", cu3, c3, 16, 64, 128, GM_FLOAT32, false, rng);
  // a packed per-sample batch (B 1, ~6000 tokens): C 256, 32 channel groups of 8 per block; C 36
  // (scalar): 2 channel blocks
  std::vector<index_t> many, cu4{0};
  for (int b = 0; b < 40; ++b) {
    for (index_t h = 0; h < 16; ++h)
      for (index_t w = 0; w < 16; ++w)
        if (keep(rng) || keep(rng)) many.push_back(greenmim::pack_coord(h, w));
    cu4.push_back(static_cast<index_t>(many.size()));
  }
  depthwise_case("per-sample, B 1, C 256", cu4, many, 16, 1, 256, GM_BFLOAT16, true, rng);
  depthwise_case("per-sample, B 1, C 36 (scalar)", cu4, many, 16, 1, 36, GM_FLOAT32, false, rng);
  depthwise_case("per-sample, B 2, C 64", cu4, many, 16, 2, 64, GM_FLOAT16, true, rng);
  // several token tiles per CTA while walking (8 tokens a thread): C 36 (scalar, 8 token rows a
  // block, tiles of 64 tokens, 2 channel blocks), every unit of 70 samples: 17,920 tokens, 280
  // tiles x 2 > 2 x k_dw_apply_min_ctas
  std::vector<index_t> full, cu5{0};
  for (int b = 0; b < 70; ++b) {
    for (index_t h = 0; h < 16; ++h)
      for (index_t w = 0; w < 16; ++w) full.push_back(greenmim::pack_coord(h, w));
    cu5.push_back(static_cast<index_t>(full.size()));
  }
  REQUIRE(greenmim::detail::cuda::dw_apply_walks(17920, 8, 2, 1));
  REQUIRE(greenmim::detail::cuda::dw_apply_split_for(280, 2, 1).tiles_per_cta > 1);
  depthwise_case("per-sample, B 1, C 36 (scalar, walking, tiles per CTA > 1)", cu5, full, 16, 1, 36, GM_FLOAT16, true, rng);
}

//! dweight and dbias of the depthwise backward with x and dy at `offset` elements into their
//! buffers (an offset of 1 makes the rows miss 16-byte alignment: the scalar path).
std::vector<bytes> depthwise_grads_at(const std::vector<index_t>& cu, const std::vector<index_t>& coords, index_t grid,
                                      std::int64_t B, std::int64_t C, gm_dtype dt, const htensor& hx,
                                      const htensor& hdy, const std::vector<float>& w, std::int64_t offset) {
  greenmim::neighbor_table t;
  greenmim::check(greenmim::build_neighbor_table_per_sample(grid, grid, 3, span<const index_t>(cu),
                                                            span<const index_t>(coords), t));
  const std::int64_t N = t.num_tokens;
  const std::size_t es = gm_dtype_size(dt), n = static_cast<std::size_t>(B * N * C);
  dbuf<unsigned char> x((n + 8) * es), dy((n + 8) * es), dx((n + 8) * es);
  const std::vector<unsigned char> xb = hx.bytes, dyb = hdy.bytes;
  std::vector<unsigned char> xs((n + 8) * es, 0), dys((n + 8) * es, 0);
  std::memcpy(xs.data() + offset * es, xb.data(), n * es);
  std::memcpy(dys.data() + offset * es, dyb.data(), n * es);
  x.upload(xs);
  dy.upload(dys);
  dbuf<index_t> nbr = to_device(t.nbr);
  dbuf<float> wd = to_device(w), dweight(static_cast<std::size_t>(C) * 9), dbias(static_cast<std::size_t>(C));
  gm_depthwise_conv_args a{};
  a.dtype = dt;
  a.x = make_tensor(x.p + offset * es, {B, N, C}, {N * C, C, 1});
  a.dy = make_tensor(dy.p + offset * es, {B, N, C}, {N * C, C, 1});
  a.dx = make_tensor(dx.p + offset * es, {B, N, C}, {N * C, C, 1});
  a.nbr = nbr.p;
  a.kernel = 3;
  a.weight = wd.p;
  a.dweight = dweight.p;
  a.dbias = dbias.p;
  a.residual = 1;
  std::size_t ws_bytes = 0;
  GM_CHECK_CUDA(gm_depthwise_conv_bwd_workspace_size(&a, &ws_bytes));
  dbuf<unsigned char> ws(ws_bytes);
  GM_CHECK_CUDA(gm_depthwise_conv_bwd(&a, ws.p, ws_bytes, nullptr));
  GM_CHECK_CUDA(cudaDeviceSynchronize());
  return {float_bytes(dweight.download()), float_bytes(dbias.download())};
}

TEST_CASE("gpu depthwise conv: dweight and dbias bits do not depend on the inputs' alignment") {
  GM_SKIP_WITHOUT_DEVICE();
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed << " (GM_TEST_SEED)");
  std::mt19937_64 rng(seed);
  const auto c = unit_mask_coords(rng, 16, 2, 0.4);
  const std::vector<index_t> cu{0, static_cast<index_t>(c.size())};
  for (std::int64_t C : {8, 16, 32, 64}) {  // below 64 channels the vector and scalar paths once cut rows differently
    INFO("C " << C);
    const std::int64_t B = 10, n = B * static_cast<std::int64_t>(c.size()) * C;
    const htensor hx = random_htensor(GM_BFLOAT16, static_cast<std::size_t>(n), rng);
    const htensor hdy = random_htensor(GM_BFLOAT16, static_cast<std::size_t>(n), rng);
    const auto w = random_floats(static_cast<std::size_t>(C) * 9, rng);
    const auto aligned = depthwise_grads_at(cu, c, 16, B, C, GM_BFLOAT16, hx, hdy, w, 0);
    const auto offset = depthwise_grads_at(cu, c, 16, B, C, GM_BFLOAT16, hx, hdy, w, 1);
    CHECK(aligned[0] == offset[0]);
    CHECK(aligned[1] == offset[1]);
  }
}

TEST_CASE("gpu depthwise conv: rows 2^32 elements apart (64-bit offsets) give the bits of dense rows (32-bit offsets)") {
  // The kernels hold a tap's row offset within a sample as uint32 where every offset fits
  // (dw_offsets_fit_int32), else as int64. Rows of x and dy 2^32 / (N - 1) elements apart take the
  // 64-bit path in the forward, dx and dweight, and their last rows lie past 2^32 elements, where
  // a 32-bit offset would wrap (so the test fails if the host picks the 32-bit kernels there, or
  // if the 64-bit ones compute in 32 bits). Samples C apart (inputs may overlap) keep each buffer
  // at about 2^32 elements (8 GiB of bf16, 16 of fp32) of which only the rows are touched: the
  // emulator maps such buffers without committing them.
  GM_SKIP_WITHOUT_DEVICE();
  using greenmim::detail::cuda::dw_offsets_fit_int32;
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed << " (GM_TEST_SEED)");
  std::mt19937_64 rng(seed);
  const index_t grid = 4;
  const auto c = unit_mask_coords(rng, grid, 2, 0.5);
  const std::vector<index_t> cu{0, static_cast<index_t>(c.size())};
  greenmim::neighbor_table t;
  greenmim::check(greenmim::build_neighbor_table_per_sample(grid, grid, 3, span<const index_t>(cu), span<const index_t>(c), t));
  REQUIRE(t.num_tokens >= 2);
  // a full 8 x 8 stage (64 tokens, Morton order): at B 64 and C 36 the kernels walk
  std::vector<index_t> c64;
  greenmim::block_major_cells(8, 8, c64);
  const std::vector<index_t> cu64{0, static_cast<index_t>(c64.size())};
  greenmim::neighbor_table t64;
  greenmim::check(greenmim::build_neighbor_table_per_sample(8, 8, 3, span<const index_t>(cu64), span<const index_t>(c64), t64));
  REQUIRE(greenmim::detail::cuda::dw_apply_walks(64, 8, 2, 64));
  struct shape { const greenmim::neighbor_table* table; std::int64_t B, C; gm_dtype dt; };
  // C 16 bf16 / C 8 fp32: the vector path; C 12 fp16: the scalar path; B 600: many samples per
  // CTA; the last walks
  for (const shape sh : {shape{&t, 1, 16, GM_BFLOAT16}, shape{&t, 600, 16, GM_BFLOAT16}, shape{&t, 1, 12, GM_FLOAT16},
                         shape{&t, 600, 12, GM_FLOAT16}, shape{&t, 1, 8, GM_FLOAT32}, shape{&t64, 64, 36, GM_FLOAT16}}) {
    const greenmim::neighbor_table& tab = *sh.table;
    const std::int64_t N = tab.num_tokens, B = sh.B, C = sh.C;
    INFO("N " << N << " B " << B << " C " << C << " dtype " << gm_dtype_name(sh.dt));
    const htensor hx = random_htensor(sh.dt, static_cast<std::size_t>(B * N * C), rng);
    const htensor hdy = random_htensor(sh.dt, static_cast<std::size_t>(B * N * C), rng);
    const auto w = random_floats(static_cast<std::size_t>(C) * 9, rng), bias = random_floats(static_cast<std::size_t>(C), rng);
    const std::int64_t far = ((std::int64_t(1) << 32) / (N - 1) + 8) / 8 * 8;  // 16-byte aligned rows
    REQUIRE((N - 1) * far > (std::int64_t(1) << 32));  // the last row's offset wraps in 32 bits
    REQUIRE_FALSE(dw_offsets_fit_int32(N, far, C));
    const std::int64_t dense[3] = {N * C, C, 1}, strided[3] = {C, far, 1};
    const auto a = depthwise_strided(tab, B, C, sh.dt, hx, hdy, w, bias, dense, dense);
    const auto b = depthwise_strided(tab, B, C, sh.dt, hx, hdy, w, bias, strided, strided);
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO("output " << i << " (y, dx, dweight, dbias)");
      CHECK(a[i] == b[i]);
    }
  }
}

TEST_CASE("gpu depthwise conv: arbitrary tables; out-of-range entries read as zero, even where the row skipped holds NaN") {
  // Tables that no geometry makes: any token at any tap (itself, twice, none), and entries outside
  // [0, N) (pad_index, N, INT_MAX, INT_MIN, -7) that the kernels read as zero. A missing tap loads
  // the token's own row and drops its product by a predicate: tokens that nobody references (not
  // even themselves) get NaN rows, in x (forward, dweight) or in dy (dx), which must not leak.
  GM_SKIP_WITHOUT_DEVICE();
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed << " (GM_TEST_SEED)");
  std::mt19937_64 rng(seed);
  const index_t bad[] = {greenmim::pad_index, -7, std::numeric_limits<index_t>::min(), std::numeric_limits<index_t>::max()};
  struct shape { std::int64_t B, N, C; gm_dtype dt; bool walks; };
  // B 600 at small N: many samples per CTA. The last walks (dw_apply_walks: 8 tokens a thread,
  // rows kept where the entries are equal, out-of-range ones too); the walk's logic does not
  // depend on V, and a walking V = 8 case needs 2M elements at least (128 tiles of 16,384), which
  // the emulator takes 11 s to check here
  for (const shape sh : {shape{3, 37, 16, GM_BFLOAT16, false}, shape{2, 300, 24, GM_FLOAT32, false},
                         shape{5, 29, 12, GM_FLOAT16, false}, shape{1, 700, 64, GM_BFLOAT16, false},
                         shape{600, 20, 16, GM_BFLOAT16, false}, shape{600, 20, 8, GM_FLOAT32, false},
                         shape{64, 256, 36, GM_FLOAT16, true}}) {
    const std::int64_t B = sh.B, N = sh.N, C = sh.C;
    {  // the launcher's arithmetic: V = 8 where C % 8 == 0 (dense rows, 16-byte aligned)
      const std::int64_t V = C % 8 == 0 ? 8 : 1, gb = std::min<std::int64_t>(C / V, 32);
      REQUIRE(greenmim::detail::cuda::dw_apply_walks(N, 256 / gb, (C / V + gb - 1) / gb, B) == sh.walks);
    }
    for (int poisoned_tensor = 0; poisoned_tensor < 2; ++poisoned_tensor) {  // 0: x, 1: dy
      INFO("B " << B << " N " << N << " C " << C << " dtype " << gm_dtype_name(sh.dt) << " NaN rows in "
                << (poisoned_tensor ? "dy" : "x"));
      // tokens [0, 3) are never referenced; each has a missing tap
      std::uniform_int_distribution<index_t> valid(3, static_cast<index_t>(N - 1));
      std::uniform_int_distribution<int> kind(0, 9), pick(0, 4);
      greenmim::neighbor_table t;
      t.num_tokens = static_cast<index_t>(N);
      t.kernel = 3;
      t.nbr.resize(static_cast<std::size_t>(N) * 9);
      std::vector<index_t> ref(t.nbr.size());  // the reference's table: out-of-range entries as pad_index
      for (std::size_t i = 0; i < t.nbr.size(); ++i) {
        const int k = kind(rng);
        const int p = pick(rng);
        const index_t e = k < 6 ? valid(rng) : p < 4 ? bad[p] : static_cast<index_t>(N) + p;
        t.nbr[i] = e;
        ref[i] = e >= 0 && e < N ? e : greenmim::pad_index;
      }
      for (index_t k = 0; k < 3; ++k) {
        t.nbr[static_cast<std::size_t>(k) * 9 + static_cast<std::size_t>(k) * 3] = bad[k];
        ref[static_cast<std::size_t>(k) * 9 + static_cast<std::size_t>(k) * 3] = greenmim::pad_index;
      }
      htensor hx = random_htensor(sh.dt, static_cast<std::size_t>(B * N * C), rng);
      htensor hdy = random_htensor(sh.dt, static_cast<std::size_t>(B * N * C), rng);
      htensor& poisoned = poisoned_tensor ? hdy : hx;
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t k = 0; k < 3; ++k)
          for (std::int64_t c = 0; c < C; ++c) poisoned.set(static_cast<std::size_t>((b * N + k) * C + c), NAN);
      const auto w = random_floats(static_cast<std::size_t>(C) * 9, rng), bias = random_floats(static_cast<std::size_t>(C), rng);
      const std::int64_t dense[3] = {N * C, C, 1};
      // no residual: it would read the poisoned rows themselves
      const auto out = depthwise_strided(t, B, C, sh.dt, hx, hdy, w, bias, dense, dense, false);
      const auto xd = as_double(hx), dyd = as_double(hdy), wd = widen(w), bd = widen(bias);
      std::vector<double> y_ref(xd.size()), dx_ref(xd.size()), dw_ref(wd.size()), db_ref(bd.size());
      const span<const index_t> tn(ref);
      REQUIRE(greenmim::reference::depthwise_conv_forward<double>(tn, 3, make_view(xd.data(), B, N, C), make_view(wd.data(), C, 9),
                                                                  span<const double>(bd), false,
                                                                  make_view(y_ref.data(), B, N, C)) == greenmim::status::success);
      REQUIRE(greenmim::reference::depthwise_conv_backward<double>(
                  tn, 3, make_view(xd.data(), B, N, C), make_view(wd.data(), C, 9), make_view(dyd.data(), B, N, C), false,
                  make_view(dx_ref.data(), B, N, C), make_view(dw_ref.data(), C, 9), span<double>(db_ref)) ==
              greenmim::status::success);
      const double tol = tolerance(sh.dt);
      if (poisoned_tensor == 0) {  // NaN in x: y and dweight read x (dx and dbias read dy alone)
        CHECK(rel_error(as_doubles(out[0], sh.dt), y_ref) <= tol);
        CHECK(rel_error(floats_as_doubles(out[2]), dw_ref) <= 1e-5);
      }
      CHECK(rel_error(as_doubles(out[1], sh.dt), dx_ref) <= tol);  // NaN in dy: dx alone is finite
      if (poisoned_tensor == 0) CHECK(rel_error(floats_as_doubles(out[3]), db_ref) <= 1e-5);
      if (poisoned_tensor == 0) {
        // with the residual, on inputs without NaN: the residual is the token's own row, whatever
        // the table has at tap 4 (the kernel reuses tap 4's row only where it is the token's)
        INFO("residual, no NaN rows");
        const htensor cx = random_htensor(sh.dt, static_cast<std::size_t>(B * N * C), rng);
        const htensor cdy = random_htensor(sh.dt, static_cast<std::size_t>(B * N * C), rng);
        const auto res = depthwise_strided(t, B, C, sh.dt, cx, cdy, w, bias, dense, dense, true);
        const auto cxd = as_double(cx), cdyd = as_double(cdy);
        std::vector<double> yr(cxd.size()), dxr(cxd.size()), dwr(wd.size()), dbr(bd.size());
        REQUIRE(greenmim::reference::depthwise_conv_forward<double>(tn, 3, make_view(cxd.data(), B, N, C), make_view(wd.data(), C, 9),
                                                                    span<const double>(bd), true,
                                                                    make_view(yr.data(), B, N, C)) == greenmim::status::success);
        REQUIRE(greenmim::reference::depthwise_conv_backward<double>(
                    tn, 3, make_view(cxd.data(), B, N, C), make_view(wd.data(), C, 9), make_view(cdyd.data(), B, N, C), true,
                    make_view(dxr.data(), B, N, C), make_view(dwr.data(), C, 9), span<double>(dbr)) == greenmim::status::success);
        CHECK(rel_error(as_doubles(res[0], sh.dt), yr) <= tol);
        CHECK(rel_error(as_doubles(res[1], sh.dt), dxr) <= tol);
      }
    }
  }
}

TEST_CASE("gpu depthwise conv: an output's bits do not depend on where its token is (rows kept from the token before)") {
  // Where the forward and dx walk (dw_apply_walks: 8 tokens a thread, a row of a Morton-ordered
  // group of 64), they keep the last token's rows where the table says the next token's tap is
  // the same cell. Tokens in block-major order (units in Morton order, as Twins' plans make them)
  // keep 6 rows of 9 at most steps; the same tokens in a random order keep none. Each token's y
  // and dx must have the same bits either way, walking or not. dweight and dbias sum over the
  // tokens in their order: equal to a tolerance.
  GM_SKIP_WITHOUT_DEVICE();
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed << " (GM_TEST_SEED)");
  std::mt19937_64 rng(seed);
  struct shape { index_t grid, unit; double keep; int samples; std::int64_t B, C; gm_dtype dt; bool walks; };
  // samples > 1: per-sample masks packed on one token axis (B = 1), the trainer's layout. keep 1:
  // every unit, so that the token count, and the path, are fixed
  for (const shape sh : {shape{32, 8, 1.0, 10, 1, 256, GM_BFLOAT16, true},   // 10,240 tokens, 160 tiles of 64
                         shape{16, 4, 1.0, 1, 64, 36, GM_FLOAT16, true},     // scalar: 4 tiles x 2 blocks x 64
                         shape{16, 4, 0.4, 60, 1, 36, GM_FLOAT32, true},     // scalar, ~6,000 tokens
                         shape{32, 8, 0.4, 3, 1, 16, GM_BFLOAT16, false},    // a tile of 1024 tokens: too few
                         shape{32, 8, 0.4, 1, 3, 24, GM_FLOAT32, false},
                         shape{14, 2, 0.4, 1, 2, 8, GM_BFLOAT16, false}}) {
    INFO("grid " << sh.grid << " unit " << sh.unit << " samples " << sh.samples << " B " << sh.B << " C " << sh.C
                 << " dtype " << gm_dtype_name(sh.dt));
    std::vector<index_t> cells;
    greenmim::block_major_cells(sh.grid, sh.unit, cells);
    std::bernoulli_distribution keep(sh.keep);
    std::vector<index_t> coords, cu{0};
    for (int b = 0; b < sh.samples; ++b) {
      const index_t units = (sh.grid / sh.unit) * (sh.grid / sh.unit), area = sh.unit * sh.unit;
      for (index_t u = 0; u < units; ++u)
        if (keep(rng) || u == 0)
          coords.insert(coords.end(), cells.begin() + u * area, cells.begin() + (u + 1) * area);
      cu.push_back(static_cast<index_t>(coords.size()));
    }
    greenmim::neighbor_table t;
    greenmim::check(greenmim::build_neighbor_table_per_sample(sh.grid, sh.grid, 3, span<const index_t>(cu),
                                                              span<const index_t>(coords), t));
    const std::int64_t N = t.num_tokens, B = sh.B, C = sh.C;
    {  // the path the kernels take (the launcher's arithmetic: V = 8 where C % 8 == 0, rows 16-byte aligned)
      const std::int64_t V = C % 8 == 0 ? 8 : 1, gb = std::min<std::int64_t>(C / V, 32);
      REQUIRE(greenmim::detail::cuda::dw_apply_walks(N, 256 / gb, (C / V + gb - 1) / gb, B) == sh.walks);
    }
    const std::size_t es = gm_dtype_size(sh.dt), row = static_cast<std::size_t>(C) * es;
    // token t goes to perm[t]: its table row and entries, and its rows of x and dy
    std::vector<index_t> perm(static_cast<std::size_t>(N));
    for (index_t i = 0; i < N; ++i) perm[static_cast<std::size_t>(i)] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    greenmim::neighbor_table tp = t;
    for (std::int64_t i = 0; i < N; ++i)
      for (int o = 0; o < 9; ++o) {
        const index_t e = t.nbr[static_cast<std::size_t>(i * 9 + o)];
        tp.nbr[static_cast<std::size_t>(perm[static_cast<std::size_t>(i)]) * 9 + o] =
            e >= 0 && e < N ? perm[static_cast<std::size_t>(e)] : e;
      }
    const htensor hx = random_htensor(sh.dt, static_cast<std::size_t>(B * N * C), rng);
    const htensor hdy = random_htensor(sh.dt, static_cast<std::size_t>(B * N * C), rng);
    auto permuted = [&](const htensor& h) {
      htensor q = h;
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t i = 0; i < N; ++i)
          std::memcpy(&q.bytes[static_cast<std::size_t>(b * N + perm[static_cast<std::size_t>(i)]) * row],
                      &h.bytes[static_cast<std::size_t>(b * N + i) * row], row);
      return q;
    };
    const auto w = random_floats(static_cast<std::size_t>(C) * 9, rng), bias = random_floats(static_cast<std::size_t>(C), rng);
    const std::int64_t dense[3] = {N * C, C, 1};
    const auto a = depthwise_strided(t, B, C, sh.dt, hx, hdy, w, bias, dense, dense);
    const auto p = depthwise_strided(tp, B, C, sh.dt, permuted(hx), permuted(hdy), w, bias, dense, dense);
    std::int64_t differ[2] = {0, 0};
    for (int k = 0; k < 2; ++k)  // y, dx
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t i = 0; i < N; ++i)
          differ[k] += std::memcmp(&a[static_cast<std::size_t>(k)][static_cast<std::size_t>(b * N + i) * row],
                                   &p[static_cast<std::size_t>(k)][static_cast<std::size_t>(b * N + perm[static_cast<std::size_t>(i)]) * row],
                                   row) != 0;
    CHECK(differ[0] == 0);  // tokens whose y differs
    CHECK(differ[1] == 0);  // tokens whose dx differs
    CHECK(rel_error(floats_as_doubles(a[2]), floats_as_doubles(p[2])) <= 1e-5);
    CHECK(rel_error(floats_as_doubles(a[3]), floats_as_doubles(p[3])) <= 1e-5);
  }
}

TEST_CASE("depthwise (host): 32-bit row offsets exactly where every offset fits an int") {
  using greenmim::detail::cuda::dw_offsets_fit_int32;
  const std::int64_t lim = 0x7fffffff;
  CHECK(dw_offsets_fit_int32(1, lim, 1));                 // one row: only the channels count
  CHECK(dw_offsets_fit_int32(1, 0, lim));
  CHECK_FALSE(dw_offsets_fit_int32(1, 0, lim + 1));
  CHECK(dw_offsets_fit_int32(1 << 20, 0, 64));            // a zero stride: every row at 0
  CHECK_FALSE(dw_offsets_fit_int32(0, 8, 8));             // no tokens: no kernel runs; refused here
  CHECK_FALSE(dw_offsets_fit_int32(4, -8, 8));
  std::mt19937_64 rng(fresh_seed());
  std::uniform_int_distribution<std::int64_t> tok(2, std::int64_t(1) << 27), ch(1, 4096);
  for (int i = 0; i < 2000; ++i) {
    const std::int64_t N = tok(rng), C = ch(rng);
    const std::int64_t s = (lim - C) / (N - 1);  // the largest stride that fits
    INFO("N " << N << " C " << C << " stride " << s);
    CHECK((N - 1) * s + C <= lim);
    CHECK(dw_offsets_fit_int32(N, s, C));
    CHECK_FALSE(dw_offsets_fit_int32(N, s + 1, C));  // (N - 1) * (s + 1) + C > lim
    CHECK(dw_offsets_fit_int32(N, s / 2, C));
  }
}

TEST_CASE("depthwise forward (host): items per CTA") {
  using greenmim::detail::cuda::dw_apply_split_for;
  using greenmim::detail::cuda::k_dw_apply_min_ctas;
  std::mt19937_64 rng(fresh_seed());
  auto check_split = [](std::int64_t tiles, std::int64_t cblocks, std::int64_t batch) {
    INFO("tiles " << tiles << " cblocks " << cblocks << " batch " << batch);
    const auto sp = dw_apply_split_for(tiles, cblocks, batch);
    REQUIRE(sp.grid_z >= 1);
    REQUIRE(sp.tiles_per_cta >= 1);
    CHECK(sp.grid_z <= 65535);
    CHECK(sp.grid_z <= batch);
    CHECK(sp.grid_x * sp.tiles_per_cta >= tiles);        // every tile has a CTA ...
    CHECK((sp.grid_x - 1) * sp.tiles_per_cta < tiles);   // ... and every CTA a tile
    const std::int64_t samples = (batch + sp.grid_z - 1) / sp.grid_z;  // of the busiest CTA
    const std::int64_t items = samples * sp.tiles_per_cta;
    if (sp.grid_z < 65535) CHECK(items <= 8);
    const double all = static_cast<double>(tiles) * cblocks * batch;
    CHECK(static_cast<double>(sp.grid_x) * cblocks * sp.grid_z >= std::min<double>(k_dw_apply_min_ctas, all));  // the GPU stays busy
    if (all >= 2.0 * k_dw_apply_min_ctas) CHECK(items >= 2);  // and CTAs share their fixed cost
    if (sp.tiles_per_cta > 1) CHECK(samples == batch);        // samples are shared first
  };
  const std::int64_t shapes[][3] = {{1, 1, 1},     {48, 1, 64},       {8, 1, 64},  {1, 1, 1 << 30}, {100000, 1, 1},
                                    {3136, 1, 1},  {24, 4, 86},       {3, 1, 65536 * 9}, {1 << 27, 65535, 1 << 30},
                                    {5, 3, 7},     {1000, 2, 3}};
  for (const auto& sh : shapes) check_split(sh[0], sh[1], sh[2]);
  std::uniform_int_distribution<std::int64_t> d(1, 1 << 14), c(1, 64);
  for (int i = 0; i < 300; ++i) check_split(d(rng), c(rng), d(rng));
}

TEST_CASE("depthwise forward (host): where the kernel walks 8 tokens a thread") {
  using greenmim::detail::cuda::dw_apply_walks;
  using greenmim::detail::cuda::k_dw_walk_min_items;
  // the definition, in exact arithmetic: enough (tile, channel block, sample) items, and the tiles
  // padding the tokens by at most a quarter
  auto expected = [](std::int64_t tokens, std::int64_t rows, std::int64_t cblocks, std::int64_t batch) {
    const std::int64_t tile = rows / 8 * 8 * 8;
    if (tile == 0) return false;
    const std::int64_t tiles = (tokens + tile - 1) / tile;
    const long double items = static_cast<long double>(tiles) * cblocks * batch;
    return items >= k_dw_walk_min_items && (tiles * tile - tokens) * 4 <= tokens;
  };
  std::mt19937_64 rng(fresh_seed());
  std::uniform_int_distribution<std::int64_t> tok(1, 1 << 16), rws(1, 256), cb(1, 8), bt(1, 300);
  for (int i = 0; i < 5000; ++i) {
    const std::int64_t n = tok(rng), r = rws(rng), c = cb(rng), b = bt(rng);
    INFO("tokens " << n << " rows " << r << " cblocks " << c << " batch " << b);
    CHECK(dw_apply_walks(n, r, c, b) == expected(n, r, c, b));
  }
  // extremes: no overflow in the items, fewer than 8 rows cannot walk
  CHECK(dw_apply_walks(std::int64_t(1) << 31, 8, 65535, std::int64_t(1) << 30));
  CHECK(dw_apply_walks(64, 8, 65535, std::int64_t(1) << 30));  // one tile, the items capped
  CHECK_FALSE(dw_apply_walks(64, 8, 1, 127));
  CHECK_FALSE(dw_apply_walks(1 << 20, 7, 1, 1));
  CHECK_FALSE(dw_apply_walks(65, 8, 64, 64));  // 2 tiles of 64 for 65 tokens: mostly padding
  // Twins-L bf16 at 25% visible units (tokens a sample, 256 / gb token rows, channel blocks): the
  // packed per-sample layout walks at stages 1-2, not at 3-4 (96 and 48 items); the shared mask
  // at batch 64 walks at stages 1-2, not at 3-4 (48 and 12 tokens a sample: mostly padding)
  CHECK(dw_apply_walks(49152, 16, 1, 1));
  CHECK(dw_apply_walks(12288, 8, 1, 1));
  CHECK_FALSE(dw_apply_walks(3072, 8, 2, 1));
  CHECK_FALSE(dw_apply_walks(768, 8, 4, 1));
  CHECK(dw_apply_walks(768, 16, 1, 64));
  CHECK(dw_apply_walks(192, 8, 1, 64));
  CHECK_FALSE(dw_apply_walks(48, 8, 2, 64));
  CHECK_FALSE(dw_apply_walks(12, 8, 4, 64));
}

TEST_CASE("depthwise backward (host): the cut of the dweight reduction") {
  using greenmim::detail::cuda::dw_grad_channel_blocks;
  using greenmim::detail::cuda::dw_grad_split_for;
  using greenmim::detail::cuda::k_dw_grad_target_ctas;
  using greenmim::detail::cuda::k_dw_max_part_floats;
  std::mt19937_64 rng(fresh_seed());
  const std::int64_t shapes[][3] = {{1, 1, 1},          {784, 64, 128},        {13, 64, 1024},
                                    {2097120, 1, 8},    {100000, 4096, 1024},  {3, 1 << 20, 1},
                                    {2000000, 2000, 2048}, {1, 1, 2097120},    {49152, 1, 128},
                                    {1 << 26, 1 << 30, 3}, {40, 3, 2097120}};
  auto check_split = [](std::int64_t N, std::int64_t B, std::int64_t C) {
    INFO("N " << N << " B " << B << " C " << C);
    const auto s = dw_grad_split_for(N, B, C);
    CHECK(s.tile >= 1);
    CHECK(s.chunk >= 1);
    CHECK(static_cast<std::int64_t>(s.tiles) * s.tile >= N);  // every token and sample in a piece
    CHECK(static_cast<std::int64_t>(s.tiles - 1) * s.tile < N);  // and no empty piece
    CHECK(static_cast<std::int64_t>(s.chunks) * s.chunk >= B);
    CHECK(static_cast<std::int64_t>(s.chunks - 1) * s.chunk < B);
    CHECK(s.tiles <= 65535);
    CHECK(s.chunks <= 65535);
    CHECK((s.parts() * C <= k_dw_max_part_floats || s.parts() == 1));
    // about the target's CTAs: not many more (unless one piece's channel blocks pass it) ...
    const double ctas = static_cast<double>(s.parts()) * static_cast<double>(dw_grad_channel_blocks(C));
    const double limit = static_cast<double>(k_dw_grad_target_ctas) * 1.1;
    if (dw_grad_channel_blocks(C) < k_dw_grad_target_ctas) CHECK((ctas <= limit || s.parts() == 1));
    // ... and not far fewer, unless the finest cut (32 tokens x 1 sample) has fewer, or the
    // workspace cap or a grid extent forced the merge
    const double finest = std::ceil(N / 32.0) * static_cast<double>(B) * static_cast<double>(dw_grad_channel_blocks(C));
    const bool forced = 2.0 * static_cast<double>(s.parts()) * C > static_cast<double>(k_dw_max_part_floats) ||
                        2 * static_cast<std::int64_t>(s.tiles) > 65535 || 2 * static_cast<std::int64_t>(s.chunks) > 65535;
    if (!forced) CHECK(ctas >= std::min(finest, limit / 2.0 / 1.1));
  };
  for (const auto& sh : shapes) check_split(sh[0], sh[1], sh[2]);
  std::uniform_int_distribution<std::int64_t> n(1, 1 << 22), b(1, 1 << 14), c(1, 1 << 12);
  for (int i = 0; i < 200; ++i) check_split(n(rng), b(rng), c(rng));
  std::uniform_int_distribution<std::int64_t> n2(1, 1 << 16), b2(1, 128), c2(1, 2048);
  for (int i = 0; i < 500; ++i) check_split(n2(rng), b2(rng), c2(rng));
  // Twins-L at 25% visible (docs/perf/NVIDIA_H100_80GB_HBM3_2026-11-26g/, call 5): the cuts measured
  // fastest, per-sample (B = 1: 49152 tokens at stage 1) and with a shared mask (batch 64)
  CHECK(dw_grad_split_for(49152, 1, 128).tile == 256);
  CHECK(dw_grad_split_for(12288, 1, 256).tile == 128);
  const auto sh = dw_grad_split_for(768, 64, 128);
  CHECK(sh.tile == 32);
  CHECK(sh.chunk == 8);
}

TEST_CASE("gpu block conv (kernel = stride): fwd and bwd vs the CPU reference") {
  GM_SKIP_WITHOUT_DEVICE();
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed << " (GM_TEST_SEED)");
  std::mt19937_64 rng(seed);
  const auto c = unit_mask_coords(rng, 16, 4, 0.5);  // 4 x 4-token units on a 16 x 16 stage
  const std::vector<index_t> cu{0, static_cast<index_t>(c.size())};
  for (gm_dtype dt : {GM_FLOAT32, GM_FLOAT16, GM_BFLOAT16}) {
    block_case("GSA-like s 4", cu, c, 16, 4, 2, 12, 20, dt, rng);
    block_case("patch-embedding-like s 2", cu, c, 16, 2, 2, 8, 70, dt, rng);
    block_case("image patch embedding s 4", cu, c, 16, 4, 3, 3, 40, dt, rng);
  }
  std::vector<index_t> flat = c, cu2{0, static_cast<index_t>(c.size())};
  const auto c2 = unit_mask_coords(rng, 16, 4, 0.75);
  flat.insert(flat.end(), c2.begin(), c2.end());
  cu2.push_back(static_cast<index_t>(flat.size()));
  block_case("per-sample s 4", cu2, flat, 16, 4, 1, 16, 16, GM_FLOAT32, rng);
  // split reductions: the forward's K = s*s*C_in = 1024 (up to 8 splits of 128), dweight's
  // K = B * N_next rows; and the backward with dweight or dbias alone (the dbias column)
  {
    using greenmim::detail::cuda::gemm_split_for;
    const greenmim::block_table bt = block_table_16(c);
    CHECK(gemm_split_for(2 * bt.num_outputs(), 24, 16 * 64).splits > 1);
    CHECK(gemm_split_for(24, 16 * 8 + 1, 40 * bt.num_outputs()).splits > 1);
  }
  block_case("split fwd s 4", cu, c, 16, 4, 2, 64, 24, GM_BFLOAT16, rng);
  block_case("split dweight s 4", cu, c, 16, 4, 40, 8, 24, GM_FLOAT16, rng);
  block_case("split, dweight alone", cu, c, 16, 4, 40, 8, 24, GM_FLOAT32, rng, 1);
  block_case("split, dbias alone", cu, c, 16, 4, 40, 8, 24, GM_BFLOAT16, rng, 2);
#if !defined(GREENMIM_CUDA_EMULATION)
  // dweight's bits must not depend on whether dbias is requested, nor dbias's on dweight: at this
  // shape (C_out 512, s*s*C_in 64, 8,192+ rows) a split computed from the requested columns alone
  // would differ (8 column tiles against 16). ~0.3 GFLOP a run: on a device only.
  {
    const greenmim::block_table bt = block_table_16(c);
    const std::int64_t B = (8192 + bt.num_outputs() - 1) / bt.num_outputs() + 1, N = bt.num_inputs, Nn = bt.num_outputs();
    const std::int64_t Ci = 4, Co = 512;
    const htensor hx = random_htensor(GM_BFLOAT16, static_cast<std::size_t>(B * N * Ci), rng);
    const htensor hdy = random_htensor(GM_BFLOAT16, static_cast<std::size_t>(B * Nn * Co), rng);
    const auto w = random_floats(static_cast<std::size_t>(Co * Ci * 16), rng);
    dbuf<unsigned char> x = to_device(hx), dy = to_device(hdy), dx(static_cast<std::size_t>(B * N * Ci) * 2);
    dbuf<index_t> gather = to_device(bt.gather);
    dbuf<float> wd = to_device(w);
    std::vector<bytes> got[3];
    for (int grads = 0; grads < 3; ++grads) {
      dbuf<float> dweight(w.size()), dbias(static_cast<std::size_t>(Co));
      gm_block_conv_args a{};
      a.dtype = GM_BFLOAT16;
      a.x = make_tensor(x.p, {B, N, Ci}, {N * Ci, Ci, 1});
      a.dy = make_tensor(dy.p, {B, Nn, Co}, {Nn * Co, Co, 1});
      a.dx = make_tensor(dx.p, {B, N, Ci}, {N * Ci, Ci, 1});
      a.gather = gather.p;
      a.stride = 4;
      a.weight = wd.p;
      a.dweight = grads == 2 ? nullptr : dweight.p;
      a.dbias = grads == 1 ? nullptr : dbias.p;
      std::size_t ws_bytes = 0;
      GM_CHECK_CUDA(gm_block_conv_bwd_workspace_size(&a, &ws_bytes));
      dbuf<unsigned char> ws(ws_bytes);
      GM_CHECK_CUDA(gm_block_conv_bwd(&a, ws.p, ws_bytes, nullptr));
      GM_CHECK_CUDA(cudaDeviceSynchronize());
      got[grads] = {float_bytes(dweight.download()), float_bytes(dbias.download())};
    }
    CHECK(got[0][0] == got[1][0]);  // dweight with and without dbias
    CHECK(got[0][1] == got[2][1]);  // dbias with and without dweight
  }
#endif
}

//! Block conv forward and backward with every activation (x, y, dy, dx) `offset` elements into its
//! buffer and its token rows `pad` elements apart beyond C; returns y, dx (as dense bytes), dweight
//! and dbias.
std::vector<bytes> block_outputs_at(const greenmim::block_table& bt, index_t s, std::int64_t B, std::int64_t Ci,
                                    std::int64_t Co, gm_dtype dt, const htensor& hx, const htensor& hdy,
                                    const std::vector<float>& w, const std::vector<float>& bias, std::int64_t offset,
                                    std::int64_t pad) {
  const std::int64_t N = bt.num_inputs, Nn = bt.num_outputs();
  const std::size_t es = gm_dtype_size(dt);
  // strided copy of a dense [B, rows, C] host tensor into a device buffer
  auto place = [&](const htensor& h, std::int64_t rows, std::int64_t C) {
    htensor t(dt, static_cast<std::size_t>(offset + B * rows * (C + pad)));
    for (std::size_t i = 0; i < t.size(); ++i) t.set(i, 0.f);
    for (std::int64_t r = 0; r < B * rows; ++r)
      std::memcpy(&t.bytes[static_cast<std::size_t>(offset + r * (C + pad)) * es], &h.bytes[static_cast<std::size_t>(r * C) * es],
                  static_cast<std::size_t>(C) * es);
    return to_device(t);
  };
  auto dense = [&](const dbuf<unsigned char>& d, std::int64_t rows, std::int64_t C) {
    const bytes all = d.download();
    bytes out(static_cast<std::size_t>(B * rows * C) * es);
    for (std::int64_t r = 0; r < B * rows; ++r)
      std::memcpy(&out[static_cast<std::size_t>(r * C) * es], &all[static_cast<std::size_t>(offset + r * (C + pad)) * es],
                  static_cast<std::size_t>(C) * es);
    return out;
  };
  htensor hy(dt, static_cast<std::size_t>(B * Nn * Co)), hdx(dt, static_cast<std::size_t>(B * N * Ci));
  dbuf<unsigned char> x = place(hx, N, Ci), dy = place(hdy, Nn, Co), y = place(hy, Nn, Co), dx = place(hdx, N, Ci);
  dbuf<index_t> gather = to_device(bt.gather);
  dbuf<float> wd = to_device(w), bd = to_device(bias), dweight(w.size()), dbias(bias.size());
  gm_block_conv_args a{};
  a.dtype = dt;
  const std::int64_t xr = Ci + pad, yr = Co + pad;
  a.x = make_tensor(static_cast<unsigned char*>(x.p) + offset * es, {B, N, Ci}, {N * xr, xr, 1});
  a.y = make_tensor(static_cast<unsigned char*>(y.p) + offset * es, {B, Nn, Co}, {Nn * yr, yr, 1});
  a.dy = make_tensor(static_cast<unsigned char*>(dy.p) + offset * es, {B, Nn, Co}, {Nn * yr, yr, 1});
  a.dx = make_tensor(static_cast<unsigned char*>(dx.p) + offset * es, {B, N, Ci}, {N * xr, xr, 1});
  a.gather = gather.p;
  a.stride = s;
  a.weight = wd.p;
  a.bias = bd.p;
  a.dweight = dweight.p;
  a.dbias = dbias.p;
  std::size_t fwd_ws = 0, bwd_ws = 0;
  GM_CHECK_CUDA(gm_block_conv_fwd_workspace_size(&a, &fwd_ws));
  GM_CHECK_CUDA(gm_block_conv_bwd_workspace_size(&a, &bwd_ws));
  dbuf<unsigned char> ws(fwd_ws > bwd_ws ? fwd_ws : bwd_ws);
  GM_CHECK_CUDA(gm_block_conv_fwd(&a, ws.p, fwd_ws, nullptr));
  GM_CHECK_CUDA(gm_block_conv_bwd(&a, ws.p, bwd_ws, nullptr));
  GM_CHECK_CUDA(cudaDeviceSynchronize());
  return {dense(y, Nn, Co), dense(dx, N, Ci), float_bytes(dweight.download()), float_bytes(dbias.download())};
}

TEST_CASE("gpu block conv: results do not depend on the activations' alignment or row strides") {
  GM_SKIP_WITHOUT_DEVICE();
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed << " (GM_TEST_SEED)");
  std::mt19937_64 rng(seed);
  const greenmim::block_table bt = block_table_16(unit_mask_coords(rng, 16, 4, 0.5));
  const std::int64_t B = 3, N = bt.num_inputs, Nn = bt.num_outputs();
  // C_in 16 and 24: the tensor cores' 16-byte loads when aligned; C_in 3: an image's channels
  for (const auto& sh : {std::array<std::int64_t, 2>{16, 40}, std::array<std::int64_t, 2>{24, 16},
                         std::array<std::int64_t, 2>{3, 32}}) {
    for (gm_dtype dt : {GM_FLOAT16, GM_BFLOAT16, GM_FLOAT32}) {
      const std::int64_t Ci = sh[0], Co = sh[1];
      INFO("C_in " << Ci << " C_out " << Co << " dtype " << gm_dtype_name(dt));
      const htensor hx = random_htensor(dt, static_cast<std::size_t>(B * N * Ci), rng);
      const htensor hdy = random_htensor(dt, static_cast<std::size_t>(B * Nn * Co), rng);
      const auto w = random_floats(static_cast<std::size_t>(Co * Ci * 16), rng);
      const auto bias = random_floats(static_cast<std::size_t>(Co), rng);
      const auto aligned = block_outputs_at(bt, 4, B, Ci, Co, dt, hx, hdy, w, bias, 0, 0);
      for (const auto& op : {std::array<std::int64_t, 2>{1, 0}, std::array<std::int64_t, 2>{0, 3},
                             std::array<std::int64_t, 2>{5, 8}}) {
        INFO("offset " << op[0] << " row pad " << op[1]);
        const auto moved = block_outputs_at(bt, 4, B, Ci, Co, dt, hx, hdy, w, bias, op[0], op[1]);
        for (int k = 0; k < 4; ++k) CHECK(moved[k] == aligned[k]);
      }
    }
  }
}

TEST_CASE("gpu block conv: no input channels (the dbias column alone)") {
  GM_SKIP_WITHOUT_DEVICE();
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed << " (GM_TEST_SEED)");
  std::mt19937_64 rng(seed);
  const greenmim::block_table bt = block_table_16(unit_mask_coords(rng, 16, 4, 0.5));
  const std::int64_t B = 3, N = bt.num_inputs, Nn = bt.num_outputs(), Co = 5;
  for (gm_dtype dt : {GM_FLOAT32, GM_FLOAT16, GM_BFLOAT16}) {  // a fuzzer found the 16-bit path dividing by C_in
    INFO("dtype " << gm_dtype_name(dt));
    const htensor hdy = random_htensor(dt, static_cast<std::size_t>(B * Nn * Co), rng);
    dbuf<unsigned char> x(16), dx(16), dy = to_device(hdy);
    dbuf<index_t> gather = to_device(bt.gather);
    dbuf<float> w(4), dbias(static_cast<std::size_t>(Co));
    dbias.fill_bytes(0xFF);
    gm_block_conv_args a{};
    a.dtype = dt;
    a.x = make_tensor(x.p, {B, N, 0}, {0, 0, 1});
    a.dx = make_tensor(dx.p, {B, N, 0}, {0, 0, 1});
    a.dy = make_tensor(dy.p, {B, Nn, Co}, {Nn * Co, Co, 1});
    a.gather = gather.p;
    a.stride = 4;
    a.weight = w.p;
    a.dbias = dbias.p;
    std::size_t ws_bytes = 0;
    GM_CHECK_CUDA(gm_block_conv_bwd_workspace_size(&a, &ws_bytes));
    dbuf<unsigned char> ws(ws_bytes > 0 ? ws_bytes : 16);
    GM_CHECK_CUDA(gm_block_conv_bwd(&a, ws.p, ws_bytes, nullptr));
    GM_CHECK_CUDA(cudaDeviceSynchronize());
    const auto dyd = as_double(hdy), got = widen(dbias.download());
    std::vector<double> want(static_cast<std::size_t>(Co), 0.0);
    for (std::size_t i = 0; i < dyd.size(); ++i) want[i % static_cast<std::size_t>(Co)] += dyd[i];
    CHECK(rel_error(got, want) <= 1e-5);
  }
}

TEST_CASE("block conv (host): the split of its GEMMs") {
  using greenmim::detail::cuda::gemm_split_for;
  std::mt19937_64 rng(fresh_seed());
  auto check_split = [](std::int64_t M, std::int64_t N, std::int64_t K) {
    INFO("M " << M << " N " << N << " K " << K);
    const auto s = gemm_split_for(M, N, K);
    REQUIRE(s.splits >= 1);
    CHECK(s.splits <= 65535);
    const std::int64_t tiles = ((M + greenmim::detail::cuda::k_gemm_bm - 1) / greenmim::detail::cuda::k_gemm_bm) *
                               ((N + greenmim::detail::cuda::k_gemm_bn - 1) / greenmim::detail::cuda::k_gemm_bn);
    if (tiles >= greenmim::detail::cuda::k_gemm_wave_tiles) CHECK(s.splits == 1);  // a wave without a split
    if (s.splits == 1) {
      CHECK(s.partial_floats(M, N) == 0);
      CHECK(s.k_per >= K);  // one split covers the whole reduction
      return;
    }
    CHECK(s.k_per % greenmim::detail::cuda::k_gemm_bk == 0);
    CHECK(static_cast<std::int64_t>(s.splits) * s.k_per >= K);      // every k in a split
    CHECK(static_cast<std::int64_t>(s.splits - 1) * s.k_per < K);   // and no empty split
    CHECK(s.k_per >= greenmim::detail::cuda::k_gemm_min_k_per_split);
    CHECK(s.partial_floats(M, N) <= greenmim::detail::cuda::k_gemm_max_partial_floats);
  };
  const std::int64_t shapes[][3] = {{0, 5, 5},      {5, 0, 5},        {5, 5, 0},         {1, 1, 1},
                                    {768, 128, 8192}, {256, 513, 12544}, {12544, 512, 256}, {1, 1, 2147483647}};
  for (const auto& sh : shapes) check_split(sh[0], sh[1], sh[2]);
  std::uniform_int_distribution<std::int64_t> d(1, 1 << 16);
  for (int i = 0; i < 300; ++i) check_split(d(rng), d(rng), d(rng));
  // Twins-L GSA sub-sampling at stage 1 (batch 64, 12 outputs per sample): 24 output tiles, split
  // so that the grid has about k_gemm_target_ctas CTAs
  CHECK(gemm_split_for(768, 128, 8192).splits >= 32);
  // its patch embedding at stage 1 (12288 outputs x 256 channels, K = 512): 768 tiles, no split
  CHECK(gemm_split_for(12288, 256, 512).splits == 1);
}

TEST_CASE("gpu conv entry points refuse bad arguments before launching") {
  // no device needed: every refusal happens on the host
  std::vector<float> host(64);
  float* p = host.data();
  gm_depthwise_conv_args a{};
  a.dtype = GM_FLOAT32;
  a.x = make_tensor(p, {1, 2, 4}, {8, 4, 1});
  a.y = make_tensor(p + 16, {1, 2, 4}, {8, 4, 1});
  const index_t nbr[18] = {};
  a.nbr = nbr;
  a.weight = p + 32;
  a.kernel = 3;
  CHECK(gm_depthwise_conv_fwd_can_implement(&a) == cudaSuccess);
  a.kernel = 9;  // beyond the kernels' stencils (test_depthwise_k_gpu.cpp: every k)
  CHECK(gm_depthwise_conv_fwd_can_implement(&a) == cudaErrorInvalidValue);
  CHECK(std::string(gm_last_refusal()).find("kernel") != std::string::npos);
  a.kernel = 3;
  a.y = make_tensor(p + 4, {1, 2, 4}, {8, 4, 1});  // overlaps x
  CHECK(gm_depthwise_conv_fwd(&a, nullptr) == cudaErrorInvalidValue);
  a.y = make_tensor(p + 16, {1, 3, 4}, {12, 4, 1});
  CHECK(gm_depthwise_conv_fwd(&a, nullptr) == cudaErrorInvalidValue);
  a.y = make_tensor(p + 16, {1, 2, 4}, {8, 4, 1});
  a.nbr = nullptr;
  CHECK(gm_depthwise_conv_fwd(&a, nullptr) == cudaErrorInvalidValue);
  a.nbr = nbr;
  a.dtype = static_cast<gm_dtype>(7);
  CHECK(gm_depthwise_conv_fwd(&a, nullptr) == cudaErrorInvalidValue);
  a.dtype = GM_FLOAT32;
  a.dy = make_tensor(p + 16, {1, 2, 4}, {8, 4, 1});
  a.dx = make_tensor(p + 40, {1, 2, 4}, {8, 4, 1});
  a.dweight = p + 56;
  std::size_t bytes = 0;
  CHECK(gm_depthwise_conv_bwd_workspace_size(&a, &bytes) == cudaSuccess);
  CHECK(bytes == 4 * 10 * sizeof(float));
  CHECK(gm_depthwise_conv_bwd(&a, nullptr, 0, nullptr) == cudaErrorInvalidValue);  // workspace too small
  CHECK(std::string(gm_last_refusal()).find("workspace") != std::string::npos);
  CHECK(gm_depthwise_conv_bwd_workspace_size(nullptr, &bytes) == cudaErrorInvalidValue);

  gm_block_conv_args b{};
  b.dtype = GM_FLOAT16;
  b.x = make_tensor(p, {1, 4, 2}, {8, 2, 1});
  b.y = make_tensor(p + 16, {1, 1, 3}, {3, 3, 1});
  const index_t g4[4] = {0, 1, 2, 3};
  b.gather = g4;
  b.stride = 2;
  b.weight = p + 32;
  CHECK(gm_block_conv_fwd_can_implement(&b) == cudaSuccess);
  b.stride = 0;
  CHECK(gm_block_conv_fwd(&b, nullptr, 0, nullptr) == cudaErrorInvalidValue);
  b.stride = 2;
  b.gather = nullptr;
  CHECK(gm_block_conv_fwd(&b, nullptr, 0, nullptr) == cudaErrorInvalidValue);
  b.gather = g4;
  b.x = make_tensor(p, {1, 4, 2}, {8, 1, 2});  // last stride not 1
  CHECK(gm_block_conv_fwd(&b, nullptr, 0, nullptr) == cudaErrorInvalidValue);
  CHECK(gm_block_conv_bwd(nullptr, nullptr, 0, nullptr) == cudaErrorInvalidValue);
  std::size_t ws_bytes = 0;
  CHECK(gm_block_conv_fwd_workspace_size(&b, &ws_bytes) == cudaErrorInvalidValue);  // the bad x, again
  CHECK(gm_block_conv_bwd_workspace_size(nullptr, &ws_bytes) == cudaErrorInvalidValue);
  {  // more channels than the depthwise grid's channel blocks can hold (65535 x 32)
    gm_depthwise_conv_args big = a;
    big.x = make_tensor(p, {1, 1, 3000000}, {3000000, 3000000, 1});
    CHECK(gm_depthwise_conv_fwd_can_implement(&big) == cudaErrorInvalidValue);
    CHECK(std::string(gm_last_refusal()).find("too many channels") != std::string::npos);
  }
  {  // 2^30 samples (x's sample stride 0: no memory behind them): the forward's sample index
    // b + grid.z could pass int range
    gm_depthwise_conv_args big = a;
    big.x = make_tensor(p, {std::int64_t(1) << 30, 2, 4}, {0, 4, 1});
    big.y = make_tensor(p + 16, {std::int64_t(1) << 30, 2, 4}, {8, 4, 1});
    CHECK(gm_depthwise_conv_fwd_can_implement(&big) == cudaErrorInvalidValue);
    CHECK(std::string(gm_last_refusal()).find("B < 2^30") != std::string::npos);
  }
  {  // s = 1, C_in = 2^31 - 8: s*s*C_in + 1 (the dbias column) fits an int, rounded up to 8 not
    gm_block_conv_args big = b;
    big.stride = 1;
    big.x = make_tensor(p, {1, 1, 0x7ffffff8}, {0x7ffffff8, 0x7ffffff8, 1});
    big.dy = make_tensor(p, {1, 1, 3}, {3, 3, 1});
    CHECK(gm_block_conv_bwd_can_implement(&big) == cudaErrorInvalidValue);
    CHECK(std::string(gm_last_refusal()).find("s * s * C_in + 1") != std::string::npos);
  }
}

#if defined(GREENMIM_CUDA_EMULATION)
#include "cuda_emu.hpp"

TEST_CASE("emulated conv kernels: bitwise identical under every thread schedule (no races between barriers)") {
  struct restore {
    ~restore() {
      gm_emu::set_schedule(gm_emu::schedule::forward);
      gm_emu::set_cp_async_timing(gm_emu::cp_async_timing::at_wait);
    }
  } guard;
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed << " (GM_TEST_SEED)");
  auto run_all = [](std::uint64_t inputs) {
    std::mt19937_64 rng(inputs);
    std::vector<bytes> out;
    const auto c = unit_mask_coords(rng, 16, 4, 0.5);
    const std::vector<index_t> cu{0, static_cast<index_t>(c.size())};
    for (auto& b : depthwise_case("schedule", cu, c, 16, 2, 16, GM_BFLOAT16, true, rng)) out.push_back(b);
    for (auto& b : depthwise_case("schedule", cu, c, 16, 1, 3, GM_FLOAT32, false, rng)) out.push_back(b);
    for (auto& b : depthwise_case("schedule", cu, c, 16, 11, 16, GM_FLOAT16, true, rng)) out.push_back(b);
    for (auto& b : block_case("schedule", cu, c, 16, 4, 2, 12, 20, GM_FLOAT16, rng)) out.push_back(b);
    // C_in a multiple of 8: the forward's cp.async ring (gather_gemm_async). Here 4 steps per
    // split (the ring's slots reused) and 64 x 72 outputs, so every warp's outputs are real: a
    // warp that overwrote a slot another still reads would change the result
    for (auto& b : block_case("schedule", cu, c, 16, 2, 2, 64, 72, GM_BFLOAT16, rng)) out.push_back(b);
    for (auto& b : block_case("schedule", cu, c, 16, 4, 2, 64, 24, GM_BFLOAT16, rng)) out.push_back(b);
    return out;
  };
  std::mt19937_64 rng(seed);
  const std::uint64_t inputs = rng();
  gm_emu::set_schedule(gm_emu::schedule::forward);
  const auto want = run_all(inputs);
  const std::vector<std::pair<gm_emu::schedule, std::uint64_t>> others = {
      {gm_emu::schedule::reverse, 0}, {gm_emu::schedule::random, rng()}, {gm_emu::schedule::greedy, 0}};
  for (const auto& sch : others) {
    INFO("schedule " << static_cast<int>(sch.first) << " seed " << sch.second);
    gm_emu::set_schedule(sch.first, sch.second);
    const auto got = run_all(inputs);
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == want[i]);
  }
  // cp.async landing when issued (the other end of its window): a copy into a ring slot that other
  // warps still read changes what they read where one warp runs ahead (greedy)
  gm_emu::set_cp_async_timing(gm_emu::cp_async_timing::at_issue);
  for (const auto& sch : {std::make_pair(gm_emu::schedule::forward, std::uint64_t(0)),
                          std::make_pair(gm_emu::schedule::greedy, std::uint64_t(0))}) {
    INFO("cp.async at issue, schedule " << static_cast<int>(sch.first));
    gm_emu::set_schedule(sch.first, sch.second);
    const auto got = run_all(inputs);
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == want[i]);
  }
}
#endif
