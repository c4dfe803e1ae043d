// Findings of test/fuzz/fuzz_cli.cpp, kept as regression tests of the installed program.
#include <doctest/doctest.h>

#include "cli_run.hpp"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

namespace {

using clitest::lines;
using clitest::result;
using clitest::run;
using clitest::slurp;

}  // namespace

TEST_CASE("fuzz regression: an argument holding a newline still gives ONE line on stderr") {
  // Found by fuzz_cli: the error quoted the argument verbatim, so stderr had several lines.
  for (const char* args : {"\"$(printf 'pla\\nn')\"", "plan --sizes \"$(printf '1,x\\n2')\"",
                           "plan \"$(printf -- '--si\\nzes')\" 3", "simulate --model \"$(printf 'a\\rb\\nc')\"",
                           "demo --model \"$(printf 'x\\ny')\""}) {
    CAPTURE(args);
    const result r = run(args);
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK(lines(r.err) == 1);
    CHECK(r.err.back() == '\n');
  }
  CHECK(run("\"$(printf 'pla\\nn')\"").err == "greenmim pla\\x0an: unknown command 'pla\\x0an' (plan, simulate, demo)\n");
}
