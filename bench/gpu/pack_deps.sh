#!/usr/bin/env bash
# Packs the header-only Debian dependencies the GPU tests need (Eigen 3.4 from libeigen3-dev,
# doctest from doctest-dev) into .gpu-deps/, for a GPU machine that cannot install packages
# (the device machine reaches no package registry). Copies this machine's installed package
# files, paths kept (.gpu-deps/usr/...), so their CMake package configs work relocated.
# .gpu-deps/ is git-ignored; carry it to the GPU machine and point CMAKE_PREFIX_PATH at
# .gpu-deps/usr (bench/gpu/run.sh does that when the folder exists).
#
# Usage (repository root):  bench/gpu/pack_deps.sh    then e.g. device run with carry [".gpu-deps"]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEST="$ROOT/.gpu-deps"
PKGS="libeigen3-dev doctest-dev"
for p in $PKGS; do
  if ! dpkg -s "$p" >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then apt-get install -y --no-install-recommends "$p" >/dev/null; else
      echo "pack_deps: $p is not installed (apt-get install $p)" >&2; exit 1; fi
  fi
done
rm -rf "$DEST"
mkdir -p "$DEST"
n=0
for p in $PKGS; do
  while IFS= read -r f; do
    case "$f" in /usr/share/doc/*|/usr/share/man/*) continue ;; esac
    if [ -f "$f" ]; then
      mkdir -p "$DEST$(dirname "$f")"
      cp -p "$f" "$DEST$f"
      n=$((n + 1))
    fi
  done < <(dpkg -L "$p")
done
# Debian's doctest config pins its prefix to /usr: make it relative to its own location
# (<prefix>/lib/cmake/doctest/doctestTargets.cmake)
t="$DEST/usr/lib/cmake/doctest/doctestTargets.cmake"
if [ -f "$t" ]; then
  sed -i 's|^set(_IMPORT_PREFIX "/usr")$|get_filename_component(_IMPORT_PREFIX "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)|' "$t"
  grep -q 'CMAKE_CURRENT_LIST_DIR}/../../..' "$t" || { echo "pack_deps: could not relocate $t" >&2; exit 1; }
fi
echo "pack_deps: $n files ($(du -sh "$DEST" | cut -f1)) in $DEST"
