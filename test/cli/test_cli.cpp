// The greenmim program driven as a user would: exit codes, stdout/stderr contracts, JSON shapes.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <random>
#include <sstream>
#include <string>
#include <sys/wait.h>

#include "cli_run.hpp"
#include "json.hpp"

namespace {

using clitest::lines;
using clitest::result;
using clitest::run;
using clitest::slurp;

void check_plan_json(const testjson::value& j, const std::vector<int>& sizes) {
  const int G = static_cast<int>(j["group_size"].num);
  std::multiset<int> seen;
  const auto& groups = j["groups"].arr;
  REQUIRE(groups.size() == j["fills"].arr.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    int fill = 0;
    for (const auto& w : groups[g].arr) {
      const int idx = static_cast<int>(w.num);
      REQUIRE(idx >= 0);
      REQUIRE(idx < static_cast<int>(sizes.size()));
      CHECK(sizes[idx] > 0);
      seen.insert(idx);
      fill += sizes[idx];
    }
    CHECK(fill == static_cast<int>(j["fills"].arr[g].num));
    CHECK(fill <= G);
  }
  for (size_t i = 0; i < sizes.size(); ++i) CHECK(seen.count(static_cast<int>(i)) == (sizes[i] > 0 ? 1u : 0u));
  CHECK(j["cost"].num >= j["lower_bound"].num);
}

}  // namespace

TEST_CASE("plan --json: exactly one object, every non-empty window in exactly one group") {
  const std::vector<int> sizes = {12, 30, 0, 7};
  for (const char* strat : {"fast", "paper", "per-window", "single"}) {
    const result r = run(std::string("plan --sizes 12,30,0,7 --json --strategy ") + strat);
    REQUIRE(r.code == 0);
    CHECK(r.err.empty());
    CHECK(lines(r.out) == 1);
    const auto j = testjson::parse(r.out);
    CHECK(j["strategy"].str == strat);
    check_plan_json(j, sizes);
  }
  const result fixed = run("plan --sizes 12,30,0,7 --group-size 40 --json");
  REQUIRE(fixed.code == 0);
  CHECK(testjson::parse(fixed.out)["group_size"].num == 40);
  const result capped = run("plan --sizes 12,30,0,7 --strategy paper --group-size 100 --json");
  REQUIRE(capped.code == 0);
  CHECK(testjson::parse(capped.out)["group_size"].num == 49);  // capped at sum w
}

TEST_CASE("plan --max-group: the sweep stays at or below the cap; without it the optimum lies above") {
  // three full windows of 49 and one of 14 at C = 256: one group of 161 free; under a cap of 64
  // the 14 tokens ride with a full window (G = 63, three groups), for both fast and paper
  const std::vector<int> sizes = {49, 49, 49, 14};
  const result free = run("plan --sizes 49,49,49,14 --channels 256 --json");
  REQUIRE(free.code == 0);
  CHECK(testjson::parse(free.out)["group_size"].num > 64);
  for (const char* strat : {"fast", "paper"}) {
    const result r = run(std::string("plan --sizes 49,49,49,14 --channels 256 --max-group 64 --json --strategy ") + strat);
    REQUIRE(r.code == 0);
    const auto j = testjson::parse(r.out);
    check_plan_json(j, sizes);
    CHECK(j["group_size"].num == 63);
    CHECK(j["cost"].num >= testjson::parse(free.out)["cost"].num);
  }
}

TEST_CASE("plan reads sizes from stdin; several lines are a batch") {
  const result one = run("plan --json", "5 9 0 3\n");
  REQUIRE(one.code == 0);
  check_plan_json(testjson::parse(one.out), {5, 9, 0, 3});
  const result batch = run("plan --json", "5,9,0,3\n49,1\n\n20 20 0\n");
  REQUIRE(batch.code == 0);
  const auto j = testjson::parse(batch.out);
  check_plan_json(j, {5, 9, 0, 3, 49, 1, 20, 20, 0});
  REQUIRE(j.has("sample_offsets"));
  CHECK(j["sample_offsets"].arr.size() == 4);
  const result text = run("plan --sizes 12,30,0,7");
  REQUIRE(text.code == 0);
  CHECK(text.out.find("lower bound") != std::string::npos);
}

TEST_CASE("bad input: exit code 2, one line on stderr, nothing on stdout") {
  const char* bad[] = {
      "plan --sizes 12,abc,7",       "plan --sizes 12,-3,7",        "plan --sizes 12,,7",
      "plan --sizes ''",             "plan --sizes 0,0,0",          "plan --sizes 12,30 --group-size 20",
      "plan --sizes 12,30 --group-size 0", "plan --sizes 3 --channels 0", "plan --sizes 3 --channels 100000000",
      "plan --sizes 3 --strategy magic", "plan --sizes 3 --bogus",  "plan --sizes 3 --json=1",
      "plan --sizes 3 --strategy single --group-size 5", "plan --sizes 99999999999",
      "plan --sizes 49,3 --max-group 40", "plan --sizes 3 --max-group 0", "plan --sizes 3 --strategy single --max-group 8",
      "plan --sizes 3 --group-size 9 --max-group 8",
      "simulate --model swin-x",     "simulate --masks 0",          "simulate --masks ten",
      "simulate --seed -1",          "simulate --shift 7",          "simulate --ratio 1.5",
      "simulate --ratio 1",          "simulate --curve /nonexistent-dir/x.csv --masks 1",
      "simulate --batch 4",          "frobnicate",                  "plan --sizes",
      "demo --reps 0",               "demo --reps 101",             "demo --reps two",
  };
  for (const char* args : bad) {
    const result r = run(args);
    INFO(args << " -> stderr: " << r.err);
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK(lines(r.err) == 1);
  }
  const result empty_stdin = run("plan", "");
  CHECK(empty_stdin.code == 2);
  CHECK(empty_stdin.out.empty());
}

