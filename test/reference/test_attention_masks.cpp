// Tests of the CPU reference of grouped window attention (reference/attention.hpp), masks: the
// additive and finite block-diagonal masks against the oracle; NaN and Inf propagate inside their
// window only (no leak across the windows of one group).
#include "attention_test_util.hpp"

using namespace gm_attention_test;

TEST_CASE("reference attention: additive mask (-100) equals the oracle; finite mask matches a dense group") {
  gm::rng r(11, 3);
  const gm::window_geometry g = gm::make_window_geometry(28, 28, 7, 3);
  logical L;
  L.B = 2;
  shared_mask_tokens(L, g, 0.75, 5);
  fill_random(L, r);
  const gm::window_list wl = shared_windows(L, g);
  outputs want;
  run_oracle(L, want);
  for (const auto& np : all_partitions(L, wl, r)) {
    CAPTURE(np.name);
    outputs got;
    run_grouped<double>(L, np.part, contiguous, got, true, mask_mode::additive, -100.0);
    compare(got, want, 1e-12, "additive -100");
  }

  // mask_value -1: cross-window pairs and zero padding take part; compare with a dense softmax
  // over all G slots of each group written out here.
  const gm::partition_indices P = hand_partition(L.windows, L.coords, r, 5, true);
  outputs got;
  run_grouped<double>(L, P, gapped, got, false, mask_mode::additive, -1.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(L.D));
  double err = 0;
  const index_t G = P.group_size;
  for (index_t b = 0; b < L.B; ++b)
    for (index_t h = 0; h < L.H; ++h)
      for (index_t gi = 0; gi < P.num_groups; ++gi)
        for (index_t i = 0; i < G; ++i) {
          const index_t ti = P.gather[gi * G + i];
          if (ti < 0) continue;
          auto at = [&](const std::vector<double>& x, index_t t, index_t d) {
            return t < 0 ? 0.0 : x[static_cast<size_t>(((static_cast<std::int64_t>(b) * L.N + t) * L.H + h) * L.D + d)];
          };
          std::vector<double> s(static_cast<size_t>(G));
          double m = -1e300;
          for (index_t j = 0; j < G; ++j) {
            const index_t tj = P.gather[gi * G + j];
            double acc = 0;
            for (index_t d = 0; d < L.D; ++d) acc += scale * at(L.q, ti, d) * at(L.k, tj, d);
            if (tj >= 0 && L.windows[ti] == L.windows[tj]) {
              const index_t ci = L.coords[ti], cj = L.coords[tj];
              acc += L.bias[static_cast<size_t>(
                  gm::rel_pos_index(gm::coord_h(ci), gm::coord_w(ci), gm::coord_h(cj), gm::coord_w(cj), L.p) * L.H + h)];
            } else {
              acc += -1.0;
            }
            s[j] = acc;
            m = std::max(m, acc);
          }
          double l = 0;
          for (auto& x : s) l += (x = std::exp(x - m));
          for (index_t d = 0; d < L.D; ++d) {
            double o = 0;
            for (index_t j = 0; j < G; ++j) o += s[j] / l * at(L.v, P.gather[gi * G + j], d);
            err = std::max(err, std::fabs(o - at(got.out, ti, d)));
          }
          err = std::max(err, std::fabs(m + std::log(l) - got.lse[static_cast<size_t>((static_cast<std::int64_t>(b) * L.N + ti) * L.H + h)]));
        }
  CHECK(err < 1e-12);
  // ... and it is NOT the oracle any more (the mask is finite).
  CHECK(rel_err(got.out, want.out) > 1e-6);
}


