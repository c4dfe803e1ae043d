// GPU tests of the fused group window attention (forward and backward) against the CPU reference
// (include/greenmim/reference/attention.hpp, evaluated in double on the same rounded inputs).
// Fresh random inputs every run (seed printed; GM_TEST_SEED=<n> replays one). Outputs are
// poisoned (NaN bytes) first: every real element must be written, and the poisoned padding
// around the views (extra rows and columns) must come back untouched.
#include "gpu_test_util.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#if __has_include(<Eigen/Dense>)
#include <greenmim/reference/attention.hpp>
#define GM_HAVE_REFERENCE 1
#else
#define GM_HAVE_REFERENCE 0
#endif

namespace {

using namespace gm_test;
using greenmim::index_t;

#define GM_SKIP_WITHOUT_REFERENCE()                                                        \
  do {                                                                                     \
    if (!GM_HAVE_REFERENCE) {                                                              \
      MESSAGE("SKIPPED (CPU reference needs Eigen3): "                                     \
              << std::string(doctest::getContextOptions()->currentTest->m_name));                  \
      return;                                                                              \
    }                                                                                      \
  } while (0)

//! Where the elements of a logical [B, N, H, D] (or [B, N, H] with D = 1) tensor live in a
//! storage buffer: element (b, t, h, d) at offset + b*s[0] + t*s[1] + h*s[2] + d*s[3].
struct layout {
  std::int64_t B = 0, N = 0, H = 0, D = 1;
  std::int64_t offset = 0;
  std::int64_t s[4] = {0, 0, 0, 1};
  std::int64_t storage = 0;
  std::int64_t at(std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d) const {
    return offset + b * s[0] + t * s[1] + h * s[2] + d * s[3];
  }
  std::int64_t logical(std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d) const {
    return ((b * N + t) * H + h) * D + d;
  }
  std::int64_t count() const { return B * N * H * D; }
};

layout contiguous(std::int64_t B, std::int64_t N, std::int64_t H, std::int64_t D) {
  layout l;
  l.B = B; l.N = N; l.H = H; l.D = D;
  l.s[0] = N * H * D; l.s[1] = H * D; l.s[2] = D; l.s[3] = 1;
  l.storage = B * N * H * D;
  return l;
}

//! Slice j of a packed [B, N, 3, H, D] qkv buffer (the qkv projection's output).
layout packed_qkv(int j, std::int64_t B, std::int64_t N, std::int64_t H, std::int64_t D) {
  layout l;
  l.B = B; l.N = N; l.H = H; l.D = D;
  l.offset = j * H * D;
  l.s[0] = N * 3 * H * D; l.s[1] = 3 * H * D; l.s[2] = D; l.s[3] = 1;
  l.storage = B * N * 3 * H * D;
  return l;
}

//! A view with poisoned margins: 2 extra token rows, `pad_cols` extra columns per row, and a
//! leading offset of `lead` elements (lead % 8 != 0 breaks 16-byte alignment on purpose).
layout padded(std::int64_t B, std::int64_t N, std::int64_t H, std::int64_t D, std::int64_t pad_cols, std::int64_t lead) {
  layout l;
  l.B = B; l.N = N; l.H = H; l.D = D;
  const std::int64_t row = D + pad_cols;
  l.offset = lead;
  l.s[3] = 1; l.s[2] = row; l.s[1] = H * row; l.s[0] = (N + 2) * H * row;
  l.storage = lead + B * l.s[0];
  return l;
}

gm_tensor tensor_of(void* base, gm_dtype dt, const layout& l, int rank) {
  gm_tensor t{};
  t.data = static_cast<unsigned char*>(base) + l.offset * static_cast<std::int64_t>(gm_dtype_size(dt));
  t.rank = rank;
  const std::int64_t ext[4] = {l.B, l.N, l.H, l.D};
  for (int i = 0; i < rank; ++i) {
    t.extent[i] = ext[i];
    t.stride[i] = l.s[i];
  }
  return t;
}

//! Random logical values rounded to dtype, written into a storage tensor with layout l.
std::vector<double> fill_random(htensor& store, const layout& l, std::mt19937_64& rng, double sd) {
  std::normal_distribution<float> nd(0.f, static_cast<float>(sd));
  std::vector<double> vals(static_cast<std::size_t>(l.count()));
  for (std::int64_t b = 0; b < l.B; ++b)
    for (std::int64_t t = 0; t < l.N; ++t)
      for (std::int64_t h = 0; h < l.H; ++h)
        for (std::int64_t d = 0; d < l.D; ++d) {
          const std::size_t at = static_cast<std::size_t>(l.at(b, t, h, d));
          store.set(at, nd(rng));
          vals[static_cast<std::size_t>(l.logical(b, t, h, d))] = store.get(at);
        }
  return vals;
}

void write_value(htensor& store, const layout& l, std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d,
                 float x, std::vector<double>& vals) {
  store.set(static_cast<std::size_t>(l.at(b, t, h, d)), x);
  vals[static_cast<std::size_t>(l.logical(b, t, h, d))] = store.get(static_cast<std::size_t>(l.at(b, t, h, d)));
}

//! Reads the logical values of a poisoned output and checks that (a) every element inside the
//! view was written (not the poison pattern, unless `allow_nan`), (b) every byte outside it is
//! still poison. Returns the logical values.
std::vector<double> read_output(const std::vector<unsigned char>& bytes, gm_dtype dt, const layout& l, bool allow_nan,
                                const char* what) {
  const std::size_t es = gm_dtype_size(dt);
  htensor h(dt, bytes.size() / es);
  h.bytes = bytes;
  std::vector<char> inside(static_cast<std::size_t>(l.storage), 0);
  std::vector<double> vals(static_cast<std::size_t>(l.count()));
  std::int64_t unwritten = 0;
  for (std::int64_t b = 0; b < l.B; ++b)
    for (std::int64_t t = 0; t < l.N; ++t)
      for (std::int64_t hh = 0; hh < l.H; ++hh)
        for (std::int64_t d = 0; d < l.D; ++d) {
          const std::size_t at = static_cast<std::size_t>(l.at(b, t, hh, d));
          inside[at] = 1;
          const double x = h.get(at);
          vals[static_cast<std::size_t>(l.logical(b, t, hh, d))] = x;
          if (!allow_nan && std::isnan(x)) ++unwritten;
        }
  std::int64_t leaked = 0;
  for (std::size_t i = 0; i < inside.size(); ++i) {
    if (inside[i]) continue;
    for (std::size_t k = 0; k < es; ++k) leaked += bytes[i * es + k] != 0xFF;
  }
  INFO(what << ": " << unwritten << " elements left unwritten (NaN poison), " << leaked << " bytes written outside the view");
  CHECK(unwritten == 0);
  CHECK(leaked == 0);
  return vals;
}

//! NaN patterns equal, and the relative error over the non-NaN entries below `tol`.
void compare(const std::vector<double>& got, const std::vector<double>& want, double tol, const char* what) {
  REQUIRE(got.size() == want.size());
  std::int64_t nan_mismatch = 0;
  std::vector<double> g, w;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool gn = std::isnan(got[i]), wn = std::isnan(want[i]);
    if (gn != wn) ++nan_mismatch;
    if (!gn && !wn) {
      g.push_back(got[i]);
      w.push_back(want[i]);
    }
  }
  const double err = rel_error(g, w);
  INFO(what << ": rel error " << err << " (tol " << tol << "), NaN-pattern mismatches " << nan_mismatch);
  CHECK(nan_mismatch == 0);
  CHECK(err <= tol);
}