TEST_CASE("simulate --json: the appendix table's columns, fast <= paper, bound <= fast") {
  const result r = run("simulate --model swin-b --masks 4 --seed 3 --json");
  REQUIRE(r.code == 0);
  const auto j = testjson::parse(r.out);
  REQUIRE(j["stages"].arr.size() == 3);
  const int grids[] = {56, 28, 14}, channels[] = {128, 256, 512}, windows[] = {64, 16, 4};
  for (int s = 0; s < 3; ++s) {
    const auto& st = j["stages"].arr[s];
    CHECK(st["stage"].num == s + 1);
    CHECK(st["grid"].num == grids[s]);
    CHECK(st["channels"].num == channels[s]);
    CHECK(st["windows"].num == windows[s]);
    CHECK(st["visible_tokens"].num == 12 * (64 >> (2 * s)));
    const auto& m = st["mflops"];
    for (const char* k : {"paper", "paper_pxp", "paper_max", "per_window", "single", "fast", "lower_bound"})
      CHECK(m[k].num > 0);
    CHECK(m["fast"].num <= m["paper"].num + 1e-9);
    CHECK(m["lower_bound"].num <= m["fast"].num + 1e-9);
    CHECK(m["paper"].num <= m["paper_pxp"].num + 1e-9);
  }
  const result shifted = run("simulate --masks 2 --shift 3 --json");
  REQUIRE(shifted.code == 0);
  CHECK(testjson::parse(shifted.out)["stages"].arr[0]["windows"].num == 81);
}

TEST_CASE("simulate --curve writes the cost-vs-G curve per stage") {
  const std::string path = "/tmp/greenmim_curve_test_" + std::to_string(::getpid()) + ".csv";
  const result r = run("simulate --masks 2 --curve " + path);
  REQUIRE(r.code == 0);
  const std::string csv = slurp(path);
  std::remove(path.c_str());
  CHECK(csv.rfind("stage,group_size,masks,mean_mflops,std_mflops,fast_mean_mflops\n", 0) == 0);
  std::set<int> stages;
  std::istringstream is(csv);
  std::string line;
  std::getline(is, line);
  while (std::getline(is, line)) {
    int st = 0, g = 0, n = 0;
    double mean = 0, sd = 0, fast = 0;
    REQUIRE(std::sscanf(line.c_str(), "%d,%d,%d,%lf,%lf,%lf", &st, &g, &n, &mean, &sd, &fast) == 6);
    stages.insert(st);
    CHECK(fast <= mean + 1e-9);
    CHECK(sd >= 0);
  }
  CHECK(stages == std::set<int>{1, 2, 3});
}

TEST_CASE("simulate --per-sample: per-image costs with shared and per-sample masks") {
  const result r = run("simulate --per-sample --batch 16 --masks 2 --json");
  REQUIRE(r.code == 0);
  const auto j = testjson::parse(r.out);
  for (const auto& st : j["stages"].arr) {
    const auto& m = st["mflops_per_image"];
    CHECK(m["per_sample"].num >= m["lower_bound"].num - 1e-9);
    CHECK(m["shared"].num > 0);
    CHECK(st["plan_us"].num > 0);
  }
}

TEST_CASE("plan reports when the planner's work budget ran out (sizes far beyond real windows)") {
  const result small = run("plan --sizes 12,30,0,7 --json");
  REQUIRE(small.code == 0);
  const auto js = testjson::parse(small.out);
  REQUIRE(js.has("budget_exhausted"));
  CHECK_FALSE(js["budget_exhausted"].b);
  CHECK(run("plan --sizes 12,30,0,7").out.find("note") == std::string::npos);
  // 1,000 sizes up to 65,536: every DP bitset is a thousand words, the budget ends the sweep
  std::string line;
  std::vector<int> sizes;
  std::mt19937 gen(1);  // (std::mt19937's sequence is fixed by the standard)
  for (int i = 0; i < 1000; ++i) {
    sizes.push_back(1 + static_cast<int>(gen() % 65536));
    line += (i ? " " : "") + std::to_string(sizes.back());
  }
  const result huge = run("plan --json", line + "\n");
  REQUIRE(huge.code == 0);
  const auto jh = testjson::parse(huge.out);
  CHECK(jh["budget_exhausted"].b);
  check_plan_json(jh, sizes);
  const result text = run("plan", line + "\n");
  REQUIRE(text.code == 0);
  CHECK(text.out.find("note         the planner's work budget ran out") != std::string::npos);
}
