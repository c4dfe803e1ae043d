// Tests of the CPU reference of grouped window attention (reference/attention.hpp), forward:
// grouped == window-by-window oracle over random masks, shifts, window sizes, plans and hand-made
// partitions, in double and float; per-sample flattened batches.
#include "attention_test_util.hpp"

using namespace gm_attention_test;

TEST_CASE("reference attention: grouped == window-by-window oracle (double, 1e-12)") {
  gm::rng r(2022, 1);
  int runs = 0;
  for (index_t p : {7, 14}) {
    for (index_t grid : {14, 28, 56}) {
      if (p == 14 && grid == 56) continue;  // 196-token windows: covered by float below
      for (bool shifted : {false, true}) {
        const gm::window_geometry g = gm::make_window_geometry(grid, grid, p, shifted ? p / 2 : 0);
        for (double ratio : {0.0, 0.5, 0.75, 0.9}) {
          if (ratio == 0.0 && grid > 14) continue;
          logical L;
          L.B = grid == 56 ? 1 : 2;
          L.H = 2;
          L.D = grid == 56 ? 4 : 8;
          shared_mask_tokens(L, g, ratio, 1000 + runs);
          L.p = g.window;
          fill_random(L, r, runs % 3 == 0 ? 3.0 : 1.0);  // some peaky softmaxes
          L.with_bias = runs % 5 != 4;
          const gm::window_list wl = shared_windows(L, g);
          outputs want;
          run_oracle(L, want);
          for (const auto& np : all_partitions(L, wl, r)) {
            if (np.part.num_groups == 1 && L.N > 800) continue;  // G = N > 800: slow, adds nothing
            CAPTURE(p);
            CAPTURE(grid);
            CAPTURE(shifted);
            CAPTURE(ratio);
            CAPTURE(np.name);
            outputs got;
            run_grouped<double>(L, np.part, runs % num_layouts, got);
            compare(got, want, 1e-12, "double");
            ++runs;
          }
        }
      }
    }
  }
  CHECK(runs > 100);
}

TEST_CASE("reference attention: float grouped == double oracle (1e-5)") {
  gm::rng r(7, 2);
  int runs = 0;
  struct cfg { index_t p, grid; double ratio; };
  for (cfg c : {cfg{7, 56, 0.75}, cfg{7, 28, 0.5}, cfg{7, 14, 0.75}, cfg{14, 56, 0.75}, cfg{14, 28, 0.5}}) {
    for (bool shifted : {false, true}) {
      const gm::window_geometry g = gm::make_window_geometry(c.grid, c.grid, c.p, shifted ? c.p / 2 : 0);
      logical L;
      L.B = c.grid == 56 ? 1 : 2;
      L.H = 2;
      L.D = 16;
      shared_mask_tokens(L, g, c.ratio, 77 + runs);
      fill_random(L, r, 2.0);
      const gm::window_list wl = shared_windows(L, g);
      const logical R = rounded<float>(L);  // the oracle sees exactly the float inputs
      outputs want;
      run_oracle(R, want);
      for (const auto& np : all_partitions(L, wl, r)) {
        if (np.part.num_groups == 1 && L.N > 400) continue;  // G = N: slow and adds nothing in float
        CAPTURE(c.p);
        CAPTURE(c.grid);
        CAPTURE(np.name);
        outputs got;
        run_grouped<float>(R, np.part, runs % num_layouts, got);
        compare(got, want, 1e-5, "float");
        ++runs;
      }
    }
  }
}


