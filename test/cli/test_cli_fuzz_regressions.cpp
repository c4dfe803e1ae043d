// Findings of test/fuzz/fuzz_cli.cpp, kept as regression tests of the installed program.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

namespace {

struct cli_result {
  int code = -1;
  std::string out, err;
};

std::string read_all(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// `args` is shell text (dash): "$(printf 'a\nb')" passes an argument holding a newline.
cli_result run_cli(const std::string& args) {
  static int counter = 0;
  const std::string base = "/tmp/greenmim_cli_fuzz_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
  const std::string cmd = std::string(GREENMIM_CLI) + " " + args + " </dev/null >" + base + ".out 2>" + base + ".err";
  const int st = std::system(cmd.c_str());
  cli_result r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.out = read_all(base + ".out");
  r.err = read_all(base + ".err");
  std::remove((base + ".out").c_str());
  std::remove((base + ".err").c_str());
  return r;
}

int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

}  // namespace

TEST_CASE("fuzz regression: an argument holding a newline still gives ONE line on stderr") {
  // Found by fuzz_cli: the error quoted the argument verbatim, so stderr had several lines.
  for (const char* args : {"\"$(printf 'pla\\nn')\"", "plan --sizes \"$(printf '1,x\\n2')\"",
                           "plan \"$(printf -- '--si\\nzes')\" 3", "simulate --model \"$(printf 'a\\rb\\nc')\"",
                           "demo --model \"$(printf 'x\\ny')\""}) {
    CAPTURE(args);
    const cli_result r = run_cli(args);
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK(count_lines(r.err) == 1);
    CHECK(r.err.back() == '\n');
  }
  CHECK(run_cli("\"$(printf 'pla\\nn')\"").err == "greenmim pla\\x0an: unknown command 'pla\\x0an' (plan, simulate, demo)\n");
}
