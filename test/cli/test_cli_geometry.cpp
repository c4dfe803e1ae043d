// The program's answers (help, version, closest flag) and its geometry flags: --model presets
// (SimMIM's 192 px / window 6, Swin V2's shapes), --image/--patch/--window/--mask-unit/--ratio on
// plan, simulate and demo, refusals in one line, the small-stage rule and the attention path said
// in the output; simulate's output for the old models unchanged.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>
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

//! The repository root, from this file's path (test/cli/...).
std::string source_root() {
  std::string f = __FILE__;
  for (int i = 0; i < 3; ++i) f = f.substr(0, f.find_last_of('/'));
  return f;
}

//! Exit 2, one line on stderr holding `needle`, nothing on stdout.
void check_refused(const std::string& args, const std::string& needle) {
  const result r = run(args);
  INFO(args << " -> " << r.err);
  CHECK(r.code == 2);
  CHECK(r.out.empty());
  CHECK(lines(r.err) == 1);
  CHECK(r.err.find(needle) != std::string::npos);
}

}  // namespace

TEST_CASE("help: greenmim --help, help CMD and CMD --help print the usage on stdout, exit 0") {
  for (const char* args : {"--help", "-h", "help"}) {
    const result r = run(args);
    CHECK(r.code == 0);
    CHECK(r.err.empty());
    CHECK(r.out.rfind("usage: greenmim <command>", 0) == 0);
  }
  for (const char* cmd : {"plan", "simulate", "demo"}) {
    const std::string head = std::string("usage: greenmim ") + cmd;
    const result a = run(std::string("help ") + cmd), b = run(std::string(cmd) + " --help"),
                     c = run(std::string(cmd) + " --json -h");
    for (const result* r : {&a, &b, &c}) {
      CHECK(r->code == 0);
      CHECK(r->err.empty());
      CHECK(r->out.rfind(head, 0) == 0);
      CHECK(r->out == a.out);
    }
    CHECK(a.out.find("--help") != std::string::npos);
  }
  // the report: simulate --help answered "unknown flag '--help'" with exit 2
  CHECK(run("simulate --model swin-b --help").code == 0);
  check_refused("help frobnicate", "unknown command 'frobnicate'");
  check_refused("help plan simulate", "one command");
  const result v = run("--version");
  CHECK(v.code == 0);
  CHECK(std::regex_match(v.out, std::regex("greenmim [0-9]+\\.[0-9]+\\.[0-9]+\n")));
}

TEST_CASE("the README's CLI section lists every flag of every command's usage, with its default") {
  const std::string readme = slurp(source_root() + "/README.md");
  REQUIRE(!readme.empty());
  const std::regex flag("--[a-z][a-z-]*");
  for (const char* cmd : {"plan", "simulate", "demo"}) {
    const std::string usage = run(std::string("help ") + cmd).out;
    std::set<std::string> flags;
    for (std::sregex_iterator it(usage.begin(), usage.end(), flag), end; it != end; ++it) flags.insert(it->str());
    CHECK(flags.size() >= 9);
    for (const auto& f : flags) {
      INFO(cmd << " " << f);
      CHECK(readme.find(f) != std::string::npos);
    }
  }
  // the usage texts are in the README verbatim
  CHECK(readme.find(run("help simulate").out) != std::string::npos);
  CHECK(readme.find(run("help plan").out) != std::string::npos);
  CHECK(readme.find(run("help demo").out) != std::string::npos);
}

TEST_CASE("an unknown flag exits 2 in one line naming the closest valid flag") {
  check_refused("simulate --windw 6", "unknown flag '--windw' (did you mean '--window'?)");
  check_refused("simulate --mask_unit 32", "(did you mean '--mask-unit'?)");
  check_refused("plan --sizs 3", "(did you mean '--sizes'?)");
  check_refused("plan --jsn --sizes 3", "(did you mean '--json'?)");
  check_refused("demo --bach 2", "(did you mean '--batch'?)");
  check_refused("demo --rep 2", "(did you mean '--reps'?)");
  check_refused("simulate --hepl", "(did you mean '--help'?)");
  check_refused("plan sizes 3", "unexpected argument 'sizes' (did you mean '--sizes'?)");
  check_refused("simulat", "unknown command 'simulat' (did you mean 'simulate'?)");
  check_refused("simulate --model swin-b-192", "did you mean 'swin-b-192w6'?");
  const result far = run("simulate --zzzzzzzz 1");
  CHECK(far.code == 2);
  CHECK(far.err.find("did you mean") == std::string::npos);
}

