// Tests of the CPU reference of grouped window attention (reference/attention.hpp), the
// relative-position bias gradient: dbias accumulates and runs are deterministic.
#include "attention_test_util.hpp"

using namespace gm_attention_test;

TEST_CASE("reference attention: dbias accumulates, runs are deterministic") {
  gm::rng r(8, 8);
  const gm::window_geometry g = gm::make_window_geometry(28, 28, 7, 3);
  logical L;
  shared_mask_tokens(L, g, 0.75, 21);
  fill_random(L, r);
  const gm::partition_indices P = planned_partition(shared_windows(L, g), gm::strategy::fast, L.H * L.D);
  outputs a, b;
  run_grouped<float>(L, P, contiguous, a);
  run_grouped<float>(L, P, contiguous, b);
  CHECK(a.out == b.out);
  CHECK(a.dq == b.dq);
  CHECK(a.dbias == b.dbias);
  // += semantics: start from ones
  triple<double> in(L.B, L.N, L.H, L.D, contiguous);
  in.write(0, L.q);
  in.write(1, L.k);
  in.write(2, L.v);
  std::vector<double> out(static_cast<size_t>(L.numel())), lse(static_cast<size_t>(L.B) * L.N * L.H);
  ref::attention_args<double> fa;
  fa.q = in.c(0);
  fa.k = in.c(1);
  fa.v = in.c(2);
  fa.part = gm::make_partition_view(P);
  fa.bias = gm::make_view(static_cast<const double*>(L.bias.data()), L.bias_rows(), L.H);
  fa.window = L.p;
  fa.out = gm::make_view(out.data(), L.B, L.N, L.H, L.D);
  fa.lse = gm::make_view(lse.data(), L.B, L.N, L.H);
  REQUIRE(ref::group_attention_forward(fa) == gm::status::success);
  triple<double> gr(L.B, L.N, L.H, L.D, contiguous);
  std::vector<double> db0(L.bias.size(), 0.0), db1(L.bias.size(), 1.0);
  ref::attention_backward_args<double> ba;
  ba.q = fa.q;
  ba.k = fa.k;
  ba.v = fa.v;
  ba.o = gm::make_view(static_cast<const double*>(out.data()), L.B, L.N, L.H, L.D);
  ba.dout = gm::make_view(static_cast<const double*>(L.dout.data()), L.B, L.N, L.H, L.D);
  ba.lse = gm::make_view(static_cast<const double*>(lse.data()), L.B, L.N, L.H);
  ba.part = fa.part;
  ba.bias = fa.bias;
  ba.window = fa.window;
  ba.dq = gr.v[0];
  ba.dk = gr.v[1];
  ba.dv = gr.v[2];
  ba.dbias = gm::make_view(db0.data(), L.bias_rows(), L.H);
  REQUIRE(ref::group_attention_backward(ba) == gm::status::success);
  ba.dbias = gm::make_view(db1.data(), L.bias_rows(), L.H);
  REQUIRE(ref::group_attention_backward(ba) == gm::status::success);
  for (size_t i = 0; i < db0.size(); ++i) REQUIRE(db1[i] == 1.0 + db0[i]);
  CHECK(max_abs(db0) > 0);
}

