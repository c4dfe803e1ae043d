//! \file cli_run.hpp
//! Runs the greenmim program (GREENMIM_CLI) as a user would, for the CLI tests: arguments as
//! shell text (so "$(printf 'a\nb')" passes an argument holding a newline), optional stdin, and
//! the exit code, stdout and stderr captured.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

namespace clitest {

struct result {
  int code = -1;  //!< exit status, -1 when the program did not exit normally
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

//! Runs `GREENMIM_CLI args` with `stdin_text` on stdin (empty: /dev/null semantics).
inline result run(const std::string& args, const std::string& stdin_text = "") {
  static int counter = 0;
  const std::string base = "/tmp/greenmim_cli_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
  const std::string in = base + ".in", out = base + ".out", err = base + ".err";
  std::ofstream(in) << stdin_text;
  const std::string cmd = std::string(GREENMIM_CLI) + " " + args + " <" + in + " >" + out + " 2>" + err;
  const int st = std::system(cmd.c_str());
  result r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  std::remove(in.c_str());
  std::remove(out.c_str());
  std::remove(err.c_str());
  return r;
}

//! Number of newline characters in `s`.
inline int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

}  // namespace clitest