TEST_CASE("geometries that do not work are refused with one clear line, on every command") {
  for (const char* cmd : {"simulate --masks 1", "plan", "demo"}) {
    const std::string c = cmd;
    check_refused(c + " --image 200", "image 200 px is not a multiple of patch x 2^3 = 32 px");
    check_refused(c + " --mask-unit 24", "mask unit 24 px is not a multiple of the largest patch stride, patch x 8 = 32 px");
    check_refused(c + " --image 224 --mask-unit 64", "image 224 px is not a multiple of the mask unit 64 px");
    check_refused(c + " --window 5", "stage 1 grid 56 is not a multiple of window 5");
    check_refused(c + " --patch 3", "patch x 2^3 = 24 px");
    check_refused(c + " --image 0", "--image: 0 is outside");
    check_refused(c + " --window abc", "--window: not an integer");
    check_refused(c + " --ratio 1", "no visible mask unit");
    check_refused(c + " --model swinv2_base_window8_256 --image 224", "stage 2 grid 28 is not a multiple of window 8");
  }
  check_refused("plan --sizes 3 --model swin-b", "--sizes excludes --model");
  check_refused("simulate --model twins-l --image 256", "--image applies to the Swin models only");
  check_refused("plan --model swin-b --stage 5", "--stage: 5 is outside [1, 4]");
  check_refused("simulate --model swin-b-192w6 --shift 6 --masks 1", "--shift: 6 is outside [0, 5]");
}

TEST_CASE("simulate: the new presets, their windows, visible tokens and the small-stage rule") {
  struct want {
    const char* model;
    int grid[3], windows[3], window[3], visible[3];
  };
  const want cases[] = {
      {"swin-b-192w6", {48, 24, 12}, {64, 16, 4}, {6, 6, 6}, {576, 144, 36}},
      {"swin-l-192w6", {48, 24, 12}, {64, 16, 4}, {6, 6, 6}, {576, 144, 36}},
      {"swinv2_base_window8_256", {64, 32, 16}, {64, 16, 4}, {8, 8, 8}, {1024, 256, 64}},
      {"swinv2_base_window16_256", {64, 32, 16}, {16, 4, 1}, {16, 16, 16}, {1024, 256, 64}},
      {"swinv2_large_window12_192", {48, 24, 12}, {16, 4, 1}, {12, 12, 12}, {576, 144, 36}},
  };
  for (const want& w : cases) {
    INFO(w.model);
    const result r = run(std::string("simulate --masks 3 --json --model ") + w.model);
    REQUIRE(r.code == 0);
    CHECK(lines(r.out) == 1);
    const auto j = testjson::parse(r.out);
    CHECK(j["model"].str == w.model);
    REQUIRE(j["stages"].arr.size() == 3);
    for (int s = 0; s < 3; ++s) {
      const auto& st = j["stages"].arr[s];
      CHECK(st["grid"].num == w.grid[s]);
      CHECK(st["windows"].num == w.windows[s]);
      CHECK(st["window"].num == w.window[s]);
      CHECK(st["visible_tokens"].num == w.visible[s]);
      CHECK(st["cuda"].str == "accepted");
      CHECK(st["max_group_size"].num <= 1024);
      const auto& m = st["mflops"];
      CHECK(m["lower_bound"].num <= m["fast"].num + 1e-9);
      CHECK(m["fast"].num <= m["paper"].num + 1e-9);
    }
  }
  // SimMIM's baseline, every token in full windows: Swin-B stage 1 at 224 is 64 windows of 49
  const auto jb = testjson::parse(run("simulate --masks 1 --json").out);
  CHECK(jb["stages"].arr[0]["mflops"]["all_tokens"].num == doctest::Approx(64 * (4.0 * 49 * 128 * 128 + 2.0 * 49 * 49 * 128) / 1e6));
  // 256 / window 16, shifted: stage 3 (grid 16 = window) is one window and not shifted, said so
  const result v16 = run("simulate --model swinv2_base_window16_256 --masks 2 --shift 8");
  REQUIRE(v16.code == 0);
  CHECK(v16.out.find("note: stage 3: grid 16 = window 16: one window, no shift (Swin/timm small-stage rule)") !=
        std::string::npos);
  CHECK(v16.out.find("stage 3: grid 16, C 512, 1 windows, 64 visible tokens (window 16, shift 0: small-stage rule)") !=
        std::string::npos);
  const auto j16 = testjson::parse(run("simulate --model swinv2_base_window16_256 --masks 2 --shift 8 --json").out);
  CHECK(j16["stages"].arr[1]["shift"].num == 8);
  CHECK(j16["stages"].arr[2]["shift"].num == 0);
  // a window above the stage grid: window = grid
  const result big = run("simulate --image 384 --window 48 --masks 1");
  REQUIRE(big.code == 0);
  CHECK(big.out.find("note: stage 3: grid 24 < window 48: one 24x24 window, no shift") != std::string::npos);
  CHECK(big.out.find("CUDA kernels refuse it (window 48 > GM_MAX_WINDOW 32): the CPU reference runs it") !=
        std::string::npos);
  // stage 4 is simulated when it has more than one window
  const auto j448 = testjson::parse(run("simulate --image 448 --masks 1 --json").out);
  CHECK(j448["stages"].arr.size() == 4);
  CHECK(j448["image"].num == 448);
}

