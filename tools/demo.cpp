// `greenmim demo`: its flags, its usage and the command (cmd_demo); the run itself, the CPU
// reference end to end, is demo_run.cpp (why two sources: demo.hpp).
#include <cstdio>
#include <exception>
#include <string>

#include "cli_common.hpp"
#include "cli_main.hpp"
#include "commands.hpp"
#include "demo.hpp"
#include "model_flags.hpp"

namespace greenmim {
namespace demo {

//! Parses the flags after the subcommand. Throws `cli::usage_error` on a bad flag or geometry.
inline options parse(int argc, char** argv, const cli::limits& lim = {}) {
  cli::args a(argc, argv, cli::with_geometry_flags({"--batch", "--seed", "--model", "--reps"}), {"--json"});
  options o;
  o.json = a.has("--json");
  if (a.has("--batch")) o.batch = static_cast<index_t>(cli::parse_int(a.get("--batch"), "--batch", 1, 64));
  if (a.has("--seed")) o.seed = cli::parse_seed(a.get("--seed"));
  if (a.has("--reps")) o.reps = static_cast<int>(cli::parse_int(a.get("--reps"), "--reps", 1, 100));
  if (a.has("--model")) o.model = a.get("--model");
  o.mc = cli::parse_model(a, "swin-b", lim);
  if (o.mc.masking().num_keep() == 0) throw cli::usage_error("--ratio leaves no visible mask unit");
  return o;
}

}  // namespace demo
}  // namespace greenmim

namespace greenmim::cli {

std::string demo_usage() {
  return std::string(
             "usage: greenmim demo [flags]\n"
             "One random masked batch through stages 1-3 of a model on the CPU reference (float): plan,\n"
             "indices, grouped window attention forward and backward for both blocks of each stage,\n"
             "checked against the window-by-window oracle and timed against attention over all tokens.\n"
             "\n"
             "  --model NAME      default swin-b; ") +
         swin_model_names_wrapped(20) + "\n" + geometry_usage() +
         "  --batch N         images, 1..64 (default 8)\n"
         "  --seed N          mask and data seed (default 0)\n"
         "  --reps N          timed runs of each attention, the fastest reported, 1..100 (default 3)\n"
         "  --json            one JSON object on one line\n"
         "  --help            this text\n";
}


//! `greenmim demo [--json] [--batch N (1..64, default 8)] [--seed S] [--reps N] [--model NAME] [--image PX]
//! [--patch PX] [--window P] [--mask-unit PX] [--ratio R]`: `argv` holds the arguments after the
//! subcommand. Returns 0 when every check passes, 1 when a check fails or an internal error occurs
//! (one line on stderr), 2 on a bad flag (one line on stderr, nothing on stdout). Runs in about a
//! second for the defaults (batch 8, Swin-B) on one core. With lim.run_demo false (the fuzzer) it
//! only parses the flags (a bad one throws usage_error).
int cmd_demo(int argc, char** argv, const limits& lim) {
  if (!lim.run_demo) {
    demo::parse(argc, argv, lim);
    return 0;
  }
  demo::options opt;
  try {
    opt = demo::parse(argc, argv, lim);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "greenmim demo: %s\n", one_line(e.what()).c_str());
    return 2;
  }
  try {
    return demo::run(opt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "greenmim demo: error: %s\n", one_line(e.what()).c_str());
    return 1;
  }
}

}  // namespace greenmim::cli