const char* algo_name(gm_algo a) { return a == GM_ALGO_MMA ? "mma" : a == GM_ALGO_SIMT ? "simt" : "auto"; }

// ---- one attention problem on the device --------------------------------------------------------------

struct attn_setup {
  const problem* prob = nullptr;
  gm_dtype dt = GM_FLOAT32;
  std::int64_t B = 1, N = 0, H = 1, D = 32, R = 0;
  index_t window = 0;
  bool with_bias = true;
  layout lq, lk, lv;
  htensor hq, hk, hv;                    // storage (q, k, v share it when packed)
  std::vector<double> q, k, v, bias;     // logical values (rounded)
  dbuf<unsigned char> dq_in, dk_in, dv_in;  // device storage (dk_in/dv_in empty when packed)
  dbuf<float> dbias_table;
  bool packed = false;

  gm_tensor tq() const { return tensor_of(dq_in.p, dt, lq, 4); }
  gm_tensor tk() const { return tensor_of(packed ? dq_in.p : dk_in.p, dt, lk, 4); }
  gm_tensor tv() const { return tensor_of(packed ? dq_in.p : dv_in.p, dt, lv, 4); }
  gm_tensor tbias() const {
    return with_bias ? make_tensor(dbias_table.p, {R, H}, {H, 1}) : make_tensor(nullptr, {R, H}, {H, 1});
  }
  void upload() {
    dq_in = to_device(hq);
    if (!packed) {
      dk_in = to_device(hk);
      dv_in = to_device(hv);
    }
  }
};

attn_setup make_setup(const problem& prob, gm_dtype dt, std::int64_t H, std::int64_t D, bool packed, bool with_bias,
                      std::mt19937_64& rng) {
  attn_setup s;
  s.prob = &prob;
  s.dt = dt;
  s.B = prob.batch;
  s.N = prob.part.num_tokens;
  s.H = H;
  s.D = D;
  s.window = prob.geom.window;
  s.R = (2 * s.window - 1) * (2 * s.window - 1);
  s.with_bias = with_bias;
  s.packed = packed;
  if (packed) {
    s.lq = packed_qkv(0, s.B, s.N, H, D);
    s.lk = packed_qkv(1, s.B, s.N, H, D);
    s.lv = packed_qkv(2, s.B, s.N, H, D);
    s.hq = htensor(dt, static_cast<std::size_t>(s.lq.storage));
    s.q = fill_random(s.hq, s.lq, rng, 1.0);
    s.k = fill_random(s.hq, s.lk, rng, 1.0);
    s.v = fill_random(s.hq, s.lv, rng, 1.0);
  } else {
    s.lq = s.lk = s.lv = contiguous(s.B, s.N, H, D);
    s.hq = htensor(dt, static_cast<std::size_t>(s.lq.storage));
    s.hk = htensor(dt, static_cast<std::size_t>(s.lk.storage));
    s.hv = htensor(dt, static_cast<std::size_t>(s.lv.storage));
    s.q = fill_random(s.hq, s.lq, rng, 1.0);
    s.k = fill_random(s.hk, s.lk, rng, 1.0);
    s.v = fill_random(s.hv, s.lv, rng, 1.0);
  }
  std::normal_distribution<float> nd(0.f, 0.5f);
  std::vector<float> bias(static_cast<std::size_t>(s.R * H));
  for (auto& x : bias) x = nd(rng);
  s.bias.assign(bias.begin(), bias.end());
  s.dbias_table = to_device(bias);
  s.upload();
  return s;
}

struct fwd_out {
  std::vector<double> o, lse;
};

