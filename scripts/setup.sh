#!/usr/bin/env bash
# Shared set-up of scripts/demo and scripts/test: install missing Debian packages (apt-get, when
# run as root), configure and build into build/. Sourced, not run.
#   GM_SETUP=demo  only what `greenmim demo` needs: cmake, a C++ compiler, Eigen; builds the CLI alone
#   GM_SETUP=test  (default) everything: doctest, Google Benchmark, clang + libFuzzer; builds all
set -euo pipefail
GM_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$GM_ROOT"

setup_mode="${GM_SETUP:-test}"
missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
command -v ninja >/dev/null 2>&1 || missing+=(ninja-build)
[ -f /usr/include/eigen3/Eigen/Dense ] || missing+=(libeigen3-dev)
if [ "$setup_mode" != demo ]; then
  [ -f /usr/include/doctest/doctest.h ] || missing+=(doctest-dev)
  [ -f /usr/include/benchmark/benchmark.h ] || missing+=(libbenchmark-dev)
  # clang + libFuzzer for scripts/sanitize and scripts/fuzz (test/fuzz)
  command -v clang++ >/dev/null 2>&1 || missing+=(clang)
  compgen -G "/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a" >/dev/null || missing+=(libclang-rt-dev)
fi
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "setup: missing packages: ${missing[*]}; install them with: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi

generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
jobs="$(nproc 2>/dev/null || echo 2)"
# GM_HOST_TESTS (scripts/test): ON or OFF, GREENMIM_HOST_TESTS for this build (OFF when the
# sanitizer pass builds and runs the host-only test binaries instead); unset: left as configured.
host_tests=()
[ -n "${GM_HOST_TESTS:-}" ] && host_tests=(-DGREENMIM_HOST_TESTS="$GM_HOST_TESTS")
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release ${host_tests[@]+"${host_tests[@]}"} ${GREENMIM_CMAKE_ARGS:-}
elif [ "$setup_mode" != demo ]; then
  # picks up packages installed since (a build configured by scripts/demo)
  cmake -S . -B build ${host_tests[@]+"${host_tests[@]}"} >/dev/null
fi
# The PyTorch package's tests (scripts/test sets GM_WITH_PYTHON=1): a virtual environment with the
# pinned torch, timm and pytest (scripts/python_env.sh; installed once, reused after), handed to
# ctest's python_tests_* entries. GM_WITH_PYTHON=0 (or a failed install) leaves them skipped.
if [ "${GM_WITH_PYTHON:-0}" = 1 ]; then
  if gm_python="$("$GM_ROOT/scripts/python_env.sh")"; then
    cmake -S . -B build -DGREENMIM_PYTHON_EXECUTABLE="$gm_python" >/dev/null
  else
    echo "setup: no Python environment for the package tests; the python_tests_* ctest entries will be skipped" >&2
  fi
fi
if [ "$setup_mode" = demo ]; then
  cmake --build build -j "$jobs" --target greenmim_tool
else
  cmake --build build -j "$jobs"
fi
