// GPU tests of the k x k depthwise submanifold conv for k != 3 (kernels/detail/dw_taps.cuh:
// ConvNeXt's 7 x 7, 5 x 5, 1 x 1) against the CPU reference (include/greenmim/reference/conv.hpp,
// in double on the inputs as the device sees them), and the entry points' refusals of the k they
// do not take. Run on a device by greenmim_gpu_tests and on the CPU emulator by
// greenmim_emu_tests; the emulated sizes are small (CI time).
#include "conv_test_util.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <greenmim/reference/conv.hpp>
#include <greenmim/sparse_conv.hpp>

#include "../../kernels/detail/conv_split.hpp"

namespace {

using namespace gm_test;
using greenmim::index_t;
using greenmim::make_view;
using greenmim::span;
using namespace gm_conv_test;  // random_htensor, random_floats, as_double(s), widen, float_bytes

//! Outputs of one forward + backward: y, dx, dweight, dbias.
struct dk_out {
  bytes y, dx;
  std::vector<float> dw, db;
};

//! Forward and backward of the k x k conv on dense [B, N, C] tensors placed `offset` elements
//! into their buffers (offset 1: rows not 16-byte aligned, the scalar path). Checks the
//! workspace's size, and that dweight and dbias come out bitwise the same over a poisoned
//! workspace.
dk_out run_dk(const std::vector<index_t>& nbr, index_t k, std::int64_t B, std::int64_t N, std::int64_t C, gm_dtype dt,
              const htensor& hx, const htensor& hdy, const std::vector<float>& w, const std::vector<float>& bias,
              bool residual, std::int64_t offset = 0) {
  const std::size_t es = gm_dtype_size(dt), n = static_cast<std::size_t>(B * N * C);
  auto place = [&](const htensor& h) {
    dbuf<unsigned char> d((n + 8) * es);
    bytes b((n + 8) * es, 0);
    if (n) std::memcpy(b.data() + offset * es, h.bytes.data(), n * es);
    d.upload(b);
    return d;
  };
  dbuf<unsigned char> x = place(hx), dy = place(hdy), y((n + 8) * es), dx((n + 8) * es);
  y.fill_bytes(0xFF);  // NaN: an output row left unwritten shows
  dx.fill_bytes(0xFF);
  dbuf<index_t> nd = to_device(nbr);
  dbuf<float> wd = to_device(w), bd = to_device(bias), dweight(static_cast<std::size_t>(C * k * k)),
              dbias(static_cast<std::size_t>(C));
  dweight.fill_bytes(0xFF);  // NaN: a gradient left unwritten shows
  dbias.fill_bytes(0xFF);
  gm_depthwise_conv_args a{};
  a.dtype = dt;
  a.x = make_tensor(x.p + offset * es, {B, N, C}, {N * C, C, 1});
  a.dy = make_tensor(dy.p + offset * es, {B, N, C}, {N * C, C, 1});
  a.y = make_tensor(y.p + offset * es, {B, N, C}, {N * C, C, 1});
  a.dx = make_tensor(dx.p + offset * es, {B, N, C}, {N * C, C, 1});
  a.nbr = nd.p;
  a.kernel = k;
  a.weight = wd.p;
  a.bias = bd.p;
  a.dweight = dweight.p;
  a.dbias = dbias.p;
  a.residual = residual ? 1 : 0;
  const std::int64_t parts = B && N && C ? greenmim::detail::cuda::dw_grad_split_for(N, B, C * k).parts() : 0;
  auto grads = depthwise_run_twice(a, static_cast<std::size_t>(parts * C * (k * k + 1)) * sizeof(float), dweight, dbias);
  auto strip = [&](const bytes& b) { return bytes(b.begin() + offset * es, b.begin() + (offset * es + n * es)); };
  return dk_out{strip(y.download()), strip(dx.download()), std::move(grads.first), std::move(grads.second)};
}

//! run_dk against the double reference; `ref_nbr` is the table as the reference reads it (entries
//! outside [0, N) as pad_index). Returns the device's outputs.
dk_out check_dk(const std::vector<index_t>& nbr, const std::vector<index_t>& ref_nbr, index_t k, std::int64_t B,
                std::int64_t N, std::int64_t C, gm_dtype dt, bool residual, std::mt19937_64& rng,
                std::int64_t offset = 0) {
  INFO("k " << k << " B " << B << " N " << N << " C " << C << " dtype " << gm_dtype_name(dt) << " residual "
            << residual << " offset " << offset);
  const std::int64_t K = static_cast<std::int64_t>(k) * k;
  const htensor hx = random_htensor(dt, static_cast<std::size_t>(B * N * C), rng);
  const htensor hdy = random_htensor(dt, static_cast<std::size_t>(B * N * C), rng);
  const auto w = random_floats(static_cast<std::size_t>(C * K), rng), bias = random_floats(static_cast<std::size_t>(C), rng);
  const dk_out out = run_dk(nbr, k, B, N, C, dt, hx, hdy, w, bias, residual, offset);
  const auto xd = as_double(hx), dyd = as_double(hdy), wd = widen(w), bd = widen(bias);
  std::vector<double> y_ref(xd.size()), dx_ref(xd.size()), dw_ref(wd.size()), db_ref(bd.size());
  const span<const index_t> tn(ref_nbr);
  REQUIRE(greenmim::reference::depthwise_conv_forward<double>(tn, k, make_view(xd.data(), B, N, C), make_view(wd.data(), C, K),
                                                              span<const double>(bd), residual,
                                                              make_view(y_ref.data(), B, N, C)) == greenmim::status::success);
  REQUIRE(greenmim::reference::depthwise_conv_backward<double>(
              tn, k, make_view(xd.data(), B, N, C), make_view(wd.data(), C, K), make_view(dyd.data(), B, N, C), residual,
              make_view(dx_ref.data(), B, N, C), make_view(dw_ref.data(), C, K), span<double>(db_ref)) ==
          greenmim::status::success);
  const double tol = tolerance(dt);
  CHECK(rel_error(as_doubles(out.y, dt), y_ref) <= tol);
  CHECK(rel_error(as_doubles(out.dx, dt), dx_ref) <= tol);
  CHECK(rel_error(widen(out.dw), dw_ref) <= 1e-5);
  CHECK(rel_error(widen(out.db), db_ref) <= 1e-5);
  return out;
}

//! A per-sample k x k table of `samples` random token sets on a grid x grid stage (one empty).
std::vector<index_t> random_per_sample_table(std::mt19937_64& rng, index_t grid, index_t k, int samples, double keep_p,
                                             std::int64_t& N) {
  std::vector<index_t> flat, cu{0};
  std::bernoulli_distribution keep(keep_p);
  for (int b = 0; b < samples; ++b) {
    for (index_t h = 0; h < grid; ++h)
      for (index_t w = 0; w < grid; ++w)
        if (b != 1 && keep(rng)) flat.push_back(greenmim::pack_coord(h, w));
    cu.push_back(static_cast<index_t>(flat.size()));
  }
  greenmim::neighbor_table t;
  greenmim::check(greenmim::build_neighbor_table_per_sample(grid, grid, k, span<const index_t>(cu),
                                                            span<const index_t>(flat), t));
  N = t.num_tokens;
  return t.nbr;
}

}  // namespace