//! Runs the kernel forward into poisoned, padded outputs and checks the margins.
fwd_out gpu_forward(const attn_setup& s, const device_partition& dp, gm_algo algo, std::int64_t lead = 0,
                    bool with_lse = true, bool allow_nan = false) {
  const layout lo = padded(s.B, s.N, s.H, s.D, 8, lead);
  const layout ll = padded(s.B, s.N, s.H, 1, 3, 0);
  dbuf<unsigned char> o(static_cast<std::size_t>(lo.storage) * gm_dtype_size(s.dt));
  dbuf<unsigned char> lse(static_cast<std::size_t>(ll.storage) * 4);
  o.fill_bytes(0xFF);
  lse.fill_bytes(0xFF);
  gm_attention_fwd_args a{};
  a.dtype = s.dt;
  a.q = s.tq();
  a.k = s.tk();
  a.v = s.tv();
  a.o = tensor_of(o.p, s.dt, lo, 4);
  a.lse = with_lse ? tensor_of(lse.p, GM_FLOAT32, ll, 3) : make_tensor(nullptr, {s.B, s.N, s.H}, {0, 0, 0});
  a.bias_table = s.tbias();
  a.part = dp.c();
  a.window = s.window;
  a.scale = 0.f;
  a.algo = algo;
  GM_CHECK_CUDA(gm_attention_fwd(&a, nullptr));
  GM_CHECK_CUDA(cudaDeviceSynchronize());
  fwd_out r;
  r.o = read_output(o.download(), s.dt, lo, allow_nan, "o");
  const std::vector<unsigned char> lb = lse.download();
  if (with_lse) r.lse = read_output(lb, GM_FLOAT32, ll, allow_nan, "lse");
  else CHECK(std::all_of(lb.begin(), lb.end(), [](unsigned char c) { return c == 0xFF; }));
  return r;
}

#if GM_HAVE_REFERENCE
namespace ref = greenmim::reference;

fwd_out cpu_forward(const attn_setup& s, const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v) {
  fwd_out r;
  r.o.assign(static_cast<std::size_t>(s.B * s.N * s.H * s.D), 0.0);
  r.lse.assign(static_cast<std::size_t>(s.B * s.N * s.H), 0.0);
  ref::attention_args<double> a;
  a.q = greenmim::make_view<const double>(q.data(), s.B, s.N, s.H, s.D);
  a.k = greenmim::make_view<const double>(k.data(), s.B, s.N, s.H, s.D);
  a.v = greenmim::make_view<const double>(v.data(), s.B, s.N, s.H, s.D);
  a.part = greenmim::make_partition_view(s.prob->part);
  if (s.with_bias) a.bias = greenmim::make_view<const double>(s.bias.data(), s.R, s.H);
  a.window = s.window;
  a.out = greenmim::make_view(r.o.data(), s.B, s.N, s.H, s.D);
  a.lse = greenmim::make_view(r.lse.data(), s.B, s.N, s.H);
  REQUIRE(ref::group_attention_forward(a) == greenmim::status::success);
  return r;
}
#endif

//! The forward's algorithms: the tensor-core one takes fp16/bf16 and G <= 256 (one pass up to
//! 64, query tiles above).
std::vector<gm_algo> algos_for(gm_dtype dt, index_t G) {
  std::vector<gm_algo> a = {GM_ALGO_AUTO, GM_ALGO_SIMT, GM_ALGO_MMA};
  if (dt == GM_FLOAT32 || G > 256) a.pop_back();  // (not push_back: GCC 12 -Warray-bounds false positive)
  return a;
}

void check_forward(const problem& prob, gm_dtype dt, std::int64_t H, std::int64_t D, bool packed, bool with_bias,
                   std::mt19937_64& rng) {
#if GM_HAVE_REFERENCE
  INFO(prob.name << " dtype " << gm_dtype_name(dt) << " H " << H << " D " << D << (packed ? " packed qkv" : "")
                 << (with_bias ? "" : " no bias"));
  device_partition dp(prob.part);
  attn_setup s = make_setup(prob, dt, H, D, packed, with_bias, rng);
  const fwd_out want = cpu_forward(s, s.q, s.k, s.v);
  fwd_out auto_out;  // AUTO's result, to check which kernel it picked
  for (gm_algo algo : algos_for(dt, prob.part.group_size)) {
    INFO("algo " << std::string(algo_name(algo)));
    const fwd_out got = gpu_forward(s, dp, algo);
    compare(got.o, want.o, tolerance(dt), "o");
    compare(got.lse, want.lse, dt == GM_FLOAT32 ? 1e-5 : 1e-3, "lse");
    if (algo == GM_ALGO_AUTO) auto_out = got;
    if (algo == GM_ALGO_MMA) {  // AUTO runs the tensor-core kernels wherever they apply
      CHECK(got.o == auto_out.o);
      CHECK(got.lse == auto_out.lse);
    }
  }
#else
  (void)prob; (void)dt; (void)H; (void)D; (void)packed; (void)with_bias; (void)rng;
#endif
}

}  // namespace

TEST_CASE("gpu attention forward: shared mask, Swin stage shapes, every dtype and head_dim") {
  GM_SKIP_WITHOUT_DEVICE();
  GM_SKIP_WITHOUT_REFERENCE();
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const problem stage1 = shared_mask_problem(rng, 56, 7, 0, 2);
  const problem stage2 = shared_mask_problem(rng, 28, 7, 3, 3);
  for (gm_dtype dt : {GM_FLOAT32, GM_FLOAT16, GM_BFLOAT16})
    for (std::int64_t D : {32, 64}) {
      check_forward(stage1, dt, 2, D, true, true, rng);
      check_forward(stage2, dt, 3, D, false, true, rng);
    }
  check_forward(stage2, GM_BFLOAT16, 2, 32, false, false, rng);  // no bias table
}

