//! \file test_geometries_emu.cpp
//! The CUDA attention (through its C ABI, on the emulator) on the geometries beyond 224 px /
//! window 7: SimMIM's 192 px / window 6 (windows straddle mask units), Swin V2's 256 px / window 8
//! and 16 (the issue: "window 16 must run"), 192 px / window 12, shifted and not, forward and
//! backward against the CPU reference; and a window the kernels refuse (48 > GM_MAX_WINDOW),
//! with the reason models.hpp's cuda_attention_refusal gives on the host.
#include <doctest/doctest.h>

#include "cuda_emu.hpp"
#include "gpu/gpu_test_util.hpp"

#include <greenmim/kernel_limits.hpp>
#include <greenmim/models.hpp>
#include <greenmim/reference/attention.hpp>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

using gm_test::dbuf;
using gm_test::make_tensor;
using greenmim::index_t;
namespace ref = greenmim::reference;

//! Values stored as `dt` on the device; `rounded` receives what the device holds, in double.
dbuf<unsigned char> upload_as(gm_dtype dt, const std::vector<float>& v, std::vector<double>& rounded) {
  rounded.resize(v.size());
  std::vector<unsigned char> bytes(v.size() * gm_dtype_size(dt));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (dt == GM_FLOAT32) {
      std::memcpy(&bytes[4 * i], &v[i], 4);
      rounded[i] = v[i];
    } else {
      const std::uint16_t h = dt == GM_FLOAT16 ? gm_test::f32_to_f16(v[i]) : gm_test::f32_to_bf16(v[i]);
      std::memcpy(&bytes[2 * i], &h, 2);
      rounded[i] = dt == GM_FLOAT16 ? gm_test::f16_to_f32(h) : gm_test::bf16_to_f32(h);
    }
  }
  return gm_test::to_device(bytes);
}

std::vector<double> download_as(gm_dtype dt, const dbuf<unsigned char>& d) {
  const std::vector<unsigned char> bytes = d.download();
  const std::size_t n = bytes.size() / gm_dtype_size(dt);
  std::vector<double> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (dt == GM_FLOAT32) {
      float f;
      std::memcpy(&f, &bytes[4 * i], 4);
      out[i] = f;
    } else {
      std::uint16_t h;
      std::memcpy(&h, &bytes[2 * i], 2);
      out[i] = dt == GM_FLOAT16 ? gm_test::f16_to_f32(h) : gm_test::bf16_to_f32(h);
    }
  }
  return out;
}

std::vector<float> random_floats(std::size_t n, float amp, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-amp, amp);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

