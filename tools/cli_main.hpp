// The greenmim program as a function: what main() runs, with argv, stdin and the output streams
// passed in, so that tests and the fuzzer (test/fuzz/fuzz_cli.cpp) drive it in-process.
#pragma once

#include <cstdint>
#include <iosfwd>

namespace greenmim::cli {

//! Work bounds of one invocation. The defaults are the program's; the fuzzer lowers them so that
//! no input runs for more than a fraction of a second (a user may legitimately ask for
//! `simulate --masks 100000`, minutes of work, so the program itself keeps the wide ranges).
struct limits {
  std::int64_t max_masks = 100000;  //!< simulate --masks upper bound
  std::int64_t max_batch = 4096;    //!< simulate --per-sample --batch upper bound
  std::int64_t max_total = std::int64_t{1} << 28;  //!< plan, simulate: largest sum of sizes (visible tokens of a stage) planned (the planner's own limit)
  std::int64_t max_grid = 2048;     //!< --image/--patch: largest stage-1 grid side in tokens (8192 px at patch 4)
  bool write_files = true;          //!< false: simulate --curve writes to /dev/null instead
  bool run_demo = true;             //!< false: demo parses its flags and stops (exit 0)
};

//! Runs `greenmim argv[1] ...`: writes the result on `out`, a failure as one line on `err` (and
//! nothing on `out`); returns the exit code (0 success, 2 usage error, 1 internal error). `demo`
//! writes through C stdio (stdout/stderr), as the program always did.
int run(int argc, char** argv, std::istream& in, std::ostream& out, std::ostream& err, const limits& lim = {});

}  // namespace greenmim::cli