TEST_CASE("gpu attention forward: per-sample flat layout, per-window and single-group plans, large groups") {
  GM_SKIP_WITHOUT_DEVICE();
  GM_SKIP_WITHOUT_REFERENCE();
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const problem per_sample = per_sample_problem(rng, 14, 7, 3, 5, 0.4);
  const problem per_window = shared_mask_problem(rng, 28, 7, 0, 2, greenmim::strategy::per_window);
  const problem big_window = shared_mask_problem(rng, 28, 14, 7, 2, greenmim::strategy::single);  // p = 14, G > 64
  const problem masking = single_group_problem(rng, 56, 7, 3, 1);  // G = N = 768, windows interleaved
  for (gm_dtype dt : {GM_FLOAT32, GM_BFLOAT16}) {
    check_forward(per_sample, dt, 2, 32, false, true, rng);
    check_forward(per_window, dt, 2, 64, true, true, rng);
    check_forward(big_window, dt, 2, 32, true, true, rng);
    check_forward(masking, dt, 1, 64, false, true, rng);
  }
  check_forward(big_window, GM_FLOAT16, 1, 64, false, true, rng);
}

TEST_CASE("gpu attention forward: unaligned rows take the element-wise path; lse optional") {
  GM_SKIP_WITHOUT_DEVICE();
  GM_SKIP_WITHOUT_REFERENCE();
#if GM_HAVE_REFERENCE
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  // window 7 (the one-pass tensor-core forward) and window 14 in one group of ~200 slots (its
  // query tiles)
  const problem prob = shared_mask_problem(rng, 28, 7, 3, 2);
  const problem big = shared_mask_problem(rng, 28, 14, 7, 1, greenmim::strategy::single);
  for (const problem* pr : {&prob, &big}) {
    INFO(pr->name);
    device_partition dp(pr->part);
    for (gm_dtype dt : {GM_FLOAT32, GM_FLOAT16, GM_BFLOAT16}) {
      if (pr == &big && dt != GM_BFLOAT16) continue;
      INFO("dtype " << gm_dtype_name(dt));
      attn_setup s = make_setup(*pr, dt, 2, 32, false, true, rng);
      const fwd_out want = cpu_forward(s, s.q, s.k, s.v);
      // o starts one element past a 16-byte boundary: AUTO must fall back to SIMT, MMA must refuse
      const fwd_out got = gpu_forward(s, dp, GM_ALGO_AUTO, 1, false);
      compare(got.o, want.o, tolerance(dt), "o (unaligned)");
      if (dt != GM_FLOAT32) {
        gm_attention_fwd_args a{};
        a.dtype = dt;
        a.q = s.tq();
        a.k = s.tk();
        a.v = s.tv();
        dbuf<unsigned char> o(static_cast<std::size_t>(s.B * s.N * s.H * s.D + 8) * 2);
        a.o = tensor_of(o.p, dt, [&] { layout l = contiguous(s.B, s.N, s.H, s.D); l.offset = 1; return l; }(), 4);
        a.bias_table = s.tbias();
        a.part = dp.c();
        a.window = s.window;
        a.algo = GM_ALGO_MMA;
        CHECK(gm_attention_fwd_can_implement(&a) == cudaErrorInvalidValue);
        CHECK(gm_attention_fwd(&a, nullptr) == cudaErrorInvalidValue);
        // aligned: accepted (G <= 256); the same with G = 257 (checked, never launched): refused
        a.o = tensor_of(o.p, dt, contiguous(s.B, s.N, s.H, s.D), 4);
        CHECK(gm_attention_fwd_can_implement(&a) == cudaSuccess);
        a.part.group_size = 257;
        CHECK(gm_attention_fwd_can_implement(&a) == cudaErrorInvalidValue);
      }
    }
  }
#endif
}

TEST_CASE("gpu attention forward: NaN propagates within its window only") {
  GM_SKIP_WITHOUT_DEVICE();
  GM_SKIP_WITHOUT_REFERENCE();
#if GM_HAVE_REFERENCE
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  // a plan whose groups hold several windows, so that isolation inside a group is exercised; and
  // windows of 14, shifted, in one group of ~200 slots (the tensor-core query tiles: a NaN in v
  // sends the key tile that holds it through the exact per-pair path)
  const problem small = shared_mask_problem(rng, 28, 7, 3, 2, greenmim::strategy::fast, 49);
  const problem big = shared_mask_problem(rng, 28, 14, 7, 2, greenmim::strategy::single);
  struct nan_case {
    const problem* prob;
    std::vector<gm_dtype> dtypes;
  };
  for (const nan_case& c : {nan_case{&small, {GM_FLOAT32, GM_BFLOAT16}}, nan_case{&big, {GM_FLOAT16}}}) {
    const problem& prob = *c.prob;
    INFO(prob.name);
    device_partition dp(prob.part);
    // pick a token whose group holds at least two windows
    index_t victim = -1;
    for (index_t g = 0; g < prob.part.num_groups && victim < 0; ++g) {
      const index_t G = prob.part.group_size;
      const index_t first = prob.part.slot_window[static_cast<std::size_t>(g) * G];
      bool several = false;
      for (index_t i = 0; i < G; ++i) {
        const index_t w = prob.part.slot_window[static_cast<std::size_t>(g) * G + i];
        several = several || (w >= 0 && w != first);
      }
      if (several) victim = prob.part.gather[static_cast<std::size_t>(g) * G];
    }
    REQUIRE(victim >= 0);
    for (gm_dtype dt : c.dtypes) {
      for (int which : {0, 1, 2}) {  // NaN in q, k or v of the victim token (sample 1, head 0, dim 3)
        INFO("dtype " << gm_dtype_name(dt) << " NaN in " << std::string(1, "qkv"[which]));
        attn_setup s = make_setup(prob, dt, 2, 32, false, true, rng);
        htensor& hs = which == 0 ? s.hq : which == 1 ? s.hk : s.hv;
        std::vector<double>& vals = which == 0 ? s.q : which == 1 ? s.k : s.v;
        write_value(hs, which == 0 ? s.lq : which == 1 ? s.lk : s.lv, 1, victim, 0, 3, NAN, vals);
        s.upload();
        const fwd_out want = cpu_forward(s, s.q, s.k, s.v);
        std::int64_t nan_rows = 0, finite_rows = 0;
        for (double x : want.o) (std::isnan(x) ? nan_rows : finite_rows) += 1;
        CHECK(nan_rows > 0);
        CHECK(finite_rows > 0);
        for (gm_algo algo : algos_for(dt, prob.part.group_size)) {
          INFO("algo " << std::string(algo_name(algo)));
          const fwd_out got = gpu_forward(s, dp, algo, 0, true, true);
          compare(got.o, want.o, tolerance(dt), "o");
          compare(got.lse, want.lse, dt == GM_FLOAT32 ? 1e-5 : 1e-3, "lse");
        }
      }
    }
  }
#endif
}

