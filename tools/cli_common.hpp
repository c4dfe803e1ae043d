// Shared helpers of the greenmim command-line program: strict number parsing, usage errors,
// a minimal JSON writer. Every user error throws `usage_error`, which main() turns into one line
// on stderr and exit code 2 (nothing is printed on stdout before the command has succeeded).
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace greenmim::cli {

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline std::int64_t parse_int(const std::string& s, const char* what, std::int64_t lo, std::int64_t hi) {
  if (s.empty()) throw usage_error(std::string(what) + ": empty value");
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (end == s.c_str() || *end != '\0' || errno == ERANGE)
    throw usage_error(std::string(what) + ": not an integer: '" + s + "'");
  if (v < lo || v > hi)
    throw usage_error(std::string(what) + ": " + s + " is outside [" + std::to_string(lo) + ", " +
                      std::to_string(hi) + "]");
  return v;
}

inline std::uint64_t parse_seed(const std::string& s) {
  if (s.empty() || s[0] == '-') throw usage_error("--seed: expected a non-negative integer, got '" + s + "'");
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (end == s.c_str() || *end != '\0' || errno == ERANGE)
    throw usage_error("--seed: not a non-negative integer: '" + s + "'");
  return v;
}

inline double parse_double(const std::string& s, const char* what, double lo, double hi) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end == s.c_str() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
    throw usage_error(std::string(what) + ": not a number: '" + s + "'");
  if (v < lo || v > hi) throw usage_error(std::string(what) + ": " + s + " is out of range");
  return v;
}

//! Comma- or whitespace-separated list of integers in [lo, hi].
inline std::vector<std::int64_t> parse_int_list(const std::string& s, const char* what, std::int64_t lo,
                                                std::int64_t hi) {
  std::vector<std::int64_t> out;
  std::string tok;
  auto flush = [&] {
    if (!tok.empty()) out.push_back(parse_int(tok, what, lo, hi));
    tok.clear();
  };
  for (char ch : s) {
    if (ch == ',' || ch == ' ' || ch == '\t' || ch == '\r' || ch == '\n') {
      if (ch == ',' && tok.empty()) throw usage_error(std::string(what) + ": empty entry in '" + s + "'");
      flush();
    } else {
      tok.push_back(ch);
    }
  }
  flush();
  return out;
}

//! Levenshtein distance between a and b (insertions, deletions, substitutions). O(|a| |b|).
inline std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

//! The candidate closest to `word` by edit distance when it is close enough to be a typo (at
//! most 2 edits, and fewer than half of the word's length; no control character); empty
//! otherwise. The first one wins ties.
inline std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  if (word.size() > 64) return {};  // O(|a| |b|): a long argument is no typo of a flag
  for (unsigned char c : word)
    if (c < 0x20 || c == 0x7f) return {};  // nor is one holding a control character
  std::string best;
  std::size_t best_d = 3;
  for (const auto& c : candidates) {
    const std::size_t d = edit_distance(word, c);
    if (d < best_d && 2 * d < std::max(word.size(), c.size())) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

//! " (did you mean 'X'?)" for the closest candidate, or "".
inline std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string c = closest(word, candidates);
  return c.empty() ? std::string() : " (did you mean '" + c + "'?)";
}

//! Flag parser: `--name value` and `--name=value`; boolean flags take no value. An unknown flag
//! is refused naming the closest valid one (edit distance), when there is one.
class args {
 public:
  args(int argc, char** argv, std::vector<std::string> valued, std::vector<std::string> booleans)
      : valued_(std::move(valued)), booleans_(std::move(booleans)) {
    for (int i = 0; i < argc; ++i) {
      std::string a = argv[i];
      if (a.rfind("--", 0) != 0)
        throw usage_error("unexpected argument '" + a + "'" +
                          (a.empty() || a[0] == '-' ? did_you_mean(a, flags()) : did_you_mean("--" + a, flags())));
      std::string name = a, value;
      bool has_value = false;
      if (auto eq = a.find('='); eq != std::string::npos) {
        name = a.substr(0, eq);
        value = a.substr(eq + 1);
        has_value = true;
      }
      if (contains(booleans_, name)) {
        if (has_value) throw usage_error(name + " takes no value");
        set(name, "1");
      } else if (contains(valued_, name)) {
        if (!has_value) {
          if (i + 1 >= argc) throw usage_error(name + " needs a value");
          value = argv[++i];
        }
        set(name, value);
      } else {
        throw usage_error("unknown flag '" + name + "'" + did_you_mean(name, flags()));
      }
    }
  }
  bool has(const std::string& n) const {
    for (auto& kv : kv_)
      if (kv.first == n) return true;
    return false;
  }
  std::string get(const std::string& n, const std::string& dflt = {}) const {
    for (auto& kv : kv_)
      if (kv.first == n) return kv.second;
    return dflt;
  }

  //! Every flag this parser accepts, valued then boolean, and --help (answered by cli::run).
  std::vector<std::string> flags() const {
    std::vector<std::string> all = valued_;
    all.insert(all.end(), booleans_.begin(), booleans_.end());
    all.push_back("--help");
    return all;
  }

 private:
  static bool contains(const std::vector<std::string>& v, const std::string& s) {
    for (auto& x : v)
      if (x == s) return true;
    return false;
  }
  void set(const std::string& n, const std::string& v) {
    if (has(n)) throw usage_error(n + " given twice");
    kv_.emplace_back(n, v);
  }
  std::vector<std::string> valued_, booleans_;
  std::vector<std::pair<std::string, std::string>> kv_;
};

//! `s` with every control character written as \xNN: an error quotes user text (an argument may
//! hold a newline), and the program's contract is ONE line on stderr.
inline std::string one_line(const std::string& s) {
  std::string r;
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      r += buf;
    } else {
      r += static_cast<char>(c);
    }
  }
  return r;
}

//! Formats a double for JSON (finite; shortest round-trippable-ish with 17 significant digits
//! trimmed to 10 for readability of MFLOPs).
inline std::string num(double v, int prec = 10) {
  if (!std::isfinite(v)) return "null";
  std::ostringstream os;
  os.precision(prec);
  os << v;
  return os.str();
}

}  // namespace greenmim::cli
