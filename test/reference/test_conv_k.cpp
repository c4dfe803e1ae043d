// The CPU reference depthwise conv (reference/conv.hpp) at ConvNeXt's 7 x 7 (and 5 x 5): forward
// against a dense depthwise conv over each sample's zero-filled image, written here from the
// definition; backward against central finite differences in double (the op is linear in x and in
// the weights, so the quotient is exact up to rounding); and the refusals of a table that does not
// match the kernel or the tokens (a table from another plan).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include <greenmim/reference/conv.hpp>
#include <greenmim/sparse_conv.hpp>

#include "../sparse_conv_test_util.hpp"

using namespace greenmim;
namespace ref = greenmim::reference;

namespace {

//! Per-sample token sets on an H x W grid, flat (cu offsets).
struct samples_k {
  samples_k(index_t h, index_t w) : H(h), W(w) {}
  index_t H, W;
  std::vector<std::vector<index_t>> sets;
  std::vector<index_t> cu{0}, flat;
  void add(const std::vector<index_t>& c) {
    sets.push_back(c);
    flat.insert(flat.end(), c.begin(), c.end());
    cu.push_back(static_cast<index_t>(flat.size()));
  }
};

//! The definition: for each sample, scatter its tokens into a zero [H, W, C] image, run PyTorch's
//! depthwise Conv2d (groups = C, padding k / 2, cross-correlation) densely, read it back at the
//! sample's sites; + x where residual.
std::vector<double> dense_depthwise(const samples_k& s, const std::vector<double>& x, const std::vector<double>& w,
                                    const std::vector<double>& bias, index_t C, index_t k, bool residual) {
  std::vector<double> y(x.size());
  const index_t r = k / 2;
  for (size_t b = 0; b < s.sets.size(); ++b) {
    std::vector<double> img(static_cast<size_t>(s.H) * s.W * C, 0.0);
    for (size_t i = 0; i < s.sets[b].size(); ++i)
      for (index_t c = 0; c < C; ++c)
        img[(coord_h(s.sets[b][i]) * s.W + coord_w(s.sets[b][i])) * C + c] = x[(s.cu[b] + i) * C + c];
    std::vector<double> out(img.size());
    for (index_t h = 0; h < s.H; ++h)
      for (index_t ww = 0; ww < s.W; ++ww)
        for (index_t c = 0; c < C; ++c) {
          long double acc = bias.empty() ? 0 : bias[c];
          for (index_t i = 0; i < k; ++i)
            for (index_t j = 0; j < k; ++j) {
              const index_t hh = h - r + i, w2 = ww - r + j;
              if (hh >= 0 && hh < s.H && w2 >= 0 && w2 < s.W)
                acc += static_cast<long double>(w[(c * k + i) * k + j]) * img[(hh * s.W + w2) * C + c];
            }
          out[(h * s.W + ww) * C + c] = static_cast<double>(acc);
        }
    for (size_t i = 0; i < s.sets[b].size(); ++i)
      for (index_t c = 0; c < C; ++c) {
        const size_t row = (s.cu[b] + i) * C + c;
        y[row] = out[(coord_h(s.sets[b][i]) * s.W + coord_w(s.sets[b][i])) * C + c] + (residual ? x[row] : 0.0);
      }
  }
  return y;
}

void check_close_k(const std::vector<double>& a, const std::vector<double>& b, double rel) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i)
    if (!(std::abs(a[i] - b[i]) <= rel * std::max(1.0, std::abs(b[i])))) {
      FAIL_CHECK("element " << i << ": " << a[i] << " vs " << b[i]);
      return;
    }
}

std::vector<double> fd_k(std::vector<double>& p, const std::function<double()>& loss) {
  std::vector<double> out(p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    const double keep = p[i];
    p[i] = keep + 1e-3;
    const double lp = loss();
    p[i] = keep - 1e-3;
    const double lm = loss();
    p[i] = keep;
    out[i] = (lp - lm) / 2e-3;
  }
  return out;
}

}  // namespace

TEST_CASE("depthwise 7 x 7 and 5 x 5 reference = dense depthwise conv over each sample's zero-filled image") {
  std::mt19937 g(71);
  for (int rep = 0; rep < 6; ++rep)
    for (index_t k : {7, 5})
      for (bool residual : {true, false}) {
        samples_k s{static_cast<index_t>(4 + rep * 2), static_cast<index_t>(3 + rep * 3)};  // 4x3 .. 14x18
        for (int b = 0; b < 3; ++b) s.add(gm_sc_test::random_coords(g, s.H, s.W, b == 2 ? 0.0 : 0.3 + 0.4 * b));
        neighbor_table t;
        REQUIRE(build_neighbor_table_per_sample(s.H, s.W, k, span<const index_t>(s.cu), span<const index_t>(s.flat), t) ==
                status::success);
        const index_t N = t.num_tokens, C = 3 + rep % 3, K = k * k;
        const auto x = gm_sc_test::randn<double>(g, static_cast<size_t>(N) * C), w = gm_sc_test::randn<double>(g, static_cast<size_t>(C) * K);
        const auto bias = rep % 2 ? gm_sc_test::randn<double>(g, C) : std::vector<double>{};
        std::vector<double> y(x.size(), -7.0);
        REQUIRE(ref::depthwise_conv_forward<double>(span<const index_t>(t.nbr), k, make_view(x.data(), 1, N, C),
                                                    make_view(w.data(), C, K), span<const double>(bias), residual,
                                                    make_view(y.data(), 1, N, C)) == status::success);
        INFO("rep " << rep << " k " << k << " residual " << residual);
        check_close_k(y, dense_depthwise(s, x, w, bias, C, k, residual), 1e-12);
      }
}