TEST_CASE("gpu attention forward: tensor-core query tiles for 64 < G <= 256 (windows 12, 14, 16)") {
  GM_SKIP_WITHOUT_DEVICE();
  GM_SKIP_WITHOUT_REFERENCE();
#if GM_HAVE_REFERENCE
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const auto fast = greenmim::strategy::fast, single = greenmim::strategy::single;
  // window 14, shifted, one group of every visible token (~200: four query tiles, the last one
  // partial, several windows per tile)
  const problem w14_shift = shared_mask_problem(rng, 28, 14, 7, 2, single);
  // Swin-B window 14 stage 1: groups of a fixed 200 slots (not a multiple of 16) holding several
  // windows each, and of exactly 256
  const problem w14_g200 = shared_mask_problem(rng, 56, 14, 0, 1, fast, 200);
  const problem w14_g256 = shared_mask_problem(rng, 56, 14, 7, 1, fast, 256);
  // Swin V2 windows 16 and 12 (per-sample flat layout, shifted): half the tokens kept, so every
  // window of 16 holds ~128 and the planner's G lies in (64, 256]
  const problem w16 = per_sample_problem(rng, 32, 16, 8, 2, 0.5, fast, 256);
  const problem w12 = per_sample_problem(rng, 24, 12, 6, 3, 0.6, fast, 256);
  for (const problem* pr : {&w14_shift, &w14_g200, &w14_g256, &w16, &w12}) {
    INFO(pr->name);
    REQUIRE(pr->part.group_size > 64);
    REQUIRE(pr->part.group_size <= 256);
  }
  CHECK(w14_g200.part.group_size == 200);
  CHECK(w14_g256.part.group_size == 256);
  check_forward(w14_shift, GM_BFLOAT16, 2, 32, true, true, rng);
  check_forward(w14_shift, GM_FLOAT16, 1, 64, false, false, rng);  // no bias table
  check_forward(w14_g200, GM_BFLOAT16, 1, 64, false, true, rng);
  check_forward(w14_g256, GM_FLOAT16, 1, 32, false, true, rng);
  check_forward(w16, GM_FLOAT16, 2, 32, false, true, rng);
  check_forward(w16, GM_BFLOAT16, 1, 64, true, true, rng);
  check_forward(w12, GM_BFLOAT16, 2, 32, false, true, rng);

  // no lse requested (gpu_forward checks that the poisoned lse buffer stays untouched), and the
  // same o as with lse
  device_partition dp(w16.part);
  attn_setup s = make_setup(w16, GM_BFLOAT16, 1, 32, false, true, rng);
  const fwd_out want = cpu_forward(s, s.q, s.k, s.v);
  const fwd_out with_lse = gpu_forward(s, dp, GM_ALGO_MMA);
  const fwd_out no_lse = gpu_forward(s, dp, GM_ALGO_MMA, 0, false);
  compare(no_lse.o, want.o, tolerance(GM_BFLOAT16), "o (no lse)");
  CHECK(no_lse.o == with_lse.o);
  // (unaligned rows and G > 256: the case "unaligned rows take the element-wise path" above)
#endif
}

// ---- backward ---------------------------------------------------------------------------------------------