TEST_CASE("reference attention: per-sample flattened batches equal per-sample oracles") {
  gm::rng r(5, 5);
  int runs = 0;
  for (index_t p : {7, 14}) {
    for (bool shifted : {false, true}) {
      for (bool aligned : {true, false}) {
        const index_t grid = p == 7 ? 14 : 28;
        const gm::window_geometry g = gm::make_window_geometry(grid, grid, p, shifted ? p / 2 : 0);
        const index_t S = 4;
        // Per-sample visible sets: random mask-unit masks (one stream per sample) or arbitrary
        // keep sets with per-sample keep rates (one sample keeps nothing; with p = 7 one keeps
        // everything).
        std::vector<std::uint8_t> keep(static_cast<size_t>(S) * grid * grid, 0);
        for (index_t b = 0; b < S; ++b) {
          if (aligned) {
            gm::mask_config cfg{224, 32, b == 0 ? 0.9 : 0.75};
            const std::vector<std::uint8_t> m = gm::random_mask(cfg, 99 + runs, static_cast<std::uint64_t>(b));
            const index_t u = grid / cfg.grid();
            for (index_t h = 0; h < grid; ++h)
              for (index_t w = 0; w < grid; ++w)
                keep[static_cast<size_t>((b * grid + h) * grid + w)] = m[static_cast<size_t>((h / u) * cfg.grid() + w / u)];
          } else {
            const double rate7[] = {0.0, 0.1, 0.5, 1.0}, rate14[] = {0.0, 0.05, 0.25, 0.6};
            const double rate = p == 7 ? rate7[b] : rate14[b];
            for (index_t i = 0; i < grid * grid; ++i)
              keep[static_cast<size_t>(b * grid * grid + i)] = r.uniform() < rate;
          }
        }
        std::vector<index_t> cu, coords;
        REQUIRE(gm::keep_mask_coords(gm::span<const std::uint8_t>(keep), S, grid, grid, cu, coords) == gm::status::success);
        gm::window_list wl;
        REQUIRE(gm::build_windows_per_sample(g, gm::span<const index_t>(cu), gm::span<const index_t>(coords), wl) ==
                gm::status::success);
        logical L;
        L.B = 1;
        L.H = 2;
        L.D = 8;
        L.p = g.window;
        L.N = wl.num_tokens;
        L.coords = wl.coords;
        L.windows.assign(static_cast<size_t>(L.N), -1);
        for (index_t w = 0; w < wl.num_windows(); ++w)
          for (index_t t : wl.window(w)) L.windows[static_cast<size_t>(t)] = w;
        fill_random(L, r, 2.0);
        // Per-sample oracles, each on its own token range with local window ids.
        outputs want;
        want.dbias.assign(L.bias.size(), 0.0);
        for (index_t b = 0; b < S; ++b) {
          logical Ls = L;
          Ls.N = cu[b + 1] - cu[b];
          const std::int64_t row = static_cast<std::int64_t>(L.H) * L.D;
          auto slice = [&](const auto& x, std::int64_t w) {
            return std::decay_t<decltype(x)>(x.begin() + cu[b] * w, x.begin() + cu[b + 1] * w);
          };
          Ls.q = slice(L.q, row);
          Ls.k = slice(L.k, row);
          Ls.v = slice(L.v, row);
          Ls.dout = slice(L.dout, row);
          Ls.coords = slice(L.coords, 1);
          Ls.windows.clear();
          for (index_t c : Ls.coords) Ls.windows.push_back(g.window_id(gm::coord_h(c), gm::coord_w(c)));
          outputs o;
          run_oracle(Ls, o);
          for (auto pr : {std::make_pair(&want.out, &o.out), std::make_pair(&want.dq, &o.dq),
                          std::make_pair(&want.dk, &o.dk), std::make_pair(&want.dv, &o.dv),
                          std::make_pair(&want.lse, &o.lse)})
            pr.first->insert(pr.first->end(), pr.second->begin(), pr.second->end());
          for (size_t i = 0; i < want.dbias.size(); ++i) want.dbias[i] += o.dbias[i];
        }
        for (const auto& np : all_partitions(L, wl, r)) {
          CAPTURE(p);
          CAPTURE(shifted);
          CAPTURE(aligned);
          CAPTURE(np.name);
          if (np.part.num_groups == 1 && L.N > 600 && np.name != "single") continue;  // keep one G = N run
          // windows of different samples share groups (always so with the single group)
          if (np.name == "single") {
            std::vector<std::uint8_t> seen(static_cast<size_t>(S), 0);
            for (index_t s = 0; s < np.part.group_size; ++s)
              if (np.part.gather[s] >= 0) seen[static_cast<size_t>(np.part.slot_window[s] / g.num_windows())] = 1;
            CHECK(std::count(seen.begin(), seen.end(), 1) >= 2);
          }
          outputs got;
          run_grouped<double>(L, np.part, runs % num_layouts, got);
          compare(got, want, 1e-12, "per-sample double");
          ++runs;
        }
      }
    }
  }
}

