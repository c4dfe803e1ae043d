//! \file test_kernels_emu.cpp
//! greenmim's kernels on the CPU emulator, beyond what the GPU test sources (also built into
//! this binary) check: every kernel must give bitwise-identical results whatever order the
//! threads of a CTA run in between barriers (forward, reverse, random). A missing __syncthreads
//! or __syncwarp, or two threads writing one shared word between barriers, makes the output
//! depend on that order; on a GPU such races show up rarely, here they fail deterministically.
#include <doctest/doctest.h>

#include "cuda_emu.hpp"
#include "gpu/gpu_test_util.hpp"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace gm_test;

struct outputs {
  std::vector<unsigned char> o, lse, dq, dk, dv, part, unpart;
  std::vector<float> dbias;
};

gm_tensor t4(void* p, std::int64_t B, std::int64_t N, std::int64_t H, std::int64_t D) {
  return make_tensor(p, {B, N, H, D}, {N * H * D, H * D, D, 1});
}

//! Forward, backward (with d(bias)) and partition/unpartition of one random problem; inputs are
//! a function of `seed` only, so two calls differ only by the emulator's schedule. `algo` picks
//! the forward and the backward; `nan` puts a NaN into one k, one v and one d_o element (the
//! tensor-core forward's and backward's exact fallbacks then run in the CTAs that hold them).
outputs run_all(const problem& prob, gm_dtype dt, std::int64_t H, std::int64_t D, gm_algo algo, std::uint64_t seed,
                bool nan = false) {
  std::mt19937_64 rng(seed);
  const std::int64_t B = prob.batch, N = prob.part.num_tokens;
  const std::int64_t R = (2 * prob.geom.window - 1) * (2 * prob.geom.window - 1);
  const std::size_t n = static_cast<std::size_t>(B * N * H * D);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto random_tensor = [&](std::size_t count) {
    htensor h(dt, count);
    for (std::size_t i = 0; i < count; ++i) h.set(i, nd(rng));
    return h;
  };
  htensor hq = random_tensor(n), hk = random_tensor(n), hv = random_tensor(n), hdo = random_tensor(n);
  if (nan) {
    hk.set(n / 2, NAN);
    hv.set(n / 5 + 3, NAN);
    hdo.set(n / 3 + 5, NAN);
  }
  std::vector<float> bias(static_cast<std::size_t>(R * H)), dbias0(bias.size());
  for (auto& x : bias) x = 0.5f * nd(rng);
  for (auto& x : dbias0) x = nd(rng);
  dbuf<unsigned char> q = to_device(hq), k = to_device(hk), v = to_device(hv), d_o = to_device(hdo);
  dbuf<float> table = to_device(bias), dtable = to_device(dbias0);
  const std::size_t bytes = n * gm_dtype_size(dt);
  dbuf<unsigned char> o(bytes), dq(bytes), dk(bytes), dv(bytes);
  dbuf<float> lse(static_cast<std::size_t>(B * N * H));
  device_partition dp(prob.part);

  gm_attention_fwd_args f{};
  f.dtype = dt;
  f.q = t4(q.p, B, N, H, D);
  f.k = t4(k.p, B, N, H, D);
  f.v = t4(v.p, B, N, H, D);
  f.o = t4(o.p, B, N, H, D);
  f.lse = make_tensor(lse.p, {B, N, H}, {N * H, H, 1});
  f.bias_table = make_tensor(table.p, {R, H}, {H, 1});
  f.part = dp.c();
  f.window = prob.geom.window;
  f.algo = algo;
  GM_CHECK_CUDA(gm_attention_fwd(&f, nullptr));

  gm_attention_bwd_args b{};
  b.dtype = dt;
  b.q = f.q;
  b.k = f.k;
  b.v = f.v;
  b.o = f.o;
  b.d_o = t4(d_o.p, B, N, H, D);
  b.lse = f.lse;
  b.bias_table = f.bias_table;
  b.dq = t4(dq.p, B, N, H, D);
  b.dk = t4(dk.p, B, N, H, D);
  b.dv = t4(dv.p, B, N, H, D);
  b.d_bias_table = make_tensor(dtable.p, {R, H}, {H, 1});
  b.part = f.part;
  b.window = f.window;
  b.algo = algo;
  std::size_t ws_bytes = 0;
  GM_CHECK_CUDA(gm_attention_bwd_workspace_size(&b, &ws_bytes));
  dbuf<unsigned char> ws(ws_bytes + 1);
  GM_CHECK_CUDA(gm_attention_bwd(&b, ws.p, ws_bytes, nullptr));

  // partition q's [B, N, H*D] rows into [B, slots, H*D] and back
  const std::int64_t C = H * D, slots = static_cast<std::int64_t>(prob.part.group_size) * prob.part.num_groups;
  dbuf<unsigned char> grouped(static_cast<std::size_t>(B * slots * C) * gm_dtype_size(dt)), back(bytes);
  gm_partition_args pa{};
  pa.dtype = dt;
  pa.x = make_tensor(q.p, {B, N, C}, {N * C, C, 1});
  pa.y = make_tensor(grouped.p, {B, slots, C}, {slots * C, C, 1});
  pa.part = f.part;
  GM_CHECK_CUDA(gm_partition_tokens(&pa, nullptr));
  pa.x = make_tensor(back.p, {B, N, C}, {N * C, C, 1});
  GM_CHECK_CUDA(gm_unpartition_tokens(&pa, nullptr));
  GM_CHECK_CUDA(cudaDeviceSynchronize());

  outputs r;
  r.o = o.download();
  r.dq = dq.download();
  r.dk = dk.download();
  r.dv = dv.download();
  r.part = grouped.download();
  r.unpart = back.download();
  r.dbias = dtable.download();
  const std::vector<float> l = lse.download();
  r.lse.resize(l.size() * 4);
  std::memcpy(r.lse.data(), l.data(), r.lse.size());
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct schedule_guard {
  ~schedule_guard() { gm_emu::set_schedule(gm_emu::schedule::forward); }
};

}  // namespace