namespace {

struct bwd_out {
  std::vector<double> dq, dk, dv;
  std::vector<float> dbias;  // raw, for bitwise comparisons
  std::vector<unsigned char> raw_dq, raw_dk, raw_dv;
};

//! Kernel backward with o / lse from the kernel forward (passed in, device), poisoned padded
//! outputs, dbias starting from `dbias0`.
bwd_out gpu_backward(const attn_setup& s, const device_partition& dp, const gm_tensor& o, const gm_tensor& lse,
                     const gm_tensor& d_o, const std::vector<float>& dbias0, bool want_dbias, bool allow_nan,
                     gm_algo algo = GM_ALGO_AUTO) {
  const layout lg = padded(s.B, s.N, s.H, s.D, 8, 0);
  const std::size_t bytes = static_cast<std::size_t>(lg.storage) * gm_dtype_size(s.dt);
  dbuf<unsigned char> dq(bytes), dk(bytes), dv(bytes);
  dq.fill_bytes(0xFF);
  dk.fill_bytes(0xFF);
  dv.fill_bytes(0xFF);
  dbuf<float> dbias = to_device(dbias0);
  gm_attention_bwd_args a{};
  a.dtype = s.dt;
  a.q = s.tq();
  a.k = s.tk();
  a.v = s.tv();
  a.o = o;
  a.d_o = d_o;
  a.lse = lse;
  a.bias_table = s.tbias();
  a.dq = tensor_of(dq.p, s.dt, lg, 4);
  a.dk = tensor_of(dk.p, s.dt, lg, 4);
  a.dv = tensor_of(dv.p, s.dt, lg, 4);
  a.d_bias_table = want_dbias ? make_tensor(dbias.p, {s.R, s.H}, {s.H, 1}) : make_tensor(nullptr, {s.R, s.H}, {s.H, 1});
  a.part = dp.c();
  a.window = s.window;
  a.algo = algo;
  std::size_t ws_bytes = 0;
  GM_CHECK_CUDA(gm_attention_bwd_workspace_size(&a, &ws_bytes));
  dbuf<unsigned char> ws(ws_bytes + 1);
  ws.fill_bytes(0xFF);  // the workspace's content on entry must not matter
  GM_CHECK_CUDA(gm_attention_bwd(&a, ws.p, ws_bytes, nullptr));
  GM_CHECK_CUDA(cudaDeviceSynchronize());
  bwd_out r;
  r.raw_dq = dq.download();
  r.raw_dk = dk.download();
  r.raw_dv = dv.download();
  r.dq = read_output(r.raw_dq, s.dt, lg, allow_nan, "dq");
  r.dk = read_output(r.raw_dk, s.dt, lg, allow_nan, "dk");
  r.dv = read_output(r.raw_dv, s.dt, lg, allow_nan, "dv");
  r.dbias = dbias.download();
  return r;
}

#if GM_HAVE_REFERENCE
struct ref_bwd {
  std::vector<double> dq, dk, dv, dbias;
};

ref_bwd cpu_backward(const attn_setup& s, const std::vector<double>& o, const std::vector<double>& lse,
                     const std::vector<double>& d_o, const std::vector<float>& dbias0) {
  ref_bwd r;
  const std::size_t n = static_cast<std::size_t>(s.B * s.N * s.H * s.D);
  r.dq.assign(n, 0.0);
  r.dk.assign(n, 0.0);
  r.dv.assign(n, 0.0);
  r.dbias.assign(dbias0.begin(), dbias0.end());
  ref::attention_backward_args<double> a;
  a.q = greenmim::make_view<const double>(s.q.data(), s.B, s.N, s.H, s.D);
  a.k = greenmim::make_view<const double>(s.k.data(), s.B, s.N, s.H, s.D);
  a.v = greenmim::make_view<const double>(s.v.data(), s.B, s.N, s.H, s.D);
  a.o = greenmim::make_view<const double>(o.data(), s.B, s.N, s.H, s.D);
  a.dout = greenmim::make_view<const double>(d_o.data(), s.B, s.N, s.H, s.D);
  a.lse = greenmim::make_view<const double>(lse.data(), s.B, s.N, s.H);
  a.part = greenmim::make_partition_view(s.prob->part);
  if (s.with_bias) {
    a.bias = greenmim::make_view<const double>(s.bias.data(), s.R, s.H);
    a.dbias = greenmim::make_view(r.dbias.data(), s.R, s.H);
  }
  a.window = s.window;
  a.dq = greenmim::make_view(r.dq.data(), s.B, s.N, s.H, s.D);
  a.dk = greenmim::make_view(r.dk.data(), s.B, s.N, s.H, s.D);
  a.dv = greenmim::make_view(r.dv.data(), s.B, s.N, s.H, s.D);
  REQUIRE(ref::group_attention_backward(a) == greenmim::status::success);
  return r;
}
#endif

//! The backward's algorithms: the tensor-core one takes fp16/bf16 and G <= 256.
std::vector<gm_algo> bwd_algos_for(gm_dtype dt, index_t G) {
  std::vector<gm_algo> a = {GM_ALGO_AUTO, GM_ALGO_SIMT, GM_ALGO_MMA};
  if (dt == GM_FLOAT32 || G > 256) a.pop_back();
  return a;
}

//! Forward on the device (SIMT), then the backward against the reference fed with the SAME o and
//! lse (so only the backward is measured), dbias accumulated onto random initial values, and
//! bitwise reproducibility over repeated runs. `nan_in_do` puts a NaN into d_o of one token;
//! `nan_in` = 0, 1, 2, 3 puts one into q, k, v or d_o of token `nan_token` (sample B-1, head H-1).
void check_backward(const problem& prob, gm_dtype dt, std::int64_t H, std::int64_t D, bool packed, std::mt19937_64& rng,
                    bool nan_in_do = false, int nan_in = -1, index_t nan_token = 0, bool with_bias = true) {
#if GM_HAVE_REFERENCE
  INFO(prob.name << " dtype " << gm_dtype_name(dt) << " H " << H << " D " << D << (packed ? " packed qkv" : "")
                 << (nan_in_do ? " NaN in d_o" : "") << (nan_in >= 0 ? " NaN in " : "")
                 << (nan_in >= 0 ? std::string(1, "qkvd"[nan_in]) : std::string()) << (with_bias ? "" : " no bias"));
  device_partition dp(prob.part);
  attn_setup s = make_setup(prob, dt, H, D, packed, with_bias, rng);
  if (nan_in >= 0 && nan_in < 3) {
    // packed: q, k, v share hq's storage (make_setup leaves hk, hv empty)
    htensor& hs = packed || nan_in == 0 ? s.hq : nan_in == 1 ? s.hk : s.hv;
    std::vector<double>& vals = nan_in == 0 ? s.q : nan_in == 1 ? s.k : s.v;
    write_value(hs, nan_in == 0 ? s.lq : nan_in == 1 ? s.lk : s.lv, s.B - 1, nan_token, H - 1, 1, NAN, vals);
    s.upload();
  }
  const bool allow_nan = nan_in_do || nan_in >= 0;  // outputs may hold NaN (their pattern is compared)
  // forward into contiguous o / lse
  const layout lo = contiguous(s.B, s.N, H, D);
  const layout ll = contiguous(s.B, s.N, H, 1);
  dbuf<unsigned char> o(static_cast<std::size_t>(lo.storage) * gm_dtype_size(dt));
  dbuf<float> lse(static_cast<std::size_t>(ll.storage));
  gm_attention_fwd_args f{};
  f.dtype = dt;
  f.q = s.tq();
  f.k = s.tk();
  f.v = s.tv();
  f.o = tensor_of(o.p, dt, lo, 4);
  f.lse = tensor_of(lse.p, GM_FLOAT32, ll, 3);
  f.bias_table = s.tbias();
  f.part = dp.c();
  f.window = s.window;
  GM_CHECK_CUDA(gm_attention_fwd(&f, nullptr));
  GM_CHECK_CUDA(cudaDeviceSynchronize());
  htensor ho(dt, static_cast<std::size_t>(lo.storage));
  ho.bytes = o.download();
  std::vector<double> o_vals(static_cast<std::size_t>(lo.count())), lse_vals;
  for (std::size_t i = 0; i < o_vals.size(); ++i) o_vals[i] = ho.get(i);
  for (float x : lse.download()) lse_vals.push_back(x);
  // incoming gradient
  htensor hdo(dt, static_cast<std::size_t>(lo.storage));
  std::vector<double> do_vals = fill_random(hdo, lo, rng, 1.0);
  if (nan_in == 3) write_value(hdo, lo, s.B - 1, nan_token, H - 1, 1, NAN, do_vals);
  else if (nan_in_do && nan_in < 0) write_value(hdo, lo, s.B - 1, s.N / 2, H - 1, 1, NAN, do_vals);
  dbuf<unsigned char> d_o = to_device(hdo);
  std::vector<float> dbias0(static_cast<std::size_t>(s.R * H));
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& x : dbias0) x = nd(rng);