TEST_CASE("gpu depthwise k x k (k = 1, 5, 7): fwd and bwd vs the CPU reference, vector and scalar paths") {
  GM_SKIP_WITHOUT_DEVICE();
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed << " (GM_TEST_SEED)");
  std::mt19937_64 rng(seed);
  for (index_t k : {7, 5, 1}) {
    std::int64_t N = 0;
    // per-sample flat layout on a 9 x 9 stage: borders on every side of a 7 x 7 stencil
    const auto t = random_per_sample_table(rng, 9, k, 3, 0.5, N);
    check_dk(t, t, k, 1, N, 16, GM_BFLOAT16, true, rng);   // V = 8
    check_dk(t, t, k, 1, N, 12, GM_FLOAT32, false, rng);   // V = 1
    check_dk(t, t, k, 2, N, 8, GM_FLOAT16, true, rng);     // batch axis over one table
  }
  // a shared mask with several samples per CTA and more than one channel block (C 136: 17 groups
  // of 8, 16 per block), fp32 (two 16-byte halves a row)
  std::int64_t N = 0;
  const auto t7 = random_per_sample_table(rng, 8, 7, 1, 0.4, N);
  check_dk(t7, t7, 7, 5, N, 136, GM_FLOAT32, true, rng);
}

TEST_CASE("gpu depthwise k x k: dweight and dbias bits do not depend on the inputs' alignment") {
  GM_SKIP_WITHOUT_DEVICE();
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed << " (GM_TEST_SEED)");
  std::mt19937_64 rng(seed);
  std::int64_t N = 0;
  const auto t = random_per_sample_table(rng, 8, 7, 2, 0.6, N);
  for (std::int64_t C : {8, 24}) {
    INFO("C " << C);
    const std::int64_t B = 3, n = B * N * C;
    const htensor hx = random_htensor(GM_BFLOAT16, static_cast<std::size_t>(n), rng);
    const htensor hdy = random_htensor(GM_BFLOAT16, static_cast<std::size_t>(n), rng);
    const auto w = random_floats(static_cast<std::size_t>(C * 49), rng), bias = random_floats(static_cast<std::size_t>(C), rng);
    const dk_out aligned = run_dk(t, 7, B, N, C, GM_BFLOAT16, hx, hdy, w, bias, true, 0);  // V = 8 / 2
    const dk_out offset = run_dk(t, 7, B, N, C, GM_BFLOAT16, hx, hdy, w, bias, true, 1);   // V = 1
    CHECK(float_bytes(aligned.dw) == float_bytes(offset.dw));
    CHECK(float_bytes(aligned.db) == float_bytes(offset.db));
    CHECK(aligned.y == offset.y);    // every output is bias (+ x) + taps in order, either path
    CHECK(aligned.dx == offset.dx);
  }
}

