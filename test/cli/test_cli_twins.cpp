// `greenmim simulate --model twins-l|twins-b` (tools/simulate_twins.hpp): the numbers recomputed
// here from closed forms, the parts add up, the all-token totals are Twins' published FLOPs.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_run.hpp"
#include "json.hpp"

namespace {

using clitest::lines;
using clitest::result;
using clitest::run;
using clitest::slurp;

bool near(double a, double b, double rel = 1e-6) { return std::abs(a - b) <= rel * std::max(1.0, std::abs(b)); }

}  // namespace

TEST_CASE("simulate twins-l: closed forms, parts add up, published FLOPs of the all-token model") {
  const auto r = run("simulate --model twins-l --masks 20 --seed 3 --json");
  REQUIRE(r.code == 0);
  CHECK(r.err.empty());
  const auto j = testjson::parse(r.out);
  CHECK(j["model"].str == "twins-l");
  const double C[4] = {128, 256, 512, 1024}, grid[4] = {56, 28, 14, 7}, sr[4] = {8, 4, 2, 1}, depth[4] = {2, 2, 18, 2};
  const double visible[4] = {768, 192, 48, 12};  // 12 of 49 mask units at every stage
  const auto& st = j["stages"].arr;
  REQUIRE(st.size() == 4);
  double vis_sum = 0, all_sum = 0;
  for (int s = 0; s < 4; ++s) {
    const double n = grid[s] * grid[s], c = C[s];
    CHECK(st[s]["visible_tokens"].num == visible[s]);
    CHECK(st[s]["all_tokens"].num == n);
    for (const char* which : {"visible", "all"}) {
      const auto& p = st[s][which];
      const double N = std::string(which) == "all" ? n : visible[s], M = N / (sr[s] * sr[s]);
      // GSA, MLP, PEG, patch embedding: closed forms (MFLOPs = multiply-adds / 1e6)
      const double gsa = (depth[s] / 2) * (N * c * c * (sr[s] > 1 ? 3 : 2) + 2 * M * c * c + 2 * N * M * c);
      CHECK(near(p["gsa"].num, gsa / 1e6));
      CHECK(near(p["mlp"].num, depth[s] * 8 * N * c * c / 1e6));
      CHECK(near(p["peg"].num, 9 * N * c / 1e6));
      const double cin = s == 0 ? 3 : C[s - 1], k = s == 0 ? 4 : 2;
      CHECK(near(p["embed"].num, N * cin * k * k * c / 1e6));
      const double sum = p["lsa"].num + p["gsa"].num + p["mlp"].num + p["peg"].num + p["embed"].num;
      CHECK(near(p["total"].num, sum));
    }
    // LSA on all tokens: every 7x7 window full
    const double windows = (grid[s] / 7) * (grid[s] / 7), lsa_all = (depth[s] / 2) * windows * (4 * 49 * c * c + 2 * 49 * 49 * c);
    CHECK(near(st[s]["all"]["lsa"].num, lsa_all / 1e6));
    // LSA on visible tokens: the planner's grouping, between the unpadded cost and per-window padding
    const double lsa_vis = st[s]["visible"]["lsa"].num * 1e6 / (depth[s] / 2);
    CHECK(lsa_vis >= 4 * visible[s] * c * c);
    CHECK(lsa_vis <= lsa_all / (depth[s] / 2));
    CHECK(near(st[s]["ratio"].num, st[s]["all"]["total"].num / st[s]["visible"]["total"].num));
    vis_sum += st[s]["visible"]["total"].num;
    all_sum += st[s]["all"]["total"].num;
  }
  CHECK(near(j["total"]["visible"]["total"].num, vis_sum));
  CHECK(near(j["total"]["all"]["total"].num, all_sum));
  CHECK(near(j["total"]["flops_ratio"].num, all_sum / vis_sum));
  CHECK(std::abs(all_sum / 1e3 - 15.1) < 0.05);  // Twins-SVT-L: 15.1 GFLOPs at 224 px (Chu et al., Table 3)
  CHECK(j["total"]["flops_ratio"].num > 4.0);    // more than the token ratio 49/12 = 4.08 ...
  CHECK(j["total"]["flops_ratio"].num < 4.3);    // ... but by little: the MLPs dominate
  CHECK(near(j["total"]["activations_ratio"].num, 49.0 / 12.0));
}

TEST_CASE("simulate twins-b: published FLOPs; text output; refusals") {
  const auto r = run("simulate --model twins-b --masks 5 --json");
  REQUIRE(r.code == 0);
  const auto j = testjson::parse(r.out);
  CHECK(std::abs(j["total"]["all"]["total"].num / 1e3 - 8.6) < 0.05);  // Twins-SVT-B: 8.6 GFLOPs
  const auto t = run("simulate --model twins-l --masks 2");
  REQUIRE(t.code == 0);
  CHECK(t.out.find("stage 4: grid 7, C 1024") != std::string::npos);
  CHECK(t.out.find("encoder:") != std::string::npos);
  for (const char* bad : {"--shift 1", "--per-sample", "--curve x.csv", "--ratio 1", "--masks 0"}) {
    const auto e = run(std::string("simulate --model twins-l ") + bad);
    CHECK(e.code == 2);
    CHECK(e.out.empty());
    CHECK(!e.err.empty());
  }
  CHECK(run("simulate --model twins-l --shift 1").err.find("Swin models only") != std::string::npos);
  // nothing masked: the visible-token model is the all-token model, part by part
  const auto full = run("simulate --model twins-l --masks 1 --ratio 0 --json");
  REQUIRE(full.code == 0);
  const auto jf = testjson::parse(full.out);
  for (const char* part : {"lsa", "gsa", "mlp", "peg", "embed", "total"})
    CHECK(near(jf["total"]["visible"][part].num, jf["total"]["all"][part].num, 1e-12));
  // the Swin models are unchanged
  CHECK(run("simulate --model swin-b --masks 2 --json").code == 0);
}
