// CPU reference of convolutions on visible tokens (reference/conv.hpp) against the definition: a
// dense conv over the zero-filled image, read at the visible sites; gradients by central finite
// differences in double (every op is linear in x and in the weights, so the difference quotient
// is exact up to rounding).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include <greenmim/random_masks.hpp>
#include <greenmim/reference/conv.hpp>
#include <greenmim/sparse_conv.hpp>

#include "../sparse_conv_test_util.hpp"

using namespace greenmim;
namespace ref = greenmim::reference;

namespace {

using gm_sc_test::randn;
using gm_sc_test::random_coords;

//! The definition: dense conv (cross-correlation) over the zero-filled [H, W, Cin] image of one
//! sample, read at the output sites. groups = 1 (weight [Co, Ci, kh, kw]) or depthwise
//! (weight [C, 1, k, k], Co = Ci). stride, padding as PyTorch's Conv2d.
template <class T>
std::vector<T> dense_conv_at(const std::vector<index_t>& coords, const std::vector<T>& x, index_t first, index_t H,
                             index_t W, index_t Ci, const std::vector<T>& w, const std::vector<T>& bias, index_t Co,
                             index_t k, index_t stride, index_t pad, bool depthwise,
                             const std::vector<index_t>& out_coords) {
  std::vector<long double> img(static_cast<size_t>(H) * W * Ci, 0);  // the zero-filled image
  for (size_t i = 0; i < coords.size(); ++i)
    for (index_t c = 0; c < Ci; ++c)
      img[(coord_h(coords[i]) * W + coord_w(coords[i])) * Ci + c] = x[(first + i) * Ci + c];
  std::vector<T> y(out_coords.size() * Co);
  for (size_t n = 0; n < out_coords.size(); ++n)
    for (index_t a = 0; a < Co; ++a) {
      long double acc = bias.empty() ? 0 : bias[a];
      for (index_t i = 0; i < k; ++i)
        for (index_t j = 0; j < k; ++j) {
          const index_t h = coord_h(out_coords[n]) * stride - pad + i, ww = coord_w(out_coords[n]) * stride - pad + j;
          if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
          if (depthwise)
            acc += static_cast<long double>(w[(a * k + i) * k + j]) * img[(h * W + ww) * Ci + a];
          else
            for (index_t c = 0; c < Ci; ++c)
              acc += static_cast<long double>(w[((a * Ci + c) * k + i) * k + j]) * img[(h * W + ww) * Ci + c];
        }
      y[n * Co + a] = static_cast<T>(acc);
    }
  return y;
}

template <class T>
T tol() { return std::is_same<T, float>::value ? T(2e-5) : T(1e-12); }

template <class T>
void check_close(const std::vector<T>& a, const std::vector<T>& b, T rel) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const T scale = std::max<T>(T(1), std::abs(b[i]));
    if (!(std::abs(a[i] - b[i]) <= rel * scale)) {
      FAIL_CHECK("element " << i << ": " << a[i] << " vs " << b[i]);
      return;
    }
  }
}

//! Central differences of L(p) = <g, f(p)> with respect to every element of p.
std::vector<double> fd_grad(std::vector<double>& p, const std::function<double()>& loss) {
  std::vector<double> out(p.size());
  const double eps = 1e-3;
  for (size_t i = 0; i < p.size(); ++i) {
    const double keep = p[i];
    p[i] = keep + eps;
    const double lp = loss();
    p[i] = keep - eps;
    const double lm = loss();
    p[i] = keep;
    out[i] = (lp - lm) / (2 * eps);
  }
  return out;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// One problem: B samples on an H x W grid, per-sample token sets, a flat axis (cu) and the
// shared-mask case when all samples share one set.
struct problem {
  problem(index_t h, index_t w) : H(h), W(w) {}
  index_t H, W;
  std::vector<std::vector<index_t>> samples;
  std::vector<index_t> cu{0}, flat;
  void add(std::vector<index_t> c) {
    samples.push_back(c);
    flat.insert(flat.end(), c.begin(), c.end());
    cu.push_back(static_cast<index_t>(flat.size()));
  }
};

template <class T>
void depthwise_oracle_case(std::mt19937& g, const problem& pr, index_t k, index_t C, bool residual, bool with_bias) {
  neighbor_table t;
  REQUIRE(build_neighbor_table_per_sample(pr.H, pr.W, k, span<const index_t>(pr.cu), span<const index_t>(pr.flat), t) ==
          status::success);
  const index_t N = t.num_tokens;
  const auto x = randn<T>(g, static_cast<size_t>(N) * C), w = randn<T>(g, static_cast<size_t>(C) * k * k);
  const auto bias = with_bias ? randn<T>(g, C) : std::vector<T>{};
  std::vector<T> y(x.size(), T(-7));
  REQUIRE(ref::depthwise_conv_forward<T>(span<const index_t>(t.nbr), k, make_view(x.data(), 1, N, C),
                                         make_view(w.data(), C, k * k), span<const T>(bias), residual,
                                         make_view(y.data(), 1, N, C)) == status::success);
  std::vector<T> want;
  for (size_t b = 0; b < pr.samples.size(); ++b) {
    auto yb = dense_conv_at<T>(pr.samples[b], x, pr.cu[b], pr.H, pr.W, C, w, bias, C, k, 1, k / 2, true, pr.samples[b]);
    if (residual)
      for (size_t i = 0; i < yb.size(); ++i) yb[i] += x[pr.cu[b] * C + i];
    want.insert(want.end(), yb.begin(), yb.end());
  }
  check_close(y, want, tol<T>());
}

}  // namespace

