// greenmim: the command-line program. Subcommands: plan (plan.cpp), simulate (simulate.cpp,
// simulate_twins.cpp), demo (demo.cpp). Every user error: exit code 2 and one line on stderr,
// nothing on stdout.
#include <greenmim/config.hpp>

#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "cli_common.hpp"
#include "cli_main.hpp"
#include "commands.hpp"

using greenmim::cli::usage_error;

namespace greenmim::cli {
namespace {

const char* kUsage =
    "usage: greenmim <command> [flags]\n"
    "\n"
    "commands:\n"
    "  plan      group windows: --sizes 12,30,0,7 (or sizes on stdin; one list per line = a batch),\n"
    "            or the windows of a random mask on a model's stage: --model NAME [--stage 1]\n"
    "  simulate  the paper's grouping table: attention cost per stage over random masks (--model NAME)\n"
    "  demo      plan, index, run grouped window attention fwd+bwd on the CPU, check and time it\n"
    "  help CMD  the flags of CMD with their defaults (also: greenmim CMD --help)\n"
    "\n"
    "models: swin-b swin-l swin-b-w14 swin-l-w14 swin-b-192w6 swin-l-192w6 swinv2_base_window8_256\n"
    "        swinv2_base_window16_256 swinv2_large_window12_192 (simulate also: twins-b twins-l);\n"
    "        any geometry on top: --image PX --patch PX --window P --mask-unit PX --ratio R\n"
    "\n"
    "greenmim --version prints the version. A bad flag: exit 2, one line on stderr.\n";

//! The usage of `cmd`, or "" for an unknown command.
std::string usage_of(const std::string& cmd) {
  if (cmd == "plan") return plan_usage();
  if (cmd == "simulate") return simulate_usage();
  if (cmd == "demo") return demo_usage();
  if (cmd == "help") return "usage: greenmim help [plan | simulate | demo]\n";
  return {};
}

const std::vector<std::string> kCommands = {"plan", "simulate", "demo", "help", "--help", "--version"};

}  // namespace

int run(int argc, char** argv, std::istream& in, std::ostream& out, std::ostream& err, const limits& lim) {
  if (argc < 2) {
    err << "greenmim: missing command (plan, simulate, demo); see greenmim --help\n";
    return 2;
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "--help" || cmd == "-h") {
      out << kUsage;
      return 0;
    }
    if (cmd == "help") {  // greenmim help [CMD]
      if (argc == 2) {
        out << kUsage;
        return 0;
      }
      if (argc > 3) throw usage_error("takes one command: greenmim help [plan | simulate | demo]");
      const std::string topic = argv[2];
      const std::string u = usage_of(topic);
      if (u.empty())
        throw usage_error("unknown command '" + topic + "'" + did_you_mean(topic, {"plan", "simulate", "demo"}) +
                          " (plan, simulate, demo)");
      out << u;
      return 0;
    }
    if (cmd == "plan" || cmd == "simulate" || cmd == "demo") {  // greenmim CMD ... --help ...
      for (int i = 2; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--help" || arg == "-h") {
          out << usage_of(cmd);
          return 0;
        }
      }
    }
    if (cmd == "--version") {
      out << "greenmim " << GREENMIM_VERSION_MAJOR << "." << GREENMIM_VERSION_MINOR << "." << GREENMIM_VERSION_PATCH << "\n";
      return 0;
    }
    if (cmd == "plan") return cmd_plan(argc - 2, argv + 2, in, out, lim);
    if (cmd == "simulate") return cmd_simulate(argc - 2, argv + 2, out, lim);
    if (cmd == "demo") {
#if defined(GREENMIM_HAVE_DEMO)
      return cmd_demo(argc - 2, argv + 2, lim);
#else
      throw usage_error("demo needs the CPU reference (Eigen); rebuild with libeigen3-dev installed");
#endif
    }
    throw usage_error("unknown command '" + cmd + "'" + did_you_mean(cmd, kCommands) + " (plan, simulate, demo)");
  } catch (const usage_error& e) {
    err << "greenmim " << one_line(cmd) << ": " << one_line(e.what()) << "\n";
    return 2;
  } catch (const std::exception& e) {
    err << "greenmim " << one_line(cmd) << ": error: " << one_line(e.what()) << "\n";
    return 1;
  }
}

}  // namespace greenmim::cli
