// Force-included into every doctest binary (test/CMakeLists.txt): doctest 2.4.9 prints a
// `const char*` in INFO/CAPTURE/CHECK as a pointer ("dtype 0x55c84a51548f"), and its
// DOCTEST_CONFIG_TREAT_CHAR_STAR_AS_STRING does not compile with this version. These
// specializations print the text instead. Comparisons are untouched (CHECK(a == b) on two
// `const char*` still compares pointers; compare std::string where text is meant).
#pragma once
#include <doctest/doctest.h>

namespace doctest {
template <>
struct StringMaker<const char*> {
  static String convert(const char* s) { return s ? String(s) : String("(null)"); }
};
template <>
struct StringMaker<char*> {
  static String convert(const char* s) { return s ? String(s) : String("(null)"); }
};
}  // namespace doctest
