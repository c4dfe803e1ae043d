// The tensor-core forward with several heads per CTA (attention_fwd_mma_heads) against the
// one-head kernel (attention_fwd_mma, itself checked against the CPU reference by
// test_attention_gpu.cpp): the same arithmetic in the same order, so o and lse must be bitwise
// identical, poisoned margins and NaN isolation included. The launcher's automatic choice of heads
// per CTA is host arithmetic (kernels/detail/fwd_tuning.hpp), tested here without a device.
// Also built into greenmim_emu_tests (test/emu/test_fwd_heads_emu.cpp includes this file).
#include "gpu_test_util.hpp"

#include <cstdint>
#include <cstring>
#include <vector>

#include "../../kernels/detail/fwd_tuning.hpp"

namespace {

using namespace gm_test;
using greenmim::index_t;

struct fwd_bytes {
  std::vector<unsigned char> o, lse;
};

//! One forward with `hpc` heads per CTA into outputs poisoned with 0xFF (o has 8 extra columns
//! per row and lse 3 extra heads of margin, so a stray write shows up as a difference too).
fwd_bytes run_forward(const problem& prob, const device_partition& dp, gm_dtype dt, std::int64_t H, bool with_bias,
                      bool with_lse, const dbuf<unsigned char>& q, const dbuf<unsigned char>& k,
                      const dbuf<unsigned char>& v, const dbuf<float>& table, int hpc) {
  const std::int64_t B = prob.batch, N = prob.part.num_tokens, D = 32;
  const index_t p = prob.geom.window;
  const std::int64_t R = (2 * p - 1) * (2 * p - 1);
  const std::int64_t orow = D + 8;
  const std::size_t es = gm_dtype_size(dt);
  dbuf<unsigned char> o(static_cast<std::size_t>(B * N * H * orow) * es), lse(static_cast<std::size_t>(B * N * (H + 3)) * 4);
  o.fill_bytes(0xFF);
  lse.fill_bytes(0xFF);
  gm_attention_fwd_args a{};
  a.dtype = dt;
  a.q = make_tensor(q.p, {B, N, H, D}, {N * H * D, H * D, D, 1});
  a.k = make_tensor(k.p, {B, N, H, D}, {N * H * D, H * D, D, 1});
  a.v = make_tensor(v.p, {B, N, H, D}, {N * H * D, H * D, D, 1});
  a.o = make_tensor(o.p, {B, N, H, D}, {N * H * orow, H * orow, orow, 1});
  a.lse = with_lse ? make_tensor(lse.p, {B, N, H}, {N * (H + 3), H + 3, 1}) : make_tensor(nullptr, {B, N, H}, {0, 0, 0});
  a.bias_table = make_tensor(with_bias ? table.p : nullptr, {R, H}, {H, 1});
  a.part = dp.c();
  a.window = p;
  a.scale = 0.f;
  a.algo = GM_ALGO_MMA;
  greenmim::detail::cuda::fwd_tuning tuning;  // gm_attention_fwd with the heads per CTA forced
  tuning.heads_per_cta = hpc;
  GM_CHECK_CUDA(greenmim::detail::cuda::attention_fwd(&a, tuning, nullptr));
  GM_CHECK_CUDA(cudaDeviceSynchronize());
  return {o.download(), lse.download()};
}

//! `nan_v` / `nan_q`: one token's v (q) of head 1 gets a NaN (the exact path for the CTAs that
//! load it; NaN confined to its window).
void check_heads(const problem& prob, gm_dtype dt, std::int64_t H, bool with_bias, bool with_lse, bool nan_v,
                 bool nan_q, std::mt19937_64& rng) {
  INFO(prob.name << " dtype " << gm_dtype_name(dt) << " H " << H << (with_bias ? "" : " no bias")
                 << (with_lse ? "" : " no lse") << (nan_v ? " NaN in v" : "") << (nan_q ? " NaN in q" : ""));
  REQUIRE(prob.part.group_size <= 64);
  const std::int64_t B = prob.batch, N = prob.part.num_tokens, D = 32;
  const index_t p = prob.geom.window;
  const std::int64_t R = (2 * p - 1) * (2 * p - 1);
  std::normal_distribution<float> nd(0.f, 1.f);
  htensor hq(dt, static_cast<std::size_t>(B * N * H * D)), hk = hq, hv = hq;
  for (std::size_t i = 0; i < hq.size(); ++i) {
    hq.set(i, nd(rng));
    hk.set(i, nd(rng));
    hv.set(i, nd(rng));
  }
  const std::size_t t_nan = static_cast<std::size_t>(N / 2);
  if (nan_v) hv.set((t_nan * H + 1) * D + 3, NAN);
  if (nan_q) hq.set((t_nan * H + 1) * D + 5, NAN);
  std::vector<float> bias(static_cast<std::size_t>(R * H));
  for (auto& x : bias) x = 0.5f * nd(rng);
  dbuf<unsigned char> q = to_device(hq), k = to_device(hk), v = to_device(hv);
  dbuf<float> table = to_device(bias);
  device_partition dp(prob.part);
  const fwd_bytes one = run_forward(prob, dp, dt, H, with_bias, with_lse, q, k, v, table, 1);
  // the one-head reference wrote every real element (padding and margins stay poison)
  std::int64_t written = 0;
  for (std::size_t i = 0; i + 1 < one.o.size(); i += 2) written += !(one.o[i] == 0xFF && one.o[i + 1] == 0xFF);
  CHECK(written > 0);
  for (int hpc : {2, 3, 4, static_cast<int>(H)}) {
    if (hpc > H) continue;
    INFO("heads per CTA " << hpc);
    const fwd_bytes several = run_forward(prob, dp, dt, H, with_bias, with_lse, q, k, v, table, hpc);
    CHECK(std::memcmp(several.o.data(), one.o.data(), one.o.size()) == 0);
    CHECK(std::memcmp(several.lse.data(), one.lse.data(), one.lse.size()) == 0);
  }
}

}  // namespace

TEST_CASE("gpu attention forward: several heads per CTA give the one-head kernel's bits") {
  GM_SKIP_WITHOUT_DEVICE();
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  // the several-heads kernel is the one-pass tensor-core forward's (G <= 64); the planner may pick
  // G = 65 or more for some masks, so these plans are made with max_group_size 64
  const auto fast = greenmim::strategy::fast;
  const problem stage1 = shared_mask_problem(rng, 56, 7, 0, 2, fast, 0, 64);  // G >= 49
  const problem shifted = shared_mask_problem(rng, 28, 7, 3, 2, fast, 0, 64);
  const problem flat = per_sample_problem(rng, 28, 7, 0, 3, 0.3, fast, 64);  // per-sample layout, B = 1
  for (gm_dtype dt : {GM_BFLOAT16, GM_FLOAT16}) {
    check_heads(stage1, dt, 4, true, true, false, false, rng);
    check_heads(shifted, dt, 6, true, true, false, false, rng);  // last CTA of 4 heads has 2
  }
  check_heads(stage1, GM_BFLOAT16, 3, false, true, false, false, rng);  // no bias table
  check_heads(shifted, GM_BFLOAT16, 2, true, false, false, false, rng);  // no lse
  check_heads(flat, GM_BFLOAT16, 4, true, true, false, false, rng);
  check_heads(stage1, GM_BFLOAT16, 4, true, true, true, false, rng);    // NaN in v: exact path, head 1
  check_heads(shifted, GM_FLOAT16, 4, true, true, false, true, rng);    // NaN in q
}