//! Stage `s` (0-based) of `m`, one random mask: forward and backward on the device vs the CPU
//! reference (double, on the values the device holds).
void check_stage(const greenmim::model_shape& m, int s, bool shifted, gm_dtype dt, std::mt19937_64& rng) {
  const greenmim::mask_config cfg = greenmim::make_mask_config(m);
  const std::vector<std::uint8_t> units = greenmim::random_mask(cfg, rng(), 0);
  std::vector<index_t> coords;
  REQUIRE(greenmim::visible_coords(greenmim::span<const std::uint8_t>(units), cfg.grid(), m.grid(s), coords) ==
          greenmim::status::success);
  const greenmim::window_geometry g = m.geometry(s, shifted);
  greenmim::window_list wl;
  REQUIRE(greenmim::build_windows(g, greenmim::span<const index_t>(coords), wl) == greenmim::status::success);
  const std::vector<index_t> sizes = wl.sizes();
  greenmim::plan pl;
  REQUIRE(greenmim::make_plan(greenmim::span<const index_t>(sizes), greenmim::planner_options{}, m.channels[s], pl) ==
          greenmim::status::success);
  greenmim::partition_indices part;
  REQUIRE(greenmim::build_partition(pl, wl, part) == greenmim::status::success);
  const std::int64_t B = 1, N = static_cast<std::int64_t>(coords.size()), H = 2, D = 32, p = g.window,
                     R = (2 * p - 1) * (2 * p - 1), n = B * N * H * D;
  INFO(m.name << " stage " << s + 1 << (shifted ? " shifted" : "") << ": window " << p << ", G " << part.group_size
               << ", " << part.num_groups << " groups, dtype " << gm_dtype_size(dt) << " bytes");
  CHECK(greenmim::cuda_attention_refusal(g.window, part.group_size, static_cast<index_t>(D)).empty());
  gm_test::device_partition dp(part);

  std::vector<double> q, k, v, dout;
  dbuf<unsigned char> d_q = upload_as(dt, random_floats(n, 1, rng), q), d_k = upload_as(dt, random_floats(n, 1, rng), k),
                      d_v = upload_as(dt, random_floats(n, 1, rng), v),
                      d_do = upload_as(dt, random_floats(n, 1, rng), dout);
  const std::vector<float> bias_f = random_floats(static_cast<std::size_t>(R * H), 0.5f, rng);
  const std::vector<double> bias(bias_f.begin(), bias_f.end());
  dbuf<float> d_bias = gm_test::to_device(bias_f), d_dbias(static_cast<std::size_t>(R * H));
  d_dbias.fill_bytes(0);
  dbuf<unsigned char> d_o(static_cast<std::size_t>(n) * gm_dtype_size(dt)), d_dq(d_o.n), d_dk(d_o.n), d_dv(d_o.n);
  dbuf<float> d_lse(static_cast<std::size_t>(B * N * H));
  auto t4 = [&](void* data) { return make_tensor(data, {B, N, H, D}, {N * H * D, H * D, D, 1}); };

  gm_attention_fwd_args fa{};
  fa.dtype = dt;
  fa.q = t4(d_q.p);
  fa.k = t4(d_k.p);
  fa.v = t4(d_v.p);
  fa.o = t4(d_o.p);
  fa.lse = make_tensor(d_lse.p, {B, N, H}, {N * H, H, 1});
  fa.bias_table = make_tensor(d_bias.p, {R, H}, {H, 1});
  fa.part = dp.c();
  fa.window = static_cast<std::int32_t>(p);
  fa.algo = GM_ALGO_AUTO;
  GM_CHECK_CUDA(gm_attention_fwd(&fa, nullptr));
  gm_attention_bwd_args ba{};
  ba.dtype = dt;
  ba.q = fa.q;
  ba.k = fa.k;
  ba.v = fa.v;
  ba.o = fa.o;
  ba.d_o = t4(d_do.p);
  ba.lse = fa.lse;
  ba.bias_table = fa.bias_table;
  ba.dq = t4(d_dq.p);
  ba.dk = t4(d_dk.p);
  ba.dv = t4(d_dv.p);
  ba.d_bias_table = make_tensor(d_dbias.p, {R, H}, {H, 1});
  ba.part = fa.part;
  ba.window = fa.window;
  ba.algo = GM_ALGO_AUTO;
  std::size_t ws = 0;
  GM_CHECK_CUDA(gm_attention_bwd_workspace_size(&ba, &ws));
  dbuf<unsigned char> d_ws(ws);
  GM_CHECK_CUDA(gm_attention_bwd(&ba, d_ws.p, ws, nullptr));
  GM_CHECK_CUDA(cudaDeviceSynchronize());

  // the reference on the same (rounded) values
  std::vector<double> o(static_cast<std::size_t>(n)), lse(static_cast<std::size_t>(B * N * H)), dq(o.size()),
      dk(o.size()), dv(o.size()), dbias(bias.size(), 0.0);
  ref::attention_args<double> a;
  a.q = greenmim::make_view<const double>(q.data(), B, N, H, D);
  a.k = greenmim::make_view<const double>(k.data(), B, N, H, D);
  a.v = greenmim::make_view<const double>(v.data(), B, N, H, D);
  a.part = greenmim::make_partition_view(part);
  a.bias = greenmim::make_view<const double>(bias.data(), R, H);
  a.window = static_cast<index_t>(p);
  a.out = greenmim::make_view(o.data(), B, N, H, D);
  a.lse = greenmim::make_view(lse.data(), B, N, H);
  REQUIRE(ref::group_attention_forward(a) == greenmim::status::success);
  ref::attention_backward_args<double> gb;
  gb.q = a.q;
  gb.k = a.k;
  gb.v = a.v;
  gb.o = greenmim::make_view<const double>(o.data(), B, N, H, D);
  gb.dout = greenmim::make_view<const double>(dout.data(), B, N, H, D);
  gb.lse = greenmim::make_view<const double>(lse.data(), B, N, H);
  gb.part = a.part;
  gb.bias = a.bias;
  gb.window = a.window;
  gb.dq = greenmim::make_view(dq.data(), B, N, H, D);
  gb.dk = greenmim::make_view(dk.data(), B, N, H, D);
  gb.dv = greenmim::make_view(dv.data(), B, N, H, D);
  gb.dbias = greenmim::make_view(dbias.data(), R, H);
  REQUIRE(ref::group_attention_backward(gb) == greenmim::status::success);

  const double tol = gm_test::tolerance(dt), btol = dt == GM_FLOAT32 ? 1e-4 : 3e-2;
  const std::vector<float> lse_f = d_lse.download(), dbias_f = d_dbias.download();
  CHECK(gm_test::rel_error(download_as(dt, d_o), o) <= tol);
  CHECK(gm_test::rel_error(std::vector<double>(lse_f.begin(), lse_f.end()), lse) <= 1e-3);
  CHECK(gm_test::rel_error(download_as(dt, d_dq), dq) <= btol);
  CHECK(gm_test::rel_error(download_as(dt, d_dk), dk) <= btol);
  CHECK(gm_test::rel_error(download_as(dt, d_dv), dv) <= btol);
  CHECK(gm_test::rel_error(std::vector<double>(dbias_f.begin(), dbias_f.end()), dbias) <= btol);
}

}  // namespace

