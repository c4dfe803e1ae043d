// The commands of the greenmim program (tools/cli.cpp dispatches to them). Each takes the
// arguments after its name, writes its result on `out` and throws cli::usage_error on a bad flag
// (cli.cpp turns that into one line on stderr and exit code 2, nothing on stdout).
#pragma once

#include <iosfwd>
#include <string>

#include "cli_main.hpp"

namespace greenmim::cli {

std::string plan_usage();
int cmd_plan(int argc, char** argv, std::istream& in, std::ostream& out, const limits& lim);  // plan.cpp

std::string simulate_usage();
int cmd_simulate(int argc, char** argv, std::ostream& out, const limits& lim);  // simulate.cpp
int simulate_twins(int argc, char** argv, std::ostream& out, const limits& lim);  // simulate_twins.cpp

std::string demo_usage();
//! `greenmim demo` (demo.cpp, built with the CPU reference only): writes through C stdio and
//! returns its exit code itself; with lim.run_demo false it only parses its flags.
int cmd_demo(int argc, char** argv, const limits& lim);

}  // namespace greenmim::cli