TEST_CASE("gpu depthwise k x k: arbitrary tables; out-of-range entries read as zero, NaN rows nobody reads stay out") {
  GM_SKIP_WITHOUT_DEVICE();
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed << " (GM_TEST_SEED)");
  std::mt19937_64 rng(seed);
  const index_t bad[] = {greenmim::pad_index, -7, std::numeric_limits<index_t>::min(), std::numeric_limits<index_t>::max()};
  const index_t k = 5;
  const std::int64_t K = 25, N = 40, B = 2;
  for (const std::int64_t C : {16, 5}) {
    std::uniform_int_distribution<index_t> valid(3, static_cast<index_t>(N - 1));
    std::uniform_int_distribution<int> kind(0, 9), pick(0, 3);
    std::vector<index_t> nbr(static_cast<std::size_t>(N * K)), ref(nbr.size());
    for (std::size_t i = 0; i < nbr.size(); ++i) {
      const index_t e = kind(rng) < 6 ? valid(rng) : bad[pick(rng)];
      nbr[i] = e;
      ref[i] = e >= 0 && e < N ? e : greenmim::pad_index;
    }
    // tokens 0..2 are referenced by nobody: NaN in their x rows must not reach y or dweight
    htensor hx = random_htensor(GM_FLOAT32, static_cast<std::size_t>(B * N * C), rng);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < 3; ++t)
        for (std::int64_t c = 0; c < C; ++c) hx.set(static_cast<std::size_t>((b * N + t) * C + c), NAN);
    const htensor hdy = random_htensor(GM_FLOAT32, static_cast<std::size_t>(B * N * C), rng);
    const auto w = random_floats(static_cast<std::size_t>(C * K), rng), bias = random_floats(static_cast<std::size_t>(C), rng);
    const dk_out out = run_dk(nbr, k, B, N, C, GM_FLOAT32, hx, hdy, w, bias, false);
    const auto xd = as_double(hx), dyd = as_double(hdy), wd = widen(w), bd = widen(bias);
    std::vector<double> y_ref(xd.size()), dx_ref(xd.size()), dw_ref(wd.size()), db_ref(bd.size());
    const span<const index_t> tn(ref);
    REQUIRE(greenmim::reference::depthwise_conv_forward<double>(tn, k, make_view(xd.data(), B, N, C),
                                                                make_view(wd.data(), C, K), span<const double>(bd), false,
                                                                make_view(y_ref.data(), B, N, C)) == greenmim::status::success);
    REQUIRE(greenmim::reference::depthwise_conv_backward<double>(
                tn, k, make_view(xd.data(), B, N, C), make_view(wd.data(), C, K), make_view(dyd.data(), B, N, C), false,
                make_view(dx_ref.data(), B, N, C), make_view(dw_ref.data(), C, K), span<double>(db_ref)) ==
            greenmim::status::success);
    INFO("C " << C);
    CHECK(rel_error(as_doubles(out.y, GM_FLOAT32), y_ref) <= 1e-5);
    CHECK(rel_error(as_doubles(out.dx, GM_FLOAT32), dx_ref) <= 1e-5);
    CHECK(rel_error(widen(out.dw), dw_ref) <= 1e-5);
    CHECK(rel_error(widen(out.db), db_ref) <= 1e-5);
  }
}

TEST_CASE("gpu depthwise: an empty batch zeroes the gradients, 3x3 and k x k") {
  GM_SKIP_WITHOUT_DEVICE();
  std::mt19937_64 rng(3);
  const htensor none(GM_FLOAT32, 0);
  for (index_t k : {3, 5, 7}) {  // 3: the 3x3 family's entry; 5, 7: dw_taps
    INFO("k " << k);
    const auto w = random_floats(static_cast<std::size_t>(8 * k * k), rng), bias = random_floats(8, rng);
    for (std::int64_t B : {0, 2}) {  // no sample, or samples without tokens
      const dk_out out = run_dk({}, k, B, 0, 8, GM_FLOAT32, none, none, w, bias, true);
      CHECK(out.dw.size() == static_cast<std::size_t>(8 * k * k));
      for (float v : out.dw) CHECK(v == 0.f);
      for (float v : out.db) CHECK(v == 0.f);
    }
  }
}