TEST_CASE_TEMPLATE("depthwise submanifold conv = dense conv over the zero-filled image, at the visible sites", T,
                   float, double) {
  std::mt19937 g(1);
  for (int rep = 0; rep < 12; ++rep) {
    problem pr{static_cast<index_t>(3 + rep % 6), static_cast<index_t>(2 + rep % 7)};
    for (int b = 0; b < 1 + rep % 3; ++b) pr.add(random_coords(g, pr.H, pr.W, 0.15 + 0.3 * b));
    for (index_t k : {1, 3, 5})
      for (bool residual : {true, false}) depthwise_oracle_case<T>(g, pr, k, 3 + rep % 5, residual, rep % 2 == 0);
  }
  // a single token: only the centre tap
  problem one{8, 8};
  one.add({pack_coord(0, 7)});
  depthwise_oracle_case<T>(g, one, 3, 8, true, true);
  // Twins-L PEG at stage 2 on a real mask (shared mask: the same table for a batch of 2)
  mask_config cfg;
  std::vector<index_t> c;
  check(visible_coords(span<const std::uint8_t>(random_mask(cfg, 5)), 7, 28, c));
  problem tw{28, 28};
  tw.add(c);
  depthwise_oracle_case<T>(g, tw, 3, 16, true, true);
}

TEST_CASE("depthwise: the batch axis with one shared table equals the flat per-sample layout") {
  std::mt19937 g(2);
  const auto c = random_coords(g, 9, 9, 0.5);
  neighbor_table t, tf;
  REQUIRE(build_neighbor_table(9, 9, 3, span<const index_t>(c), t) == status::success);
  const std::vector<index_t> cu{0, static_cast<index_t>(c.size()), static_cast<index_t>(2 * c.size())};
  std::vector<index_t> flat = c;
  flat.insert(flat.end(), c.begin(), c.end());
  REQUIRE(build_neighbor_table_per_sample(9, 9, 3, span<const index_t>(cu), span<const index_t>(flat), tf) ==
          status::success);
  const index_t N = t.num_tokens, C = 5;
  const auto x = randn<double>(g, 2 * N * C), w = randn<double>(g, C * 9), bias = randn<double>(g, C);
  std::vector<double> y1(x.size()), y2(x.size());
  REQUIRE(ref::depthwise_conv_forward<double>(span<const index_t>(t.nbr), 3, make_view(x.data(), 2, N, C),
                                              make_view(w.data(), C, 9), span<const double>(bias), true,
                                              make_view(y1.data(), 2, N, C)) == status::success);
  REQUIRE(ref::depthwise_conv_forward<double>(span<const index_t>(tf.nbr), 3, make_view(x.data(), 1, 2 * N, C),
                                              make_view(w.data(), C, 9), span<const double>(bias), true,
                                              make_view(y2.data(), 1, 2 * N, C)) == status::success);
  CHECK(y1 == y2);  // bit-exact: same sums in the same order
}

