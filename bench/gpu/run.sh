#!/usr/bin/env bash
# One script for a GPU machine (H100 / H200): configure + build with CUDA, run the GPU tests,
# the GPU benchmark (Swin-B stages 1-3, batch 128, bf16), when PyTorch imports the PyTorch
# baselines (released-code path and FlexAttention) on the same partitions, and last
# compute-sanitizer (memcheck, racecheck, synccheck, initcheck) on a small test subset.
#
# Usage (from anywhere):  bench/gpu/run.sh
# Environment:
#   OUT=<dir>        raw logs go there (else to a fresh folder); a copy always goes to
#                    docs/perf/<device>_<date>/
#   BUILD_DIR=<dir>  build folder (default build-gpu)
#   JOBS=<n>         build parallelism (default: nproc)
#   BATCH=<n>        benchmark batch (default 128)
#   SKIP_TESTS=1 SKIP_SANITIZER=1 SKIP_BENCH=1 SKIP_TORCH=1   skip a step
#   STEP_TIMEOUT=<s> time limit of each step (default 900)
#   SAN_TIMEOUT=<s>  time limit of each compute-sanitizer tool (default 100)
#   BUDGET=<s>       time for the whole script (default 560: a device call is cut at 600 s); a step
#                    gets at most what is left, and a step that cannot start in time is reported
#                    as SKIPPED (budget), so the logs and the summary always come back
# Dependencies: CUDA (nvcc), CMake, a C++17 compiler, and the header-only Eigen 3.4 and doctest.
# A GPU machine that cannot install packages gets the last two from .gpu-deps/ (made here by
# bench/gpu/pack_deps.sh from this machine's Debian packages; carry it along).
# Exit status: 0 when every step that ran passed, 1 otherwise. Each step's status is printed in
# the summary at the end (also written to summary.md).
set -u
set -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
BUILD_DIR="${BUILD_DIR:-build-gpu}"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 4)}"
BATCH="${BATCH:-128}"
STEP_TIMEOUT="${STEP_TIMEOUT:-900}"
BUDGET="${BUDGET:-560}"
SAN_TIMEOUT="${SAN_TIMEOUT:-100}"
START_S="$(date +%s)"
DATE="$(date -u +%Y-%m-%d_%H%M)"

if [ -n "${OUT:-}" ]; then
  LOG="$OUT"
else
  LOG="$(mktemp -d /tmp/greenmim-gpu-XXXXXX)"
fi
mkdir -p "$LOG"
SCRATCH="$(mktemp -d /tmp/greenmim-gpu-scratch-XXXXXX)"  # partition JSON for the torch baselines
SUMMARY="$LOG/summary.md"
: > "$SUMMARY"
FAILED=0

say() { echo "== $*" | tee -a "$SUMMARY"; }
status_line() {  # name rc log
  if [ "$2" -eq 0 ]; then say "$1: PASS ($3)"; else say "$1: FAIL rc=$2 ($3)"; FAILED=1; fi
}
left_s() { echo $((BUDGET - ($(date +%s) - START_S))); }
run_step() {  # name logfile command...
  local name="$1" logf="$2"
  shift 2
  local left limit
  left="$(left_s)"
  limit=$((left - 15))  # keep time for the summary
  [ "$limit" -gt "$STEP_TIMEOUT" ] && limit="$STEP_TIMEOUT"
  if [ "$limit" -lt 20 ]; then
    say "$name: SKIPPED (budget: ${left}s left of ${BUDGET}s)"
    FAILED=1
    return 1
  fi
  echo ">>> $name (limit ${limit}s): $*" | tee -a "$logf"
  local t0 rc
  t0="$(date +%s)"
  timeout "$limit" "$@" >>"$logf" 2>&1
  rc=$?
  [ "$rc" -eq 124 ] && echo "!!! $name: stopped at its ${limit}s limit" | tee -a "$logf"
  status_line "$name" "$rc" "$(basename "$logf"), $(( $(date +%s) - t0 ))s"
  return $rc
}

# ---- device ----------------------------------------------------------------------------------------
DEVICE="unknown-device"
ARCH="80;90"
if command -v nvidia-smi >/dev/null 2>&1; then
  DEVICE="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr -c 'A-Za-z0-9._-' '_' | sed 's/_*$//')"
  CC="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')"
  if [ -n "$CC" ]; then ARCH="$CC"; fi
  nvidia-smi >"$LOG/build.log" 2>&1 || true
else
  echo "nvidia-smi not found" >"$LOG/build.log"
fi
say "greenmim GPU run: device ${DEVICE}, arch ${ARCH}, ${DATE} UTC, git $(git rev-parse --short HEAD 2>/dev/null || echo none)"

NVCC="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
SANITIZER="$(command -v compute-sanitizer || true)"
[ -z "$SANITIZER" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] && SANITIZER=/usr/local/cuda/bin/compute-sanitizer