TEST_CASE("depthwise entry points take k = 1, 3, 5, 7 and refuse the others with the reason") {
  // no device needed: every refusal happens on the host
  std::vector<float> host(64);
  float* p = host.data();
  gm_depthwise_conv_args a{};
  a.dtype = GM_FLOAT32;
  a.x = make_tensor(p, {1, 2, 4}, {8, 4, 1});
  a.y = make_tensor(p + 16, {1, 2, 4}, {8, 4, 1});
  a.dy = make_tensor(p + 24, {1, 2, 4}, {8, 4, 1});
  a.dx = make_tensor(p + 40, {1, 2, 4}, {8, 4, 1});
  const index_t nbr[2 * 49] = {};
  a.nbr = nbr;
  a.weight = p + 48;
  for (int k : {1, 3, 5, 7}) {
    INFO("k " << k);
    a.kernel = k;
    CHECK(gm_depthwise_conv_fwd_can_implement(&a) == cudaSuccess);
    CHECK(gm_depthwise_conv_bwd_can_implement(&a) == cudaSuccess);
  }
  for (int k : {2, 4, 8, 0, -2}) {
    INFO("k " << k);
    a.kernel = k;
    CHECK(gm_depthwise_conv_fwd_can_implement(&a) == cudaErrorInvalidValue);
    CHECK(std::string(gm_last_refusal()).find("odd") != std::string::npos);
    CHECK(gm_depthwise_conv_bwd_can_implement(&a) == cudaErrorInvalidValue);
  }
  for (int k : {9, 15, -1, 101}) {
    INFO("k " << k);
    a.kernel = k;
    CHECK(gm_depthwise_conv_fwd(&a, nullptr) == cudaErrorInvalidValue);
    CHECK(std::string(gm_last_refusal()).find("1, 3, 5 or 7") != std::string::npos);
    std::size_t bytes = 1;
    CHECK(gm_depthwise_conv_bwd_workspace_size(&a, &bytes) == cudaErrorInvalidValue);
    CHECK(bytes == 1);
  }
  // the channel limit of the k x k kernels (65535 blocks of 16 groups)
  a.kernel = 7;
  a.x = make_tensor(p, {1, 0, 65535LL * 16 + 1}, {0, 65535LL * 16 + 1, 1});
  a.y = make_tensor(p + 16, {1, 0, 65535LL * 16 + 1}, {0, 65535LL * 16 + 1, 1});
  CHECK(gm_depthwise_conv_fwd_can_implement(&a) == cudaErrorInvalidValue);
  CHECK(std::string(gm_last_refusal()).find("channels") != std::string::npos);
}

#if defined(GREENMIM_CUDA_EMULATION)
TEST_CASE("emulated k x k kernels: bitwise identical under every thread schedule (no races between barriers)") {
  struct restore {
    ~restore() { gm_emu::set_schedule(gm_emu::schedule::forward); }
  } guard;
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed << " (GM_TEST_SEED)");
  auto run_all = [](std::uint64_t inputs) {
    std::mt19937_64 rng(inputs);
    std::vector<bytes> out;
    std::int64_t N = 0;
    const auto t = random_per_sample_table(rng, 8, 7, 2, 0.6, N);
    for (const auto& c : {std::make_pair(std::int64_t(16), GM_BFLOAT16), std::make_pair(std::int64_t(5), GM_FLOAT32)}) {
      const std::int64_t B = 2, C = c.first, n = B * N * C;
      const htensor hx = random_htensor(c.second, static_cast<std::size_t>(n), rng);
      const htensor hdy = random_htensor(c.second, static_cast<std::size_t>(n), rng);
      const auto w = random_floats(static_cast<std::size_t>(C * 49), rng), bias = random_floats(static_cast<std::size_t>(C), rng);
      const dk_out o = run_dk(t, 7, B, N, C, c.second, hx, hdy, w, bias, true);
      out.push_back(o.y);
      out.push_back(o.dx);
      out.push_back(float_bytes(o.dw));
      out.push_back(float_bytes(o.db));
    }
    return out;
  };
  std::mt19937_64 rng(seed);
  const std::uint64_t inputs = rng();
  check_schedules_agree(run_all, inputs, rng);
}
#endif