TEST_CASE("simulate: the old models' output is unchanged (docs/figures/simulate_swin_b.txt)") {
  const result r = run("simulate --model swin-b --masks 100 --seed 0");
  REQUIRE(r.code == 0);
  auto strip = [](const std::string& s) {  // the timing lines vary
    std::istringstream is(s);
    std::string line, out;
    while (std::getline(is, line))
      if (line.find("plans in") == std::string::npos) out += line + "\n";
    return out;
  };
  CHECK(strip(r.out) == strip(slurp(source_root() + "/docs/figures/simulate_swin_b.txt")));
}

TEST_CASE("plan --model: one random mask's windows on a stage, the path that can run it") {
  const result r = run("plan --model swin-b-192w6 --json");
  REQUIRE(r.code == 0);
  const auto j = testjson::parse(r.out);
  CHECK(j["model"].str == "swin-b-192w6");
  CHECK(j["grid"].num == 48);
  CHECK(j["window"].num == 6);
  CHECK(j["visible_tokens"].num == 576);
  CHECK(j["sizes"].arr.size() == 64);
  double total = 0;
  for (const auto& s : j["sizes"].arr) total += s.num;
  CHECK(total == 576);
  CHECK(j["cuda"].str == "accepted");
  const result text = run("plan --model swinv2_base_window16_256 --stage 4 --shifted");
  REQUIRE(text.code == 0);
  CHECK(text.out.find("note         stage 4: grid 8 < window 16: one 8x8 window, no shift") != std::string::npos);
  CHECK(text.out.find("attention    CUDA kernels accept it (window 8 <= 32, G 16 <= 1024, head_dim 32)") !=
        std::string::npos);
  const auto w48 = testjson::parse(run("plan --image 384 --window 48 --json").out);
  CHECK(w48["cuda"].str == "window 48 > GM_MAX_WINDOW 32");
  // a group above GM_SIMT_MAX_GROUP: refused by the kernels, said so
  const auto g2048 = testjson::parse(run("plan --image 512 --window 32 --ratio 0 --group-size 2048 --json").out);
  CHECK(g2048["group_size"].num == 2048);
  CHECK(g2048["cuda"].str == "group size 2048 > GM_SIMT_MAX_GROUP 1024");
  // the channels follow the stage
  CHECK(testjson::parse(run("plan --model swin-l-192w6 --stage 3 --json").out)["cost"].num > 0);
}

TEST_CASE("demo: SimMIM's 192/w6 and V2's window 16 run and pass their checks; the path is named") {
  // One run a model (the window-16 demo is most of this binary's time under ASan): JSON for
  // 192/w6, text for window 16, which prints the same verdicts a stage.
  const result r = run("demo --batch 1 --json --model swin-b-192w6");
  REQUIRE(r.code == 0);
  const auto j = testjson::parse(r.out);
  CHECK(j["ok"].b);
  CHECK(j["stages"].arr.size() == 3);
  for (const auto& st : j["stages"].arr) {
    CHECK(st["cuda"].str == "accepted");
    CHECK(st["path"].str == "cpu reference");
  }
  CHECK(j["reps"].num == 3);
  // one timed run (--reps 1): the CPU reference over all tokens at window 16 is slow under ASan
  const result t = run("demo --batch 1 --reps 1 --model swinv2_base_window16_256");
  REQUIRE(t.code == 0);
  const auto count = [&](const std::string& needle) {
    std::size_t n = 0;
    for (std::size_t at = t.out.find(needle); at != std::string::npos; at = t.out.find(needle, at + 1)) ++n;
    return n;
  };
  CHECK(count("attention path: CUDA kernels accept it (window 16 <= 32") == 3);
  CHECK(count("this run: the CPU reference") == 3);
  CHECK(count("  [ok]") == 3);
  CHECK(t.out.find("note: stage 3: grid 16 = window 16: one window, no shift") != std::string::npos);
  CHECK(t.out.find("all checks passed") != std::string::npos);
}
