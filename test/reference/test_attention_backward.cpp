// Tests of the CPU reference of grouped window attention (reference/attention.hpp), backward:
// central finite differences of the grouped backward and of the oracle.
#include "attention_test_util.hpp"

using namespace gm_attention_test;

namespace {

// Central finite differences of loss = sum(dout * out) with respect to every input of the grouped
// forward (q, k, v, bias) against the grouped backward; and the same for the oracle.
void finite_difference_check(logical L, const gm::partition_indices& P, mask_mode mode, double mask_value,
                             bool oracle) {
  auto loss = [&](const logical& X) {
    outputs o;
    if (oracle)
      run_oracle(X, o, false);
    else
      run_grouped<double>(X, P, contiguous, o, false, mode, mask_value);
    double s = 0;
    for (size_t i = 0; i < o.out.size(); ++i) s += X.dout[i] * o.out[i];
    return s;
  };
  outputs an;
  if (oracle)
    run_oracle(L, an);
  else
    run_grouped<double>(L, P, contiguous, an, true, mode, mask_value);
  const double eps = 1e-5;
  auto fd = [&](std::vector<double> logical::*member) {
    std::vector<double> g((L.*member).size());
    for (size_t i = 0; i < g.size(); ++i) {
      const double x = (L.*member)[i];
      (L.*member)[i] = x + eps;
      const double lp = loss(L);
      (L.*member)[i] = x - eps;
      const double lm = loss(L);
      (L.*member)[i] = x;
      g[i] = (lp - lm) / (2 * eps);
    }
    return g;
  };
  const double eq = rel_err(an.dq, fd(&logical::q)), ek = rel_err(an.dk, fd(&logical::k)),
               ev = rel_err(an.dv, fd(&logical::v)), eb = rel_err(an.dbias, fd(&logical::bias));
  CHECK(eq < 1e-7);
  CHECK(ek < 1e-7);
  CHECK(ev < 1e-7);
  CHECK(eb < 1e-7);
  record(std::string(oracle ? "fd oracle" : mode == mask_mode::exact ? "fd grouped exact" : "fd grouped additive"),
         std::max({eq, ek, ev, eb}));
}

}  // namespace

TEST_CASE("reference attention: backward == central finite differences (double)") {
  gm::rng r(3, 4);
  const gm::window_geometry g = gm::make_window_geometry(14, 14, 7, 3);
  logical L;
  L.B = 1;
  L.H = 2;
  L.D = 3;  // odd head_dim on purpose
  shared_mask_tokens(L, g, 0.75, 9);
  fill_random(L, r, 1.5);
  // a hand partition that really merges windows into shared groups
  const std::vector<index_t> sizes = gm::window_sizes(g, gm::span<const index_t>(L.coords));
  const index_t nonempty = static_cast<index_t>(sizes.size() - std::count(sizes.begin(), sizes.end(), 0));
  gm::partition_indices P = hand_partition(L.windows, L.coords, r, 4, false);
  for (int tries = 0; tries < 50 && P.num_groups >= nonempty; ++tries) P = hand_partition(L.windows, L.coords, r, 4, false);
  REQUIRE(P.num_groups < nonempty);
  SUBCASE("grouped, exact mask") { finite_difference_check(L, P, mask_mode::exact, 0, false); }
  SUBCASE("grouped, additive mask -2 (cross-window pairs carry gradient)") {
    finite_difference_check(L, P, mask_mode::additive, -2.0, false);
  }
  SUBCASE("oracle") { finite_difference_check(L, P, mask_mode::exact, 0, true); }
}