TEST_CASE("depthwise backward = finite differences (double), residual on and off, borders, per-sample") {
  std::mt19937 g(3);
  for (int rep = 0; rep < 6; ++rep)
    for (bool residual : {true, false}) {
      problem pr{static_cast<index_t>(3 + rep), static_cast<index_t>(4 + rep % 3)};
      for (int b = 0; b < 2; ++b) pr.add(random_coords(g, pr.H, pr.W, 0.5));
      const index_t k = rep % 2 ? 5 : 3, C = 3;
      neighbor_table t;
      REQUIRE(build_neighbor_table_per_sample(pr.H, pr.W, k, span<const index_t>(pr.cu), span<const index_t>(pr.flat),
                                              t) == status::success);
      const index_t N = t.num_tokens, K = k * k;
      auto x = randn<double>(g, N * C), w = randn<double>(g, C * K), bias = randn<double>(g, C);
      const auto gy = randn<double>(g, N * C);
      std::vector<double> y(N * C);
      auto loss = [&] {
        check(ref::depthwise_conv_forward<double>(span<const index_t>(t.nbr), k, make_view(x.data(), 1, N, C),
                                                  make_view(w.data(), C, K), span<const double>(bias), residual,
                                                  make_view(y.data(), 1, N, C)));
        return dot(y, gy);
      };
      std::vector<double> dx(N * C, -1), dw(C * K, -1), db(C, -1);
      REQUIRE(ref::depthwise_conv_backward<double>(span<const index_t>(t.nbr), k, make_view(x.data(), 1, N, C),
                                                   make_view(w.data(), C, K), make_view(gy.data(), 1, N, C), residual,
                                                   make_view(dx.data(), 1, N, C), make_view(dw.data(), C, K),
                                                   span<double>(db)) == status::success);
      check_close(dx, fd_grad(x, loss), 1e-8);
      check_close(dw, fd_grad(w, loss), 1e-8);
      check_close(db, fd_grad(bias, loss), 1e-8);
    }
}

TEST_CASE_TEMPLATE("dense submanifold conv (gather-GEMM-scatter) = dense conv at the visible sites", T, float, double) {
  std::mt19937 g(4);
  for (int rep = 0; rep < 10; ++rep) {
    problem pr{static_cast<index_t>(2 + rep % 7), static_cast<index_t>(3 + rep % 5)};
    for (int b = 0; b < 1 + rep % 3; ++b) pr.add(random_coords(g, pr.H, pr.W, 0.2 + 0.3 * b));
    const index_t k = rep % 3 == 0 ? 1 : (rep % 3 == 1 ? 3 : 5), Ci = 1 + rep % 4, Co = 2 + rep % 3;
    neighbor_table t;
    REQUIRE(build_neighbor_table_per_sample(pr.H, pr.W, k, span<const index_t>(pr.cu), span<const index_t>(pr.flat),
                                            t) == status::success);
    const index_t N = t.num_tokens;
    const auto x = randn<T>(g, N * Ci), w = randn<T>(g, Co * Ci * k * k);
    const auto bias = rep % 2 ? randn<T>(g, Co) : std::vector<T>{};
    std::vector<T> y(N * Co);
    REQUIRE(ref::submanifold_conv_forward<T>(span<const index_t>(t.nbr), k, make_view(x.data(), 1, N, Ci),
                                             make_view(w.data(), Co, Ci, k, k), span<const T>(bias),
                                             make_view(y.data(), 1, N, Co)) == status::success);
    std::vector<T> want;
    for (size_t b = 0; b < pr.samples.size(); ++b) {
      const auto yb = dense_conv_at<T>(pr.samples[b], x, pr.cu[b], pr.H, pr.W, Ci, w, bias, Co, k, 1, k / 2, false,
                                       pr.samples[b]);
      want.insert(want.end(), yb.begin(), yb.end());
    }
    check_close(y, want, tol<T>() * 4);
  }
}