TEST_CASE("depthwise 7 x 7 reference backward = finite differences (double), batch axis and per-sample layout") {
  std::mt19937 g(73);
  for (bool residual : {true, false})
    for (int layout = 0; layout < 2; ++layout) {  // 0: per-sample flat (B = 1); 1: a shared mask, B = 2
      samples_k s{9, 8};
      s.add(gm_sc_test::random_coords(g, 9, 8, 0.5));
      if (layout == 0) s.add(gm_sc_test::random_coords(g, 9, 8, 0.6));
      neighbor_table t;
      REQUIRE(build_neighbor_table_per_sample(9, 8, 7, span<const index_t>(s.cu), span<const index_t>(s.flat), t) ==
              status::success);
      const std::int64_t B = layout == 0 ? 1 : 2, N = t.num_tokens, C = 2, K = 49;
      auto x = gm_sc_test::randn<double>(g, static_cast<size_t>(B * N * C)), w = gm_sc_test::randn<double>(g, static_cast<size_t>(C * K)), bias = gm_sc_test::randn<double>(g, C);
      const auto gy = gm_sc_test::randn<double>(g, x.size());
      std::vector<double> y(x.size());
      auto loss = [&] {
        check(ref::depthwise_conv_forward<double>(span<const index_t>(t.nbr), 7, make_view(x.data(), B, N, C),
                                                  make_view(w.data(), C, K), span<const double>(bias), residual,
                                                  make_view(y.data(), B, N, C)));
        double l = 0;
        for (size_t i = 0; i < y.size(); ++i) l += y[i] * gy[i];
        return l;
      };
      std::vector<double> dx(x.size(), -1), dw(w.size(), -1), db(C, -1);
      REQUIRE(ref::depthwise_conv_backward<double>(span<const index_t>(t.nbr), 7, make_view(x.data(), B, N, C),
                                                   make_view(w.data(), C, K), make_view(gy.data(), B, N, C), residual,
                                                   make_view(dx.data(), B, N, C), make_view(dw.data(), C, K),
                                                   span<double>(db)) == status::success);
      INFO("residual " << residual << " layout " << layout);
      check_close_k(dx, fd_k(x, loss), 1e-8);
      check_close_k(dw, fd_k(w, loss), 1e-8);
      check_close_k(db, fd_k(bias, loss), 1e-8);
    }
}

TEST_CASE("depthwise reference refuses a table that does not fit (another kernel, other tokens), even k; writes nothing") {
  std::mt19937 g(79);
  const auto c = gm_sc_test::random_coords(g, 8, 8, 0.5);
  neighbor_table t7, t5;
  REQUIRE(build_neighbor_table(8, 8, 7, span<const index_t>(c), t7) == status::success);
  REQUIRE(build_neighbor_table(8, 8, 5, span<const index_t>(c), t5) == status::success);
  const std::int64_t N = t7.num_tokens, C = 2;
  const auto x = gm_sc_test::randn<double>(g, static_cast<size_t>(N * C)), w = gm_sc_test::randn<double>(g, static_cast<size_t>(C * 49));
  std::vector<double> y(x.size(), -7.0);
  auto fwd = [&](span<const index_t> table, index_t k, std::int64_t n) {
    return ref::depthwise_conv_forward<double>(table, k, make_view(x.data(), 1, n, C), make_view(w.data(), C, k * k),
                                               span<const double>(), true, make_view(y.data(), 1, n, C));
  };
  CHECK(fwd(span<const index_t>(t5.nbr), 7, N) == status::shape_mismatch);  // a 5 x 5 table for a 7 x 7 conv
  CHECK(fwd(span<const index_t>(t7.nbr), 7, N - 1) == status::shape_mismatch);  // another plan's token count
  CHECK(fwd(span<const index_t>(t7.nbr), 6, N) == status::invalid_argument);
  // a table of more tokens cut to N rows: entries past N are out of range
  const auto c2 = gm_sc_test::random_coords(g, 8, 8, 0.9);
  neighbor_table big;
  REQUIRE(build_neighbor_table(8, 8, 7, span<const index_t>(c2), big) == status::success);
  if (big.num_tokens > N) {
    const span<const index_t> cut(big.nbr.data(), N * 49);
    bool has_far = false;
    for (std::int64_t i = 0; i < cut.size(); ++i) has_far |= cut[i] >= N;
    if (has_far) CHECK(fwd(cut, 7, N) == status::out_of_range);
  }
  for (double v : y) REQUIRE(v == -7.0);
}
