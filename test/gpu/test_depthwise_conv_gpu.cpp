// GPU tests of the depthwise submanifold conv (kernels/depthwise_conv.cu, PEG's 3x3) against the
// CPU reference (include/greenmim/reference/conv.hpp, in double on the inputs as the device sees
// them), and its launch rules (kernels/detail/conv_split.hpp, on the host). Run on a device by
// greenmim_gpu_tests and on the CPU emulator by greenmim_emu_tests.
#include "conv_test_util.hpp"

using namespace gm_test;
using namespace gm_conv_test;
using greenmim::index_t;
using greenmim::make_view;
using greenmim::span;

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