TEST_CASE("dense submanifold conv backward = finite differences (double)") {
  std::mt19937 g(5);
  for (int rep = 0; rep < 4; ++rep) {
    problem pr{5, 6};
    for (int b = 0; b < 2; ++b) pr.add(random_coords(g, pr.H, pr.W, 0.4));
    const index_t k = 3, Ci = 2, Co = 3, K = 9;
    neighbor_table t;
    REQUIRE(build_neighbor_table_per_sample(pr.H, pr.W, k, span<const index_t>(pr.cu), span<const index_t>(pr.flat),
                                            t) == status::success);
    const index_t N = t.num_tokens;
    auto x = randn<double>(g, N * Ci), w = randn<double>(g, Co * Ci * K), bias = randn<double>(g, Co);
    const auto gy = randn<double>(g, N * Co);
    std::vector<double> y(N * Co);
    auto loss = [&] {
      check(ref::submanifold_conv_forward<double>(span<const index_t>(t.nbr), k, make_view(x.data(), 1, N, Ci),
                                                  make_view(w.data(), Co, Ci, k, k), span<const double>(bias),
                                                  make_view(y.data(), 1, N, Co)));
      return dot(y, gy);
    };
    std::vector<double> dx(N * Ci, -1), dw(w.size(), -1), db(Co, -1);
    REQUIRE(ref::submanifold_conv_backward<double>(span<const index_t>(t.nbr), k, make_view(x.data(), 1, N, Ci),
                                                   make_view(w.data(), Co, Ci, k, k), make_view(gy.data(), 1, N, Co),
                                                   make_view(dx.data(), 1, N, Ci), make_view(dw.data(), Co, Ci, k, k),
                                                   span<double>(db)) == status::success);
    check_close(dx, fd_grad(x, loss), 1e-8);
    check_close(dw, fd_grad(w, loss), 1e-8);
    check_close(db, fd_grad(bias, loss), 1e-8);
  }
}

TEST_CASE("a depthwise weight as a dense diagonal weight: both ops agree (double)") {
  std::mt19937 g(6);
  const auto c = random_coords(g, 7, 7, 0.6);
  neighbor_table t;
  REQUIRE(build_neighbor_table(7, 7, 3, span<const index_t>(c), t) == status::success);
  const index_t N = t.num_tokens, C = 4;
  const auto x = randn<double>(g, N * C), w = randn<double>(g, C * 9);
  std::vector<double> dense(C * C * 9, 0.0), y1(N * C), y2(N * C);
  for (index_t a = 0; a < C; ++a)
    for (index_t o = 0; o < 9; ++o) dense[(a * C + a) * 9 + o] = w[a * 9 + o];
  REQUIRE(ref::depthwise_conv_forward<double>(span<const index_t>(t.nbr), 3, make_view(x.data(), 1, N, C),
                                              make_view(w.data(), C, 9), span<const double>(), false,
                                              make_view(y1.data(), 1, N, C)) == status::success);
  REQUIRE(ref::submanifold_conv_forward<double>(span<const index_t>(t.nbr), 3, make_view(x.data(), 1, N, C),
                                                make_view(dense.data(), C, C, 3, 3), span<const double>(),
                                                make_view(y2.data(), 1, N, C)) == status::success);
  check_close(y1, y2, 1e-13);
}

TEST_CASE_TEMPLATE("block conv (gather + GEMM) = dense strided conv at the visible blocks", T, float, double) {
  std::mt19937 g(7);
  mask_config cfg;
  const index_t grids[3] = {56, 28, 14}, sr[3] = {8, 4, 2};
  for (int st = 0; st < 3; ++st)
    for (index_t s : {sr[st], index_t(2)}) {
      problem pr{grids[st], grids[st]};
      for (int b = 0; b < 2; ++b) {
        cfg.ratio = b ? 0.75 : 0.9;
        std::vector<index_t> c;
        check(visible_coords(span<const std::uint8_t>(random_mask(cfg, 11, static_cast<std::uint64_t>(st * 10 + b))),
                             7, grids[st], c));
        pr.add(c);
      }
      block_table bt;
      REQUIRE(build_block_table_per_sample(pr.H, pr.W, s, span<const index_t>(pr.cu), span<const index_t>(pr.flat),
                                           bt) == status::success);
      const index_t N = bt.num_inputs, Nn = bt.num_outputs(), Ci = 3, Co = 4;
      const auto x = randn<T>(g, N * Ci), w = randn<T>(g, Co * Ci * s * s), bias = randn<T>(g, Co);
      std::vector<T> y(Nn * Co);
      REQUIRE(ref::block_conv_forward<T>(span<const index_t>(bt.gather), s, make_view(x.data(), 1, N, Ci),
                                         make_view(w.data(), Co, Ci, s, s), span<const T>(bias),
                                         make_view(y.data(), 1, Nn, Co)) == status::success);
      std::vector<T> want;
      for (size_t b = 0; b < 2; ++b) {
        const std::vector<index_t> out(bt.next_coords.begin() + bt.next_cu_seqlens[b],
                                       bt.next_coords.begin() + bt.next_cu_seqlens[b + 1]);
        const auto yb = dense_conv_at<T>(pr.samples[b], x, pr.cu[b], pr.H, pr.W, Ci, w, bias, Co, s, s, 0, false, out);
        want.insert(want.end(), yb.begin(), yb.end());
      }
      check_close(y, want, tol<T>() * 8);
    }
}

