// libFuzzer target: the greenmim program (tools/cli.cpp and its commands) in-process, through
// greenmim::cli::run with arbitrary argument vectors and stdin.
// Input: arguments separated by '\0', then optionally a 0xFF byte and the stdin text.
// Invariants: exit code 0 or 2 (1 = an internal error, a finding); on failure exactly one line on
// stderr and nothing on stdout; on success nothing on stderr, and with --json exactly one JSON
// document on one line. Work per input is bounded by cli::limits (--masks <= 2, --batch <= 8,
// plan sizes summing to <= 2000, --curve written to /dev/null, demo parses its flags only): the
// program's own ranges allow minutes of legitimate work, so the fuzzer, not the program, bounds it.
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "../cli/json.hpp"
#include "cli_main.hpp"
#include "fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, size_t size) {
  const std::string raw(reinterpret_cast<const char*>(data), size);
  const size_t sep = raw.find('\xff');
  const std::string arg_text = raw.substr(0, sep);
  const std::string stdin_text = sep == std::string::npos ? std::string() : raw.substr(sep + 1);

  std::vector<std::string> args{"greenmim"};
  if (!arg_text.empty()) {
    size_t b = 0;
    for (;;) {
      const size_t e = arg_text.find('\0', b);
      args.push_back(arg_text.substr(b, e == std::string::npos ? std::string::npos : e - b));
      if (e == std::string::npos) break;
      b = e + 1;
    }
  }
  if (args.size() > 64) return -1;  // not interesting: the parser is linear in argc
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  greenmim::cli::limits lim;
  lim.max_masks = 2;
  lim.max_batch = 8;
  lim.max_total = 2000;
  lim.write_files = false;
  lim.run_demo = false;
  std::istringstream in(stdin_text);
  std::ostringstream out, err;
  const int rc = greenmim::cli::run(static_cast<int>(args.size()), argv.data(), in, out, err, lim);
  const std::string o = out.str(), e = err.str();
  auto lines = [](const std::string& s) {
    size_t n = 0;
    for (char c : s) n += c == '\n';
    return n;
  };
  GM_FUZZ_CHECK(rc == 0 || rc == 2, "exit code %d, stderr: %s", rc, e.c_str());
  if (rc != 0) {
    GM_FUZZ_CHECK(o.empty(), "a failure printed on stdout: %s", o.c_str());
    GM_FUZZ_CHECK(lines(e) == 1 && e.back() == '\n', "stderr is not one line: '%s'", e.c_str());
    GM_FUZZ_CHECK(e.rfind("greenmim", 0) == 0, "stderr does not start with the program's name: %s", e.c_str());
    return 0;
  }
  GM_FUZZ_CHECK(e.empty(), "success printed on stderr: %s", e.c_str());
  const std::string& cmd = args.size() > 1 ? args[1] : std::string();
  if (cmd != "demo") GM_FUZZ_CHECK(!o.empty() && o.back() == '\n', "empty or unterminated output");
  bool json = false;
  for (size_t i = 2; i < args.size(); ++i) json |= args[i] == "--json";
  if (json && (cmd == "plan" || cmd == "simulate") && o[0] == '{') {  // "--json" may be another flag's value
    GM_FUZZ_CHECK(lines(o) == 1, "--json printed %zu lines", lines(o));
    try {
      (void)testjson::parse(o.substr(0, o.size() - 1));
    } catch (const std::exception& ex) {
      GM_FUZZ_CHECK(false, "--json output does not parse (%s): %s", ex.what(), o.c_str());
    }
  }
  return 0;
}