# ---- build ------------------------------------------------------------------------------------------
BUILD_OK=1
EXTRA_CMAKE=()
if [ -d "$ROOT/.gpu-deps/usr" ]; then  # carried Eigen + doctest (bench/gpu/pack_deps.sh)
  EXTRA_CMAKE+=("-DCMAKE_PREFIX_PATH=$ROOT/.gpu-deps/usr")
  say "dependencies: Eigen and doctest from .gpu-deps/"
fi
command -v ninja >/dev/null 2>&1 && EXTRA_CMAKE+=(-G Ninja)
run_step "configure" "$LOG/build.log" cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_COMPILER="$NVCC" -DGREENMIM_CUDA=ON -DGREENMIM_CUDA_ARCHITECTURES="$ARCH" \
  -DGREENMIM_BUILD_TOOLS=OFF -DGREENMIM_BUILD_BENCH=ON -DGREENMIM_BUILD_EXAMPLES=OFF "${EXTRA_CMAKE[@]}" || BUILD_OK=0
if [ "$BUILD_OK" -eq 1 ]; then
  run_step "build" "$LOG/build.log" cmake --build "$BUILD_DIR" -j "$JOBS" \
    --target greenmim_kernels greenmim_gpu_tests greenmim_gpu_bench || BUILD_OK=0
fi
TESTS="$BUILD_DIR/bin/greenmim_gpu_tests"
BENCH="$BUILD_DIR/bin/greenmim_gpu_bench"

# ---- tests ------------------------------------------------------------------------------------------
if [ "${SKIP_TESTS:-0}" != 1 ] && [ -x "$TESTS" ]; then
  run_step "gpu tests" "$LOG/tests.log" "$TESTS" --duration=true
  if grep -q "skipped: no CUDA device" "$LOG/tests.log"; then
    say "gpu tests: WARNING: cases were SKIPPED for lack of a CUDA device"
    FAILED=1
  fi
  grep -E "^\[doctest\] (test cases|assertions)" "$LOG/tests.log" | tee -a "$SUMMARY"
fi

# ---- benchmark ----------------------------------------------------------------------------------------
if [ "${SKIP_BENCH:-0}" != 1 ] && [ -x "$BENCH" ]; then
  run_step "gpu bench" "$LOG/bench.log" "$BENCH" --batch "$BATCH" --csv "$LOG/bench_gpu.csv" --json-dir "$SCRATCH"
fi

# ---- PyTorch baselines --------------------------------------------------------------------------------
if [ "${SKIP_TORCH:-0}" != 1 ]; then
  if python3 -c "import torch" >/dev/null 2>&1; then
    if ls "$SCRATCH"/partition_stage*.json >/dev/null 2>&1; then
      run_step "torch baselines" "$LOG/torch_bench.log" python3 bench/gpu/torch_bench.py \
        --json-dir "$SCRATCH" --csv "$LOG/torch_bench.csv"
    else
      say "torch baselines: no partition JSON (benchmark did not run), skipped"
    fi
  else
    say "torch baselines: python3 cannot import torch, skipped"
  fi
fi

# ---- compute-sanitizer on a small subset (last: the slowest step, each tool capped) ------------------------------------------------------------------
if [ "${SKIP_SANITIZER:-0}" != 1 ] && [ -x "$TESTS" ]; then
  if [ -n "$SANITIZER" ]; then
    SUBSET='gpu attention smoke*,gpu attention forward: NaN*,gpu partition*,gpu index building*,gpu geometry*'
    for tool in memcheck racecheck synccheck initcheck; do
      extra=""
      [ "$tool" = racecheck ] && extra="--racecheck-report all"
      # shellcheck disable=SC2086
      STEP_TIMEOUT="$SAN_TIMEOUT" run_step "compute-sanitizer $tool" "$LOG/sanitizer.log" "$SANITIZER" --tool "$tool" $extra \
        --error-exitcode 1 --print-limit 50 "$TESTS" -tc="$SUBSET"
    done
  else
    say "compute-sanitizer: not found, skipped"
  fi
fi

# ---- summary + copy ---------------------------------------------------------------------------------------
{
  echo
  echo "## greenmim kernels"
  sed -n '/^| op |/,$p' "$LOG/bench.log" 2>/dev/null | grep '^|' || echo "(no benchmark table)"
  grep -E "^(device|ceilings|seed)" "$LOG/bench.log" 2>/dev/null
  echo
  echo "## PyTorch baselines"
  sed -n '/^| path |/,$p' "$LOG/torch_bench.log" 2>/dev/null | grep '^|' || echo "(not run)"
} >>"$SUMMARY"
COPY="docs/perf/${DEVICE}_${DATE}"
if [ "$DEVICE" != unknown-device ] && mkdir -p "$COPY" 2>/dev/null; then
  cp "$LOG"/*.log "$LOG"/*.csv "$SUMMARY" "$COPY"/ 2>/dev/null || true
  echo "logs copied to $COPY" | tee -a "$SUMMARY"
fi
rm -rf "$SCRATCH"
echo
cat "$SUMMARY"
echo "raw logs: $LOG"
exit "$FAILED"