TEST_CASE("reference attention: NaN and Inf propagate inside their window only") {
  gm::rng r(4, 4);
  const gm::window_geometry g = gm::make_window_geometry(28, 28, 7, 3);
  logical L;
  shared_mask_tokens(L, g, 0.75, 33);
  fill_random(L, r);
  const gm::window_list wl = shared_windows(L, g);
  // every window in one group: a leak would show in other windows' rows
  const gm::partition_indices P = planned_partition(wl, gm::strategy::single, L.H * L.D);
  outputs clean;
  run_grouped<double>(L, P, contiguous, clean);
  const index_t t = L.N / 2;
  const index_t wt = L.windows[static_cast<size_t>(t)];
  const std::int64_t row = static_cast<std::int64_t>(L.H) * L.D;
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();

  // rows of token u (all heads) of a [B, N, H, D] tensor, sample 0
  auto rows_all = [&](const std::vector<double>& x, index_t u, auto pred) {
    for (std::int64_t i = 0; i < row; ++i)
      if (!pred(x[static_cast<size_t>(u * row + i)])) return false;
    return true;
  };
  auto is_nan = [](double x) { return std::isnan(x); };
  auto not_finite = [](double x) { return !std::isfinite(x); };
  // every token outside window wt unchanged (within rounding) and finite
  auto others_clean = [&](const std::vector<double>& got, const std::vector<double>& want, std::int64_t width) {
    double e = 0;
    for (index_t b = 0; b < L.B; ++b)
      for (index_t u = 0; u < L.N; ++u) {
        if (L.windows[static_cast<size_t>(u)] == wt) continue;
        for (std::int64_t i = 0; i < width; ++i) {
          const size_t k = static_cast<size_t>((static_cast<std::int64_t>(b) * L.N + u) * width + i);
          if (!std::isfinite(got[k])) return false;
          e = std::max(e, std::fabs(got[k] - want[k]));
        }
      }
    return e <= 1e-12 * std::max(1.0, max_abs(want));
  };
  for (mask_mode mode : {mask_mode::exact, mask_mode::additive}) {
    CAPTURE(static_cast<int>(mode));
    {  // NaN in q
      logical X = L;
      for (index_t h = 0; h < L.H; ++h) X.q[static_cast<size_t>(t * row + h * L.D)] = nan;
      outputs o;
      run_grouped<double>(X, P, gapped, o, true, mode);
      CHECK(rows_all(o.out, t, is_nan));
      CHECK(std::isnan(o.lse[static_cast<size_t>(t * L.H)]));
      if (mode == mask_mode::exact) {
        CHECK(others_clean(o.out, clean.out, row));
        CHECK(others_clean(o.lse, clean.lse, L.H));
      }
    }
    {  // NaN in k poisons its window
      logical X = L;
      X.k[static_cast<size_t>(t * row + 1)] = nan;
      outputs o;
      run_grouped<double>(X, P, packed, o, true, mode);
      for (index_t u = 0; u < L.N; ++u)
        if (L.windows[static_cast<size_t>(u)] == wt) CHECK(std::isnan(o.out[static_cast<size_t>(u * row)]));
      if (mode == mask_mode::exact) {
        CHECK(others_clean(o.out, clean.out, row));
        CHECK(others_clean(o.dq, clean.dq, row));
        CHECK(others_clean(o.dk, clean.dk, row));
        CHECK(others_clean(o.dv, clean.dv, row));
      }
    }
    {  // Inf in q gives NaN, Inf in v gives non-finite rows
      logical X = L;
      X.q[static_cast<size_t>(t * row)] = inf;
      X.v[static_cast<size_t>(t * row + 2)] = -inf;
      outputs o;
      run_grouped<double>(X, P, transposed, o, true, mode);
      CHECK(std::isnan(o.out[static_cast<size_t>(t * row)]));  // head 0 of t: inf score
      for (index_t u = 0; u < L.N; ++u)
        if (L.windows[static_cast<size_t>(u)] == wt) CHECK(!std::isfinite(o.out[static_cast<size_t>(u * row + 2)]));
      if (mode == mask_mode::exact) {
        CHECK(others_clean(o.out, clean.out, row));
        CHECK(others_clean(o.dk, clean.dk, row));
      }
    }
    {  // NaN in dout
      logical X = L;
      for (std::int64_t i = 0; i < row; ++i) X.dout[static_cast<size_t>(t * row + i)] = nan;
      outputs o;
      run_grouped<double>(X, P, contiguous, o, true, mode);
      CHECK(others_clean(o.out, clean.out, row));  // forward unaffected
      CHECK(rows_all(o.dq, t, not_finite));
      for (index_t u = 0; u < L.N; ++u)
        if (L.windows[static_cast<size_t>(u)] == wt) {
          CHECK(rows_all(o.dk, u, is_nan));
          CHECK(rows_all(o.dv, u, is_nan));
        }
      if (mode == mask_mode::exact) {
        CHECK(others_clean(o.dq, clean.dq, row));
        CHECK(others_clean(o.dk, clean.dk, row));
        CHECK(others_clean(o.dv, clean.dv, row));
      }
    }
  }
}

