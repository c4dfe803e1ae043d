// doctest's main. DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN comes from test/CMakeLists.txt: the
// force-included doctest_strings.hpp includes doctest before this file's first line.
#include <doctest/doctest.h>
