// Tests of the CPU reference of grouped window attention (reference/attention.hpp), its checks:
// bad inputs are refused with a status and nothing is written.
#include "attention_test_util.hpp"

using namespace gm_attention_test;

namespace {

// A small valid forward set-up to break one piece at a time.
struct bad_input_fixture {
  logical L;
  gm::partition_indices P;
  std::vector<double> q, k, v, out, lse, bias;
  ref::attention_args<double> a;

  bad_input_fixture() {
    gm::rng r(1, 9);
    const gm::window_geometry g = gm::make_window_geometry(14, 14, 7, 0);
    L.B = 2;
    shared_mask_tokens(L, g, 0.5, 3);
    fill_random(L, r);
    P = hand_partition(L.windows, L.coords, r, 0, false);
    P.group_size += 3;  // re-layout with three padding slots per group
    gm::partition_indices Q = P;
    Q.gather.clear();
    Q.slot_window.clear();
    Q.slot_coord.clear();
    const index_t G0 = P.group_size - 3;
    for (index_t gi = 0; gi < P.num_groups; ++gi) {
      for (index_t s = 0; s < P.group_size; ++s) {
        const bool real = s < G0;
        const size_t src = static_cast<size_t>(gi * G0 + s);
        Q.gather.push_back(real ? P.gather[src] : gm::pad_index);
        Q.slot_window.push_back(real ? P.slot_window[src] : gm::pad_index);
        Q.slot_coord.push_back(real ? P.slot_coord[src] : 0);
        if (real && Q.gather.back() >= 0) Q.scatter[static_cast<size_t>(Q.gather.back())] = static_cast<index_t>(Q.gather.size() - 1);
      }
    }
    P = Q;
    q = L.q;
    k = L.k;
    v = L.v;
    bias = L.bias;
    out.assign(q.size(), 12345.0);
    lse.assign(static_cast<size_t>(L.B) * L.N * L.H, 12345.0);
    a.q = gm::make_view(static_cast<const double*>(q.data()), L.B, L.N, L.H, L.D);
    a.k = gm::make_view(static_cast<const double*>(k.data()), L.B, L.N, L.H, L.D);
    a.v = gm::make_view(static_cast<const double*>(v.data()), L.B, L.N, L.H, L.D);
    a.bias = gm::make_view(static_cast<const double*>(bias.data()), L.bias_rows(), L.H);
    a.window = L.p;
    a.out = gm::make_view(out.data(), L.B, L.N, L.H, L.D);
    a.lse = gm::make_view(lse.data(), L.B, L.N, L.H);
  }
  bool untouched() const {
    for (double x : out)
      if (x != 12345.0) return false;
    for (double x : lse)
      if (x != 12345.0) return false;
    return true;
  }
  // Runs the forward with `args` and partition `part`: expects `want` and nothing written.
  void expect(gm::status want, ref::attention_args<double> args, const gm::partition_indices* part = nullptr) {
    const gm::partition_indices& pp = part ? *part : P;
    args.part = gm::make_partition_view(pp);
    CHECK(ref::can_implement(args) == want);
    CHECK(ref::group_attention_forward(args) == want);
    CHECK(untouched());
  }
  index_t first_pad() const {
    for (size_t s = 0; s < P.gather.size(); ++s)
      if (P.gather[s] < 0) return static_cast<index_t>(s);
    return -1;
  }
  index_t first_real() const {
    for (size_t s = 0; s < P.gather.size(); ++s)
      if (P.gather[s] >= 0) return static_cast<index_t>(s);
    return -1;
  }
};

}  // namespace