TEST_CASE("emulated kernels: SimMIM's 192/w6 and Swin V2's 256/w8, 256/w16, 192/w12 (fwd + bwd)") {
  GM_SKIP_WITHOUT_DEVICE();
  const std::uint64_t seed = gm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const greenmim::model_shape& b6 = *greenmim::find_model("swin-b-192w6");
  const greenmim::model_shape& v8 = *greenmim::find_model("swinv2_base_window8_256");
  const greenmim::model_shape& v16 = *greenmim::find_model("swinv2_base_window16_256");
  const greenmim::model_shape& l12 = *greenmim::find_model("swinv2_large_window12_192");
  for (bool shifted : {false, true}) {
    check_stage(b6, 0, shifted, GM_FLOAT32, rng);
    check_stage(v16, 0, shifted, GM_FLOAT32, rng);  // window 16: G up to 256
    check_stage(v16, 2, shifted, GM_FLOAT32, rng);  // grid 16 = window: one window, not shifted
    check_stage(l12, 1, shifted, GM_FLOAT32, rng);
  }
  check_stage(v16, 3, true, GM_FLOAT32, rng);  // grid 8 < 16: an 8 x 8 window
  check_stage(b6, 1, true, GM_FLOAT16, rng);   // G <= 64: the tensor-core path under AUTO
  check_stage(v8, 1, true, GM_BFLOAT16, rng);
  check_stage(v16, 1, false, GM_FLOAT16, rng);  // G > 64: SIMT forward, tiled tensor-core backward
}

TEST_CASE("emulated kernels: a window above GM_MAX_WINDOW is refused with the reason models.hpp gives") {
  GM_SKIP_WITHOUT_DEVICE();
  const index_t p = 48;
  CHECK(greenmim::cuda_attention_refusal(p, 64, 32) == "window 48 > GM_MAX_WINDOW 32");
  gm_test::dbuf<float> x(64 * 32), o(64 * 32), lse(64), bias(static_cast<std::size_t>((2 * p - 1) * (2 * p - 1)));
  gm_test::dbuf<index_t> gather(64), scatter(64), slot_window(64), slot_coord(64);
  gm_attention_fwd_args fa{};
  fa.dtype = GM_FLOAT32;
  fa.q = fa.k = fa.v = make_tensor(x.p, {1, 64, 1, 32}, {64 * 32, 32, 32, 1});
  fa.o = make_tensor(o.p, {1, 64, 1, 32}, {64 * 32, 32, 32, 1});
  fa.lse = make_tensor(lse.p, {1, 64, 1}, {64, 1, 1});
  fa.bias_table = make_tensor(bias.p, {(2 * p - 1) * (2 * p - 1), 1}, {1, 1});
  fa.part = gm_partition{gather.p, scatter.p, slot_window.p, slot_coord.p, 64, 1, 64};
  fa.window = p;
  CHECK(gm_attention_fwd_can_implement(&fa) == cudaErrorInvalidValue);
  CHECK(std::string(gm_last_refusal()).find("GM_MAX_WINDOW") != std::string::npos);
  fa.window = 32;  // the same problem at the largest window the kernels take
  fa.bias_table = make_tensor(bias.p, {63 * 63, 1}, {1, 1});
  INFO(gm_last_refusal());
  CHECK(gm_attention_fwd_can_implement(&fa) == cudaSuccess);
}
