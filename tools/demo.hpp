// `greenmim demo`'s flags and its run, declared for the two sources that make the command:
// demo.cpp (the flags, the usage, cmd_demo) and demo_run.cpp (the CPU reference end to end). They
// are two translation units so that the fuzzer (test/fuzz) instruments the flag parsing it drives
// and links the run, which it never calls (cli::limits::run_demo), without coverage
// instrumentation: the greenmim program and fuzz_cli then share one build of each (tools/CMakeLists.txt).
#pragma once

#include <greenmim/config.hpp>

#include <cstdint>
#include <string>

#include "model_flags.hpp"

namespace greenmim {
namespace demo {

//! Parsed flags of `greenmim demo`.
struct options {
  bool json = false;
  index_t batch = 8;
  std::uint64_t seed = 0;
  int reps = 3;  //!< timed runs of each attention (forward, backward); the fastest is reported
  std::string model = "swin-b";
  cli::model_choice mc;  //!< the validated model shape (geometry flags applied) and mask ratio
};

//! Runs the demo (demo_run.cpp): prints its report on stdout, returns 0 when every check passes
//! and 1 when one fails; throws on an internal error.
int run(const options& opt);

}  // namespace demo
}  // namespace greenmim
