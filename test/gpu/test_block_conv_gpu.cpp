// GPU tests of the experimental fused block conv (kernels/block_conv.cu, kernel = stride) against
// the CPU reference (include/greenmim/reference/conv.hpp, in double on the inputs as the device
// sees them), and its split-K rule (kernels/detail/conv_split.hpp, on the host). Run on a device
// by greenmim_gpu_tests and on the CPU emulator by greenmim_emu_tests.
#include "conv_test_util.hpp"

using namespace gm_test;
using namespace gm_conv_test;
using greenmim::index_t;
using greenmim::make_view;
using greenmim::span;

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