TEST_CASE("reference attention: bad inputs are refused with a status and nothing is written") {
  bad_input_fixture f;
  using gm::status;
  {
    auto a = f.a;
    a.part = gm::make_partition_view(f.P);
    REQUIRE(ref::can_implement(a) == status::success);
  }
  SUBCASE("shapes and strides") {
    auto a = f.a;
    a.k.extent[3] = f.L.D - 1;
    f.expect(status::shape_mismatch, a);
    a = f.a;
    a.v.extent[0] = f.L.B + 1;
    f.expect(status::shape_mismatch, a);
    a = f.a;
    a.out.extent[1] = f.L.N - 1;
    f.expect(status::shape_mismatch, a);
    a = f.a;
    a.lse.extent[2] = f.L.H + 1;
    f.expect(status::shape_mismatch, a);
    a = f.a;
    a.q.stride[3] = -1;
    f.expect(status::shape_mismatch, a);
    a = f.a;
    a.out.stride[1] = 0;  // every token would write the same row
    f.expect(status::shape_mismatch, a);
    a = f.a;
    a.out.stride[2] = 1;  // heads overlap inside a row
    f.expect(status::shape_mismatch, a);
    a = f.a;
    a.q.data = nullptr;
    f.expect(status::invalid_argument, a);
    a = f.a;
    a.q.extent[3] = a.k.extent[3] = a.v.extent[3] = a.out.extent[3] = 0;
    f.expect(status::invalid_argument, a);
    a = f.a;
    a.mask = static_cast<mask_mode>(7);
    f.expect(status::invalid_argument, a);
  }
  SUBCASE("bias table") {
    auto a = f.a;
    a.bias.extent[0] -= 1;
    f.expect(status::shape_mismatch, a);
    a = f.a;
    a.bias.extent[1] += 1;
    f.expect(status::shape_mismatch, a);
    a = f.a;
    a.window = 0;
    f.expect(status::invalid_argument, a);
    a = f.a;
    a.window = 6;  // table of a 6-window: wrong number of rows
    f.expect(status::shape_mismatch, a);
  }
  SUBCASE("partition indices") {
    const index_t pad = f.first_pad(), real = f.first_real();
    REQUIRE(pad >= 0);
    REQUIRE(real >= 0);
    const index_t t0 = f.P.gather[static_cast<size_t>(real)];
    {
      auto P = f.P;
      P.num_tokens += 1;
      f.expect(status::shape_mismatch, f.a, &P);
    }
    {
      auto P = f.P;
      P.gather[static_cast<size_t>(real)] = f.L.N;
      f.expect(status::out_of_range, f.a, &P);
    }
    {
      auto P = f.P;
      P.scatter[0] = P.num_slots();
      f.expect(status::out_of_range, f.a, &P);
    }
    {  // a token gathered twice (a padding slot reads token t0 too)
      auto P = f.P;
      P.gather[static_cast<size_t>(pad)] = t0;
      P.slot_window[static_cast<size_t>(pad)] = f.P.slot_window[static_cast<size_t>(real)];
      P.slot_coord[static_cast<size_t>(pad)] = f.P.slot_coord[static_cast<size_t>(real)];
      f.expect(status::not_covered, f.a, &P);
    }
    {  // a token gathered by no slot
      auto P = f.P;
      P.gather[static_cast<size_t>(real)] = gm::pad_index;
      P.slot_window[static_cast<size_t>(real)] = gm::pad_index;
      f.expect(status::not_covered, f.a, &P);
    }
    {  // gather and scatter not inverse
      auto P = f.P;
      const index_t other = P.scatter[static_cast<size_t>(t0 == 0 ? 1 : 0)];
      std::swap(P.gather[static_cast<size_t>(real)], P.gather[static_cast<size_t>(other)]);
      f.expect(status::not_covered, f.a, &P);
    }
    {
      auto P = f.P;
      P.slot_window[static_cast<size_t>(real)] = gm::pad_index;
      f.expect(status::out_of_range, f.a, &P);
    }
    {
      auto P = f.P;
      P.slot_window[static_cast<size_t>(pad)] = 0;
      f.expect(status::out_of_range, f.a, &P);
    }
    {  // two tokens of one window further apart than p: no bucket in the table
      auto P = f.P;
      const index_t c = P.slot_coord[static_cast<size_t>(real)];
      P.slot_coord[static_cast<size_t>(real)] = gm::pack_coord(gm::coord_h(c) + 40, gm::coord_w(c));
      f.expect(status::out_of_range, f.a, &P);
      auto a = f.a;  // without a bias table the coordinates are not used
      a.bias = gm::tensor_view<const double, 2>{};
      a.part = gm::make_partition_view(P);
      CHECK(ref::can_implement(a) == status::success);
    }
  }
  SUBCASE("backward") {
    auto fa = f.a;
    fa.part = gm::make_partition_view(f.P);
    REQUIRE(ref::group_attention_forward(fa) == status::success);
    std::vector<double> dq(f.q.size(), 5.0), dk(f.q.size(), 5.0), dv(f.q.size(), 5.0), db(f.bias.size(), 5.0);
    ref::attention_backward_args<double> g;
    g.q = fa.q;
    g.k = fa.k;
    g.v = fa.v;
    g.o = fa.out;
    g.dout = fa.q;
    g.lse = fa.lse;
    g.part = fa.part;
    g.bias = fa.bias;
    g.window = fa.window;
    g.dq = gm::make_view(dq.data(), f.L.B, f.L.N, f.L.H, f.L.D);
    g.dk = gm::make_view(dk.data(), f.L.B, f.L.N, f.L.H, f.L.D);
    g.dv = gm::make_view(dv.data(), f.L.B, f.L.N, f.L.H, f.L.D);
    g.dbias = gm::make_view(db.data(), f.L.bias_rows(), f.L.H);
    REQUIRE(ref::can_implement(g) == status::success);
    auto expect = [&](status want, const ref::attention_backward_args<double>& x) {
      CHECK(ref::can_implement(x) == want);
      CHECK(ref::group_attention_backward(x) == want);
      for (auto* buf : {&dq, &dk, &dv, &db})
        for (double e : *buf) REQUIRE(e == 5.0);
    };
    auto x = g;
    x.lse.data = nullptr;
    expect(status::invalid_argument, x);
    x = g;
    x.dk.extent[1] -= 1;
    expect(status::shape_mismatch, x);
    x = g;
    x.o.extent[3] += 1;
    expect(status::shape_mismatch, x);
    x = g;
    x.bias = gm::tensor_view<const double, 2>{};  // dbias without a bias table
    expect(status::shape_mismatch, x);
    x = g;
    x.dbias.extent[0] -= 1;
    expect(status::shape_mismatch, x);
    x = g;
    x.dv.stride[0] = 0;
    expect(status::shape_mismatch, x);
  }
  SUBCASE("oracle") {
    ref::oracle_args<double> o;
    o.q = f.a.q;
    o.k = f.a.k;
    o.v = f.a.v;
    o.bias = f.a.bias;
    o.window = f.a.window;
    o.out = f.a.out;
    o.lse = f.a.lse;
    std::vector<index_t> win = f.L.windows, crd = f.L.coords;
    o.token_window = gm::span<const index_t>(win);
    o.token_coord = gm::span<const index_t>(crd);
    REQUIRE(ref::can_implement(o) == status::success);
    auto expect = [&](status want) {
      CHECK(ref::can_implement(o) == want);
      CHECK(ref::window_attention_oracle(o) == want);
      CHECK(f.untouched());
    };
    o.token_window = gm::span<const index_t>(win.data(), static_cast<std::int64_t>(win.size()) - 1);
    expect(status::shape_mismatch);
    o.token_window = gm::span<const index_t>(win);
    win[3] = -2;
    expect(status::out_of_range);
    win = f.L.windows;
    crd[0] = gm::pack_coord(gm::coord_h(crd[0]) + 30, gm::coord_w(crd[0]));
    expect(status::out_of_range);
    crd = f.L.coords;
    o.token_coord = gm::span<const index_t>(crd.data(), 2);
    expect(status::shape_mismatch);
  }
  SUBCASE("split_qkv and empty problems") {
    std::vector<double> buf(2 * 3 * 2 * 2 * 4);
    auto qkv = gm::make_view(static_cast<const double*>(buf.data()), 2, 3, 2, 2, 4);  // extent[2] = 2
    gm::tensor_view<const double, 4> q, k, v;
    CHECK(ref::split_qkv(qkv, q, k, v) == status::shape_mismatch);
    gm::partition_indices empty;
    auto a = f.a;
    a.q.extent[1] = a.k.extent[1] = a.v.extent[1] = a.out.extent[1] = a.lse.extent[1] = 0;
    a.part = gm::make_partition_view(empty);
    CHECK(ref::group_attention_forward(a) == status::success);
    CHECK(f.untouched());
    a = f.a;
    a.part = gm::make_partition_view(f.P);
    a.q.extent[0] = a.k.extent[0] = a.v.extent[0] = a.out.extent[0] = a.lse.extent[0] = 0;
    CHECK(ref::group_attention_forward(a) == status::success);
    CHECK(f.untouched());
  }
}