TEST_CASE_TEMPLATE("block conv under block_rule::any = dense strided conv wherever a block has a visible input", T,
                   float, double) {
  std::mt19937 g(17);
  for (index_t s : {index_t(2), index_t(4), index_t(8)}) {
    problem pr{16, 16};
    for (double keep : {0.1, 0.5}) pr.add(random_coords(g, 16, 16, keep));
    block_table bt;
    REQUIRE(build_block_table_per_sample(pr.H, pr.W, s, span<const index_t>(pr.cu), span<const index_t>(pr.flat), bt,
                                         block_rule::any) == status::success);
    REQUIRE(std::count(bt.gather.begin(), bt.gather.end(), pad_index) > 0);  // partly visible blocks
    const index_t N = bt.num_inputs, Nn = bt.num_outputs(), Ci = 3, Co = 5;
    const auto x = randn<T>(g, N * Ci), w = randn<T>(g, Co * Ci * s * s), bias = randn<T>(g, Co);
    std::vector<T> y(Nn * Co);
    REQUIRE(ref::block_conv_forward<T>(span<const index_t>(bt.gather), s, make_view(x.data(), 1, N, Ci),
                                       make_view(w.data(), Co, Ci, s, s), span<const T>(bias),
                                       make_view(y.data(), 1, Nn, Co)) == status::success);
    std::vector<T> want;
    for (size_t b = 0; b < pr.samples.size(); ++b) {
      const std::vector<index_t> out(bt.next_coords.begin() + bt.next_cu_seqlens[b],
                                     bt.next_coords.begin() + bt.next_cu_seqlens[b + 1]);
      const auto yb = dense_conv_at<T>(pr.samples[b], x, pr.cu[b], pr.H, pr.W, Ci, w, bias, Co, s, s, 0, false, out);
      want.insert(want.end(), yb.begin(), yb.end());
    }
    check_close(y, want, tol<T>() * 8);
  }
}

TEST_CASE("block conv backward with holes (block_rule::any) = finite differences (double)") {
  std::mt19937 g(18);
  const auto c = random_coords(g, 8, 8, 0.4);
  block_table bt;
  REQUIRE(build_block_table(8, 8, 4, span<const index_t>(c), bt, block_rule::any) == status::success);
  REQUIRE(std::count(bt.gather.begin(), bt.gather.end(), pad_index) > 0);
  const index_t N = bt.num_inputs, Nn = bt.num_outputs(), Ci = 2, Co = 3, s = 4;
  auto x = randn<double>(g, 2 * N * Ci), w = randn<double>(g, Co * Ci * s * s), bias = randn<double>(g, Co);
  const auto gy = randn<double>(g, 2 * Nn * Co);
  std::vector<double> y(2 * Nn * Co);
  auto loss = [&] {
    check(ref::block_conv_forward<double>(span<const index_t>(bt.gather), s, make_view(x.data(), 2, N, Ci),
                                          make_view(w.data(), Co, Ci, s, s), span<const double>(bias),
                                          make_view(y.data(), 2, Nn, Co)));
    return dot(y, gy);
  };
  std::vector<double> dx(x.size(), -1), dw(w.size(), -1), db(Co, -1);
  REQUIRE(ref::block_conv_backward<double>(span<const index_t>(bt.gather), s, make_view(x.data(), 2, N, Ci),
                                           make_view(w.data(), Co, Ci, s, s), make_view(gy.data(), 2, Nn, Co),
                                           make_view(dx.data(), 2, N, Ci), make_view(dw.data(), Co, Ci, s, s),
                                           span<double>(db)) == status::success);
  check_close(dx, fd_grad(x, loss), 1e-8);
  check_close(dw, fd_grad(w, loss), 1e-8);
  check_close(db, fd_grad(bias, loss), 1e-8);
}

