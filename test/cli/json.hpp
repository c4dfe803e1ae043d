// A minimal JSON reader for tests: parses a whole document or fails (no trailing garbage).
#pragma once

#include <cctype>
#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace testjson {

struct value {
  enum kind_t { null_v, bool_v, num_v, str_v, arr_v, obj_v } kind = null_v;
  bool b = false;
  double num = 0;
  std::string str;
  std::vector<value> arr;
  std::map<std::string, value> obj;
  const value& operator[](const std::string& k) const {
    auto it = obj.find(k);
    if (kind != obj_v || it == obj.end()) throw std::runtime_error("missing key " + k);
    return it->second;
  }
  bool has(const std::string& k) const { return kind == obj_v && obj.count(k); }
};

class parser {
 public:
  explicit parser(const std::string& s) : s_(s) {}
  value parse() {
    value v = any();
    ws();
    if (i_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const char* why) { throw std::runtime_error(std::string("json: ") + why + " at " + std::to_string(i_)); }
  void ws() { while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_; }
  bool eat(char c) { ws(); if (i_ < s_.size() && s_[i_] == c) { ++i_; return true; } return false; }
  value any() {
    ws();
    if (i_ >= s_.size()) fail("unexpected end");
    value v;
    const char c = s_[i_];
    if (c == '{') {
      ++i_;
      v.kind = value::obj_v;
      if (eat('}')) return v;
      do {
        ws();
        value k = any();
        if (k.kind != value::str_v) fail("key not a string");
        if (!eat(':')) fail("expected ':'");
        v.obj[k.str] = any();
      } while (eat(','));
      if (!eat('}')) fail("expected '}'");
    } else if (c == '[') {
      ++i_;
      v.kind = value::arr_v;
      if (eat(']')) return v;
      do v.arr.push_back(any()); while (eat(','));
      if (!eat(']')) fail("expected ']'");
    } else if (c == '"') {
      ++i_;
      v.kind = value::str_v;
      while (i_ < s_.size() && s_[i_] != '"') {
        if (s_[i_] == '\\') ++i_;
        v.str.push_back(s_[i_++]);
      }
      if (i_ >= s_.size()) fail("unterminated string");
      ++i_;
    } else if (s_.compare(i_, 4, "true") == 0) { i_ += 4; v.kind = value::bool_v; v.b = true; }
    else if (s_.compare(i_, 5, "false") == 0) { i_ += 5; v.kind = value::bool_v; }
    else if (s_.compare(i_, 4, "null") == 0) { i_ += 4; }
    else {
      char* end = nullptr;
      v.num = std::strtod(s_.c_str() + i_, &end);
      if (end == s_.c_str() + i_) fail("bad value");
      i_ = static_cast<size_t>(end - s_.c_str());
      v.kind = value::num_v;
    }
    return v;
  }
  const std::string& s_;
  size_t i_ = 0;
};

inline value parse(const std::string& s) { return parser(s).parse(); }

}  // namespace testjson