  const ref_bwd want = cpu_backward(s, o_vals, lse_vals, do_vals, dbias0);
  const gm_tensor to = tensor_of(o.p, dt, lo, 4), tl = tensor_of(lse.p, GM_FLOAT32, ll, 3),
                  tdo = tensor_of(d_o.p, dt, lo, 4);
  std::vector<unsigned char> auto_dq;  // AUTO's dq, to check which kernel it picked
  for (gm_algo algo : bwd_algos_for(dt, prob.part.group_size)) {
    INFO("backward algo " << std::string(algo_name(algo)));
    const bwd_out got = gpu_backward(s, dp, to, tl, tdo, dbias0, with_bias, allow_nan, algo);
    if (algo == GM_ALGO_AUTO) auto_dq = got.raw_dq;
    if (algo == GM_ALGO_MMA) CHECK(got.raw_dq == auto_dq);  // AUTO runs the tensor-core kernels
    if (algo == GM_ALGO_SIMT && (dt == GM_FLOAT32 || prob.part.group_size > 256)) CHECK(got.raw_dq == auto_dq);
    const double tol = tolerance(dt);
    compare(got.dq, want.dq, tol, "dq");
    compare(got.dk, want.dk, tol, "dk");
    compare(got.dv, want.dv, tol, "dv");
    std::vector<double> db(got.dbias.begin(), got.dbias.end());
    compare(db, want.dbias, tol, "dbias");
    // determinism: bitwise identical over repeated runs (fresh poisoned workspace each time)
    for (int rep = 0; rep < 2; ++rep) {
      const bwd_out again = gpu_backward(s, dp, to, tl, tdo, dbias0, with_bias, allow_nan, algo);
      CHECK(std::memcmp(again.dbias.data(), got.dbias.data(), got.dbias.size() * sizeof(float)) == 0);
      CHECK(again.raw_dq == got.raw_dq);
      CHECK(again.raw_dk == got.raw_dk);
      CHECK(again.raw_dv == got.raw_dv);
    }
    // without a dbias request the table is left alone and the gradients are the same
    const bwd_out nodb = gpu_backward(s, dp, to, tl, tdo, dbias0, false, allow_nan, algo);
    CHECK(std::memcmp(nodb.dbias.data(), dbias0.data(), dbias0.size() * sizeof(float)) == 0);
    CHECK(nodb.raw_dq == got.raw_dq);
    CHECK(nodb.raw_dk == got.raw_dk);
    CHECK(nodb.raw_dv == got.raw_dv);
  }
#else
  (void)prob; (void)dt; (void)H; (void)D; (void)packed; (void)rng; (void)nan_in_do; (void)nan_in; (void)nan_token;
  (void)with_bias;
#endif
}

}  // namespace

TEST_CASE("gpu attention backward: dq, dk, dv, deterministic dbias, every dtype and head_dim") {
  GM_SKIP_WITHOUT_DEVICE();
  GM_SKIP_WITHOUT_REFERENCE();
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const problem stage2 = shared_mask_problem(rng, 28, 7, 3, 2);
  for (gm_dtype dt : {GM_FLOAT32, GM_FLOAT16, GM_BFLOAT16})
    for (std::int64_t D : {32, 64}) check_backward(stage2, dt, 2, D, D == 32, rng);
}