TEST_CASE("emulated kernels: bitwise identical under every thread schedule (no races between barriers)") {
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  schedule_guard restore;
  struct config {
    problem prob;
    gm_dtype dt;
    std::int64_t H, D;
    gm_algo algo;
    bool nan = false;
  };
  std::vector<config> configs;
  // G <= 64: the tensor-core forward and backward (AUTO, MMA) and the SIMT ones; windows of 14
  // (G up to 196, several query tiles); one group of every token (masking mode); per-sample flat
  // layout.
  // (the planner may pick G > 64 for some masks: `fast, 0, 64` redoes those plans at G = 64)
  const auto fast = greenmim::strategy::fast;
  configs.push_back({shared_mask_problem(rng, 28, 7, 3, 2, fast, 0, 64), GM_BFLOAT16, 2, 32, GM_ALGO_AUTO});
  configs.push_back({shared_mask_problem(rng, 28, 7, 0, 1, fast, 0, 64), GM_FLOAT16, 1, 64, GM_ALGO_MMA});
  configs.push_back({shared_mask_problem(rng, 28, 7, 3, 1), GM_FLOAT32, 2, 64, GM_ALGO_SIMT});
  configs.push_back({shared_mask_problem(rng, 28, 14, 7, 1, greenmim::strategy::single), GM_BFLOAT16, 1, 32, GM_ALGO_SIMT});
  configs.push_back({single_group_problem(rng, 14, 7, 0, 1), GM_FLOAT32, 1, 32, GM_ALGO_SIMT});
  configs.push_back({per_sample_problem(rng, 14, 7, 3, 3, 0.5, fast, 64), GM_BFLOAT16, 2, 64, GM_ALGO_AUTO});
  // the tensor-core backward's exact fallback (non-finite k / d_o in some CTAs); the SIMT
  // backward on 16-bit data
  configs.push_back({shared_mask_problem(rng, 28, 7, 3, 1, fast, 0, 64), GM_BFLOAT16, 2, 32, GM_ALGO_MMA, true});
  configs.push_back({shared_mask_problem(rng, 28, 7, 3, 1), GM_FLOAT16, 1, 32, GM_ALGO_SIMT});
  // 64 < G <= 256: the tiled tensor-core forward and backward (AUTO takes them), also their
  // exact fallbacks (non-finite v / k / d_o); Swin V2's window 16 (per-sample, shifted) on MMA
  configs.push_back({shared_mask_problem(rng, 28, 14, 7, 1, greenmim::strategy::single), GM_BFLOAT16, 1, 64, GM_ALGO_AUTO});
  configs.push_back({shared_mask_problem(rng, 28, 14, 7, 1, greenmim::strategy::single), GM_FLOAT16, 2, 32, GM_ALGO_AUTO, true});
  configs.push_back({per_sample_problem(rng, 32, 16, 8, 1, 0.5, fast, 256), GM_BFLOAT16, 1, 32, GM_ALGO_MMA});
  for (const config& c : configs) {
    INFO(c.prob.name << " dtype " << gm_dtype_name(c.dt) << " H " << c.H << " D " << c.D << " algo " << static_cast<int>(c.algo));
    const std::uint64_t inputs = rng();
    gm_emu::set_schedule(gm_emu::schedule::forward);
    const std::uint64_t before = gm_emu::blocks_run();
    const outputs want = run_all(c.prob, c.dt, c.H, c.D, c.algo, inputs, c.nan);
    CHECK(gm_emu::blocks_run() > before);
    const std::vector<std::pair<gm_emu::schedule, std::uint64_t>> others = {
        {gm_emu::schedule::reverse, 0}, {gm_emu::schedule::random, rng()}, {gm_emu::schedule::random, rng()}};
    for (const auto& s : others) {
      INFO("schedule " << static_cast<int>(s.first) << " seed " << s.second);
      gm_emu::set_schedule(s.first, s.second);
      const outputs got = run_all(c.prob, c.dt, c.H, c.D, c.algo, inputs, c.nan);
      CHECK(got.o == want.o);
      CHECK(got.lse == want.lse);
      CHECK(got.dq == want.dq);
      CHECK(got.dk == want.dk);
      CHECK(got.dv == want.dv);
      CHECK(same_bits(got.dbias, want.dbias));
      CHECK(got.part == want.part);
      CHECK(got.unpart == want.unpart);
    }
  }
}