TEST_CASE("block conv backward = finite differences (double); tokens in no block get zero") {
  std::mt19937 g(8);
  // 8x8 grid, s = 2: blocks (0,0), (1,2), (3,3) visible, plus a token set of another sample
  std::vector<index_t> c;
  for (auto blk : {std::pair<int, int>{0, 0}, {1, 2}, {3, 3}})
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) c.push_back(pack_coord(2 * blk.first + i, 2 * blk.second + j));
  std::sort(c.begin(), c.end());
  block_table bt;
  REQUIRE(build_block_table(8, 8, 2, span<const index_t>(c), bt) == status::success);
  const index_t N = static_cast<index_t>(c.size()) + 2, Nn = bt.num_outputs(), Ci = 2, Co = 3, s = 2;  // +2 unused
  auto x = randn<double>(g, 2 * N * Ci), w = randn<double>(g, Co * Ci * 4), bias = randn<double>(g, Co);
  const auto gy = randn<double>(g, 2 * Nn * Co);
  std::vector<double> y(2 * Nn * Co);
  auto loss = [&] {
    check(ref::block_conv_forward<double>(span<const index_t>(bt.gather), s, make_view(x.data(), 2, N, Ci),
                                          make_view(w.data(), Co, Ci, s, s), span<const double>(bias),
                                          make_view(y.data(), 2, Nn, Co)));
    return dot(y, gy);
  };
  std::vector<double> dx(x.size(), -1), dw(w.size(), -1), db(Co, -1);
  REQUIRE(ref::block_conv_backward<double>(span<const index_t>(bt.gather), s, make_view(x.data(), 2, N, Ci),
                                           make_view(w.data(), Co, Ci, s, s), make_view(gy.data(), 2, Nn, Co),
                                           make_view(dx.data(), 2, N, Ci), make_view(dw.data(), Co, Ci, s, s),
                                           span<double>(db)) == status::success);
  check_close(dx, fd_grad(x, loss), 1e-8);
  check_close(dw, fd_grad(w, loss), 1e-8);
  check_close(db, fd_grad(bias, loss), 1e-8);
  for (index_t b = 0; b < 2; ++b)
    for (index_t t = N - 2; t < N; ++t)
      for (index_t ch = 0; ch < Ci; ++ch) CHECK(dx[(b * N + t) * Ci + ch] == 0.0);
}

TEST_CASE("reference conv ops refuse bad arguments before writing anything") {
  std::mt19937 g(9);
  const auto c = random_coords(g, 6, 6, 0.5);
  neighbor_table t;
  REQUIRE(build_neighbor_table(6, 6, 3, span<const index_t>(c), t) == status::success);
  const index_t N = t.num_tokens, C = 2;
  const auto x = randn<double>(g, N * C), w = randn<double>(g, C * 9);
  std::vector<double> y(N * C, 42.0);
  const span<const index_t> nbr(t.nbr);
  const auto xv = make_view(x.data(), 1, N, C);
  const auto yv = make_view(y.data(), 1, N, C);
  CHECK(ref::depthwise_conv_forward<double>(nbr, 5, xv, make_view(w.data(), C, 9), {}, true, yv) ==
        status::shape_mismatch);
  CHECK(ref::depthwise_conv_forward<double>(nbr, 2, xv, make_view(w.data(), C, 9), {}, true, yv) ==
        status::invalid_argument);
  CHECK(ref::depthwise_conv_forward<double>(nbr, 3, xv, make_view(w.data(), 1, 9), {}, true, yv) ==
        status::shape_mismatch);
  std::vector<index_t> bad = t.nbr;
  bad[0] = N;
  CHECK(ref::depthwise_conv_forward<double>(span<const index_t>(bad), 3, xv, make_view(w.data(), C, 9), {}, true,
                                            yv) == status::out_of_range);
  std::vector<double> inplace = x;  // y aliasing x
  CHECK(ref::depthwise_conv_forward<double>(nbr, 3, make_view(inplace.data(), 1, N, C), make_view(w.data(), C, 9), {},
                                            true, make_view(inplace.data(), 1, N, C)) == status::invalid_argument);
  for (double v : y) CHECK(v == 42.0);
  std::vector<index_t> g4{0, 1, 2, 0};  // an input in two blocks
  std::vector<double> dw(C * C * 4), dxx(N * C), dyy(C);
  const auto wb = randn<double>(g, C * C * 4);
  CHECK(ref::block_conv_backward<double>(span<const index_t>(g4), 2, xv, make_view(wb.data(), C, C, 2, 2),
                                         make_view(dyy.data(), 1, 1, C), make_view(dxx.data(), 1, N, C),
                                         make_view(dw.data(), C, C, 2, 2), span<double>()) == status::invalid_argument);
  g4[3] = -2;  // below pad_index
  std::vector<double> yb(C, 42.0);
  CHECK(ref::block_conv_forward<double>(span<const index_t>(g4), 2, xv, make_view(wb.data(), C, C, 2, 2), {},
                                        make_view(yb.data(), 1, 1, C)) == status::out_of_range);
  for (double v : yb) CHECK(v == 42.0);
}