TEST_CASE("gpu attention backward: per-sample layout, large and interleaved groups, NaN in d_o") {
  GM_SKIP_WITHOUT_DEVICE();
  GM_SKIP_WITHOUT_REFERENCE();
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const problem per_sample = per_sample_problem(rng, 14, 7, 3, 4, 0.5);
  const problem big_window = shared_mask_problem(rng, 28, 14, 7, 2, greenmim::strategy::single);
  const problem masking = single_group_problem(rng, 28, 7, 0, 2);
  const problem stage1 = shared_mask_problem(rng, 56, 7, 3, 1);
  // one group per window, 6 samples: more than 128 per-CTA d(bias) partials, so every slice of
  // dbias_reduce runs its 4-way unrolled loop, not only the tail
  const problem many_ctas = shared_mask_problem(rng, 56, 7, 0, 6, greenmim::strategy::per_window);
  REQUIRE(many_ctas.batch * many_ctas.part.num_groups > 128);
  for (gm_dtype dt : {GM_FLOAT32, GM_BFLOAT16}) {
    check_backward(per_sample, dt, 2, 32, false, rng);
    check_backward(big_window, dt, 2, 32, true, rng);
    check_backward(masking, dt, 1, 64, false, rng);
  }
  check_backward(stage1, GM_FLOAT32, 2, 32, false, rng, true);
  check_backward(many_ctas, GM_FLOAT32, 1, 32, false, rng);
}

TEST_CASE("gpu attention backward: NaN in q, k, v or d_o stays in its window (tensor-core exact fallback too)") {
  GM_SKIP_WITHOUT_DEVICE();
  GM_SKIP_WITHOUT_REFERENCE();
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  // groups of 49 slots holding several (shifted) windows, so that isolation inside a group counts
  const problem prob = shared_mask_problem(rng, 28, 7, 3, 2, greenmim::strategy::fast, 49);
  // and windows of 14 (G > 64: the tiled tensor-core kernels)
  const problem big = shared_mask_problem(rng, 28, 14, 7, 2, greenmim::strategy::single);
  auto victim_of = [](const problem& pr) {  // a token whose group holds at least two windows
    const index_t G = pr.part.group_size;
    for (index_t g = 0; g < pr.part.num_groups; ++g) {
      const std::size_t at = static_cast<std::size_t>(g) * G;
      bool several = false;
      for (index_t i = 0; i < G; ++i) {
        const index_t w = pr.part.slot_window[at + i];
        several = several || (w >= 0 && w != pr.part.slot_window[at]);
      }
      if (several) return pr.part.gather[at];
    }
    return index_t{-1};
  };
  const index_t victim = victim_of(prob), big_victim = victim_of(big);
  REQUIRE(victim >= 0);
  REQUIRE(big_victim >= 0);
  for (gm_dtype dt : {GM_BFLOAT16, GM_FLOAT16})
    for (int which : {0, 1, 2, 3}) check_backward(prob, dt, 2, which % 2 ? 64 : 32, which == 2, rng, false, which, victim);
  for (int which : {0, 1, 3}) check_backward(big, GM_BFLOAT16, 1, 32, false, rng, false, which, big_victim);
}

TEST_CASE("gpu attention backward: tensor-core shapes (G not a multiple of 16, 1-3 heads, shifts, packed qkv)") {
  GM_SKIP_WITHOUT_DEVICE();
  GM_SKIP_WITHOUT_REFERENCE();
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const problem stage2_shift = shared_mask_problem(rng, 28, 7, 3, 2);
  const problem stage3_shift = shared_mask_problem(rng, 14, 7, 3, 3);
  const problem per_window = shared_mask_problem(rng, 28, 7, 0, 1, greenmim::strategy::per_window);
  const problem per_sample = per_sample_problem(rng, 14, 7, 3, 3, 0.3);
  // one 28 x 28 window, ~31 tokens: a 55^2-row table, whose per-warp d(bias) rows outgrow the
  // operand tiles they are laid over
  const problem big_table = per_sample_problem(rng, 28, 28, 0, 1, 0.04);
  check_backward(stage2_shift, GM_BFLOAT16, 3, 64, true, rng);
  check_backward(big_table, GM_BFLOAT16, 2, 32, false, rng);
  // no bias table (and so no d(bias)): one pass and tiled
  const problem big_window = shared_mask_problem(rng, 28, 14, 7, 1, greenmim::strategy::single);
  check_backward(stage2_shift, GM_FLOAT16, 2, 32, false, rng, false, -1, 0, false);
  check_backward(big_window, GM_BFLOAT16, 1, 64, true, rng, false, -1, 0, false);
  check_backward(stage3_shift, GM_FLOAT16, 1, 32, false, rng);
  check_backward(per_window, GM_FLOAT16, 2, 64, true, rng);
  check_backward(per_sample, GM_BFLOAT16, 3, 32, false, rng);
}

// Small and quick: the subset run under compute-sanitizer (memcheck, racecheck, synccheck,
// initcheck) by bench/gpu/run.sh. Covers the SIMT and MMA forwards (one pass with the non-finite
// fallback, and tiled for G > 64), the SIMT and tensor-core backwards (one pass, and tiled for G > 64) with dbias,
// partition/unpartition is covered by its own small cases.
TEST_CASE("gpu attention smoke: small problem, every path") {
  GM_SKIP_WITHOUT_DEVICE();
  GM_SKIP_WITHOUT_REFERENCE();
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const problem small = shared_mask_problem(rng, 14, 7, 3, 1, greenmim::strategy::fast, 49);
  const problem big = shared_mask_problem(rng, 28, 14, 7, 1, greenmim::strategy::single);
  check_forward(small, GM_BFLOAT16, 1, 32, true, true, rng);
  check_forward(small, GM_FLOAT16, 1, 64, false, true, rng);
  check_forward(big, GM_FLOAT32, 1, 32, false, true, rng);
  check_forward(big, GM_BFLOAT16, 1, 64, false, true, rng);  // tensor-core query tiles (G > 64)
  check_backward(small, GM_BFLOAT16, 1, 64, false, rng);
  check_backward(big, GM_FLOAT32, 1, 32, true, rng);
  check_backward(big, GM_BFLOAT16, 1, 32, false, rng);
}
