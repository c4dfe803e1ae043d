#!/usr/bin/env bash
# One script for a GPU machine (H100 / H200): configure + build with CUDA, run the GPU tests,
# the GPU benchmark (Swin-B stages 1-3 at window 7, and stage 1 of Swin-B window 14 and Swin V2-B
# window 16, where the tensor-core forward's query tiles run next to SIMT; batch 128, bf16), when
# PyTorch imports the PyTorch baselines (released-code path and FlexAttention) on the window-7
# partitions, Twins' convolutions (bench/gpu/twins_ops.py), the training step of Swin-B/L and
# Twins-L (bench/gpu/train_step.py), greenmim.pretrain on CUDA (nano: eager, compiled, fp16, CUDA
# graphs; Swin-B with CUDA graphs) and its loader alone (bench/loader.py), and last
# compute-sanitizer (memcheck, racecheck, synccheck, initcheck) on a small test subset.
#
# The long, whole-suite run. A session that is lent a device runs bench/gpu/lent_device.sh first
# (about 8 minutes: the A/B bench, the train-step rows with MAE's and Hiera's, the trainer end to end).
#
# Usage (from anywhere):  bench/gpu/run.sh
# Environment:
#   OUT=<dir>        raw logs go there (else to a fresh folder); a copy always goes to
#                    docs/perf/<device>_<date>/
#   BUILD_DIR=<dir>  build folder (default build-gpu)
#   JOBS=<n>         build parallelism (default: nproc)
#   BATCH=<n>        benchmark batch (default 128)
#   SKIP_TESTS=1 SKIP_SANITIZER=1 SKIP_BENCH=1 SKIP_TORCH=1 SKIP_PYTESTS=1   skip a step
#   SKIP_AB=1        skip the A/B benches of bench/gpu/ab/ (run after the conv bench)
#   STEP_TIMEOUT=<s> time limit of each step (default 900)
#   SAN_TIMEOUT=<s>  time limit of each compute-sanitizer tool (default 100)
#   PYTHON=<exe>     interpreter of the Python steps (default python3)
#   TORCH_BUDGET=<s> torch_bench.py starts no new row after this many seconds (default 150:
#                    FlexAttention compiles per partition; the later steps need the time)
#   BUDGET=<s>       time for the whole script (default 560: a device call is cut at 600 s); a step
#                    gets at most what is left, and a step that cannot start in time is reported
#                    as SKIPPED (budget), so the logs and the summary always come back
# Dependencies: CUDA (nvcc), CMake, a C++17 compiler, and the header-only Eigen 3.4 and doctest.
# A GPU machine that cannot install packages gets the last two from .gpu-deps/ (made here by
# bench/gpu/pack_deps.sh from this machine's Debian packages; carry it along).
# Adding a step: `run_step NAME LOGFILE command...` (a native step) or `py_step NAME LOGFILE script.py
# args...` (a PyTorch step); each gets the budget rule above and a PASS/FAIL/SKIPPED summary line.
# The script's own variables are GM_-prefixed so that none clobbers a tool's (CC, CXX, ARCH, ...).
# Exit status: 0 when every step that ran passed, 1 otherwise. Each step's status is printed in
# the summary at the end (also written to summary.md).
set -u
set -o pipefail

GM_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$GM_ROOT" || exit 1
BUILD_DIR="${BUILD_DIR:-build-gpu}"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 4)}"
BATCH="${BATCH:-128}"
STEP_TIMEOUT="${STEP_TIMEOUT:-900}"
BUDGET="${BUDGET:-560}"
SAN_TIMEOUT="${SAN_TIMEOUT:-100}"
PYTHON="${PYTHON:-python3}"
TORCH_BUDGET="${TORCH_BUDGET:-150}"
GM_START_S="$(date +%s)"
GM_DATE="$(date -u +%Y-%m-%d_%H%M)"

if [ -n "${OUT:-}" ]; then
  GM_LOG="$OUT"
else
  GM_LOG="$(mktemp -d /tmp/greenmim-gpu-XXXXXX)"
fi
mkdir -p "$GM_LOG"
GM_SCRATCH="$(mktemp -d /tmp/greenmim-gpu-scratch-XXXXXX)"  # partition JSON for the torch baselines
GM_SUMMARY="$GM_LOG/summary.md"
: > "$GM_SUMMARY"
GM_FAILED=0

say() { echo "== $*" | tee -a "$GM_SUMMARY"; }
status_line() {  # name rc log
  if [ "$2" -eq 0 ]; then say "$1: PASS ($3)"; else say "$1: FAIL rc=$2 ($3)"; GM_FAILED=1; fi
}
left_s() { echo $((BUDGET - ($(date +%s) - GM_START_S))); }
run_step() {  # name logfile command...
  local name="$1" logf="$2"
  shift 2
  local left limit
  left="$(left_s)"
  limit=$((left - 15))  # keep time for the summary
  [ "$limit" -gt "$STEP_TIMEOUT" ] && limit="$STEP_TIMEOUT"
  if [ "$limit" -lt 20 ]; then
    say "$name: SKIPPED (budget: ${left}s left of ${BUDGET}s)"
    GM_FAILED=1
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
GM_DEVICE="unknown-device"
GM_ARCH="80;90"
if command -v nvidia-smi >/dev/null 2>&1; then
  GM_DEVICE="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr -c 'A-Za-z0-9._-' '_' | sed 's/_*$//')"
  GM_CAP="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')"
  if [ -n "$GM_CAP" ]; then GM_ARCH="$GM_CAP"; fi
  nvidia-smi >"$GM_LOG/build.log" 2>&1 || true
else
  echo "nvidia-smi not found" >"$GM_LOG/build.log"
fi
say "greenmim GPU run: device ${GM_DEVICE}, arch ${GM_ARCH}, ${GM_DATE} UTC, git $(git rev-parse --short HEAD 2>/dev/null || echo none)"

GM_NVCC="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
GM_SANITIZER="$(command -v compute-sanitizer || true)"
[ -z "$GM_SANITIZER" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] && GM_SANITIZER=/usr/local/cuda/bin/compute-sanitizer

# ---- build ------------------------------------------------------------------------------------------
GM_BUILD_OK=1
GM_CMAKE_ARGS=()
if [ -d "$GM_ROOT/.gpu-deps/usr" ]; then  # carried Eigen + doctest (bench/gpu/pack_deps.sh)
  GM_CMAKE_ARGS+=("-DCMAKE_PREFIX_PATH=$GM_ROOT/.gpu-deps/usr")
  say "dependencies: Eigen and doctest from .gpu-deps/"
fi
command -v ninja >/dev/null 2>&1 && GM_CMAKE_ARGS+=(-G Ninja)
run_step "configure" "$GM_LOG/build.log" cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_COMPILER="$GM_NVCC" -DGREENMIM_CUDA=ON -DGREENMIM_CUDA_ARCHITECTURES="$GM_ARCH" \
  -DGREENMIM_BUILD_TOOLS=OFF -DGREENMIM_BUILD_BENCH=ON -DGREENMIM_BUILD_EXAMPLES=OFF "${GM_CMAKE_ARGS[@]}" || GM_BUILD_OK=0
if [ "$GM_BUILD_OK" -eq 1 ]; then
  run_step "build" "$GM_LOG/build.log" cmake --build "$BUILD_DIR" -j "$JOBS" \
    --target greenmim_kernels greenmim_gpu_tests greenmim_gpu_bench greenmim_conv_gpu_bench greenmim_python_libs \
    || GM_BUILD_OK=0
fi
GM_TESTS="$BUILD_DIR/bin/greenmim_gpu_tests"
GM_BENCH="$BUILD_DIR/bin/greenmim_gpu_bench"

# ---- tests ------------------------------------------------------------------------------------------
if [ "${SKIP_TESTS:-0}" != 1 ] && [ -x "$GM_TESTS" ]; then
  run_step "gpu tests" "$GM_LOG/tests.log" "$GM_TESTS" --duration=true
  if grep -q "skipped: no CUDA device" "$GM_LOG/tests.log"; then
    say "gpu tests: WARNING: cases were SKIPPED for lack of a CUDA device"
    GM_FAILED=1
  fi
  grep -E "^\[doctest\] (test cases|assertions)" "$GM_LOG/tests.log" | tee -a "$GM_SUMMARY"
fi

# ---- benchmark ----------------------------------------------------------------------------------------
if [ "${SKIP_BENCH:-0}" != 1 ] && [ -x "$GM_BENCH" ]; then
  run_step "gpu bench" "$GM_LOG/bench.log" "$GM_BENCH" --batch "$BATCH" --csv "$GM_LOG/bench_gpu.csv" --json-dir "$GM_SCRATCH"
fi

# the conv kernels alone (PEG, GSA sub-sampling, patch embedding at Twins-L shapes; C ABI, no torch)
GM_CONV_BENCH="$BUILD_DIR/bin/greenmim_conv_gpu_bench"
if [ "${SKIP_BENCH:-0}" != 1 ] && [ -x "$GM_CONV_BENCH" ]; then
  run_step "conv gpu bench" "$GM_LOG/conv_bench.log" "$GM_CONV_BENCH" --batch 64
  # the trainer's layout: a mask per sample, every sample's tokens on one axis (B = 1)
  run_step "conv gpu bench, per-sample" "$GM_LOG/conv_bench_per_sample.log" "$GM_CONV_BENCH" --batch 64 --per-sample
fi

# same-binary A/B benches of kernel changes made without a device (bench/gpu/ab/README.md): the
# kernels last measured against their unmeasured successors, timed and compared bit for bit
if [ "${SKIP_BENCH:-0}" != 1 ] && [ "${SKIP_AB:-0}" != 1 ] && [ "$GM_BUILD_OK" -eq 1 ]; then
  for gm_ab in bench/gpu/ab/*.cu; do
    [ -e "$gm_ab" ] || continue
    gm_ab_name="$(basename "$gm_ab" .cu)"
    run_step "ab build $gm_ab_name" "$GM_LOG/ab_$gm_ab_name.log" cmake --build "$BUILD_DIR" -j "$JOBS" --target "greenmim_ab_$gm_ab_name" &&
      run_step "ab $gm_ab_name" "$GM_LOG/ab_$gm_ab_name.log" "$BUILD_DIR/bin/greenmim_ab_$gm_ab_name"
  done
fi

# ---- Python steps ---------------------------------------------------------------------------------------
# Python steps run with a compiler environment that Triton / torch.compile can use: this script's
# own variables are all GM_-prefixed (a plain CC=90 here once became Triton's C compiler), and a
# CC or CXX inherited from the caller that names no executable is dropped for these steps.
GM_PY_ENV=()
for v in CC CXX; do
  val="${!v:-}"
  if [ -n "$val" ] && ! command -v "${val%% *}" >/dev/null 2>&1; then
    say "environment: $v='$val' names no executable; unset for the Python steps"
    GM_PY_ENV+=(-u "$v")
  fi
done
GM_HAVE_TORCH=0
if [ "${SKIP_TORCH:-0}" != 1 ]; then
  if env "${GM_PY_ENV[@]}" "$PYTHON" -c "import torch" >/dev/null 2>&1; then GM_HAVE_TORCH=1; else
    say "python: $PYTHON cannot import torch; PyTorch steps skipped"; fi
fi
py_step() {  # name logfile script args...  (a PyTorch step: skipped when torch is unavailable)
  local name="$1" logf="$2"
  shift 2
  if [ "$GM_HAVE_TORCH" -ne 1 ]; then say "$name: skipped (no PyTorch or SKIP_TORCH=1)"; return 0; fi
  run_step "$name" "$logf" env "${GM_PY_ENV[@]}" "$PYTHON" "$@"
}

# PyTorch baselines on the partitions the benchmark wrote
if ls "$GM_SCRATCH"/partition_stage*.json >/dev/null 2>&1; then
  py_step "torch baselines" "$GM_LOG/torch_bench.log" bench/gpu/torch_bench.py \
    --json-dir "$GM_SCRATCH" --csv "$GM_LOG/torch_bench.csv" --budget-s "$TORCH_BUDGET"
else
  say "torch baselines: no partition JSON (benchmark did not run), skipped"
fi

# The package's steps (twins_ops.py first) import greenmim from python/ with the libraries just built.
export PYTHONPATH="$GM_ROOT/python${PYTHONPATH:+:$PYTHONPATH}" GREENMIM_LIB_DIR="$BUILD_DIR/lib"

# Twins' convolutions on visible tokens against copy bandwidth, cuBLAS and cuDNN (dense and
# masked dense), Twins-L shapes at 25% and 40% visible units
py_step "twins ops" "$GM_LOG/twins_ops.log" bench/gpu/twins_ops.py --batch 64 --csv "$GM_LOG/twins_ops.csv"

# The PyTorch package (python/) on the GPU: its tests (CUDA ones included), then the training-step
# claim (bench/gpu/train_step.py: SimMIM all-token Swin vs greenmim, Swin-B and Swin-L, batch 128).
if [ "${SKIP_PYTESTS:-0}" = 1 ]; then
  say "python tests: skipped (SKIP_PYTESTS=1)"
elif [ "$GM_HAVE_TORCH" -eq 1 ] && ! env "${GM_PY_ENV[@]}" "$PYTHON" -c "import pytest" >/dev/null 2>&1; then
  say "python tests: $PYTHON has no pytest, skipped"
else
  py_step "python tests" "$GM_LOG/python_tests.log" -m pytest -q -rs -p no:cacheprovider python/tests
fi
# (train_step.py's rows mae and hiera, the other architectures, run in bench/gpu/lent_device.sh)
GM_ROWS=simmim,greenmim,per-sample,released
for gm_model in swin_base_patch4_window7_224 swin_large_patch4_window7_224 twins_svt_large; do
  py_step "train step ${gm_model%%_patch*}" "$GM_LOG/train_step.log" bench/gpu/train_step.py --model "$gm_model" \
    --batch "$BATCH" --rows "$GM_ROWS" --csv "$GM_LOG/train_step_${gm_model%%_patch*}.csv"
  # the whole pretraining models (GreenMIM vs SimMIM with their decoders and losses)
  py_step "train step full ${gm_model%%_patch*}" "$GM_LOG/train_step.log" bench/gpu/train_step.py --model "$gm_model" \
    --batch "$BATCH" --rows "$GM_ROWS" --full --no-breakdown --csv "$GM_LOG/train_step_full_${gm_model%%_patch*}.csv"
  # the step as one CUDA graph (greenmim.pretrain --cuda_graphs' GraphedStep): the host-bound
  # eager step's real comparison, all rows captured alike
  py_step "train step graphs ${gm_model%%_patch*}" "$GM_LOG/train_step.log" \
    bench/gpu/train_step.py --model "$gm_model" --batch "$BATCH" --rows "$GM_ROWS" --full --no-breakdown --plans loader --graphs \
    --csv "$GM_LOG/train_step_graphs_${gm_model%%_patch*}.csv"
  # the same with the trainer's plan pipeline (planned and pinned ahead, copied asynchronously);
  # Swin-B and Twins-L only, to keep the sanitizer steps inside BUDGET
  [ "$gm_model" = swin_large_patch4_window7_224 ] && continue
  py_step "train step full ${gm_model%%_patch*} (plans loader)" "$GM_LOG/train_step.log" bench/gpu/train_step.py \
    --model "$gm_model" --batch "$BATCH" --rows "$GM_ROWS" --full --no-breakdown --plans loader \
    --csv "$GM_LOG/train_step_full_loader_${gm_model%%_patch*}.csv"
done
# greenmim.pretrain on CUDA: 30 steps of the nano model (bf16, pinned plans from 4 workers), per-sample
# masks, then the same compiled (one graph expected: its last line says how many), then fp16 with
# its GradScaler, then the step as a CUDA graph (--cuda_graphs; same seed: its losses track eager's). The device machine
# has no network, so the images are written here (noise PNGs; scikit-image's photos may be absent).
if [ "$GM_HAVE_TORCH" -eq 1 ]; then
  env "${GM_PY_ENV[@]}" "$PYTHON" - "$GM_SCRATCH/images/noise" <<'PYEOF' || say "pretrain: could not write images"
import os, sys, torch
from PIL import Image
os.makedirs(sys.argv[1], exist_ok=True)
g = torch.Generator().manual_seed(0)
for i in range(640):
    a = (torch.rand(256, 256, 3, generator=g) * 255).to(torch.uint8).numpy()
    Image.fromarray(a).save(os.path.join(sys.argv[1], f"{i}.png"))
PYEOF
fi
for gm_mode in eager compile fp16 graphs; do
  gm_extra=()
  [ "$gm_mode" = compile ] && gm_extra=(--compile)
  [ "$gm_mode" = fp16 ] && gm_extra=(--amp fp16)
  [ "$gm_mode" = graphs ] && gm_extra=(--cuda_graphs)   # its last lines: replays and overflows
  py_step "pretrain cuda $gm_mode" "$GM_LOG/pretrain.log" -m greenmim.pretrain --model green_mim_swin_nano_patch4_dec128b1 \
    --data_path "$GM_SCRATCH/images" --batch_size 64 --epochs 3 --warmup_epochs 1 --lr 1e-3 --max_steps 30 \
    --per_sample_masks --num_workers 4 --output_dir "$GM_SCRATCH/pretrain_$gm_mode" --print_freq 10 --device cuda \
    "${gm_extra[@]}"
done
# What the trainer delivers with a real model: the loader alone (bench/loader.py: its rate and a
# worker's time by part), then Swin-B pretraining with --cuda_graphs from the same workers, whose
# img/s against the replayed step's (train step graphs, above) says whether the loader limits.
GM_WORKERS=$(( $(nproc 2>/dev/null || echo 4) - 2 ))
[ "$GM_WORKERS" -lt 1 ] && GM_WORKERS=1
py_step "loader" "$GM_LOG/loader.log" bench/loader.py --data_path "$GM_SCRATCH/images" --batch "$BATCH" \
  --workers "$GM_WORKERS" --per_sample_masks --cuda_graphs --batches 20
py_step "pretrain cuda graphs swin-b" "$GM_LOG/pretrain.log" -m greenmim.pretrain --model green_mim_swin_base_patch4_dec512b1 \
  --data_path "$GM_SCRATCH/images" --batch_size "$BATCH" --epochs 20 --warmup_epochs 1 --max_steps 40 --per_sample_masks \
  --num_workers "$GM_WORKERS" --print_freq 10 --device cuda --output_dir "$GM_SCRATCH/pretrain_swinb" --save_freq 1000 \
  --vis_freq 1000 --cuda_graphs

# ---- compute-sanitizer on a small subset (last: the slowest step, each tool capped) ------------------------------------------------------------------
if [ "${SKIP_SANITIZER:-0}" != 1 ] && [ -x "$GM_TESTS" ]; then
  if [ -n "$GM_SANITIZER" ]; then
    GM_SUBSET='gpu attention smoke*,gpu attention forward: NaN*,gpu attention forward: several heads*,gpu partition*,gpu index building*,gpu geometry*'
    for tool in memcheck racecheck synccheck initcheck; do
      extra=""
      [ "$tool" = racecheck ] && extra="--racecheck-report all"
      # shellcheck disable=SC2086
      STEP_TIMEOUT="$SAN_TIMEOUT" run_step "compute-sanitizer $tool" "$GM_LOG/sanitizer.log" "$GM_SANITIZER" --tool "$tool" $extra \
        --error-exitcode 1 --print-limit 50 "$GM_TESTS" -tc="$GM_SUBSET"
    done
  else
    say "compute-sanitizer: not found, skipped"
  fi
fi

# ---- summary + copy ---------------------------------------------------------------------------------------
{
  echo
  echo "## greenmim kernels"
  sed -n '/^| op |/,$p' "$GM_LOG/bench.log" 2>/dev/null | grep '^|' || echo "(no benchmark table)"
  grep -E "^(device|ceilings|seed)" "$GM_LOG/bench.log" 2>/dev/null
  echo
  echo "## PyTorch baselines"
  sed -n '/^| path |/,$p' "$GM_LOG/torch_bench.log" 2>/dev/null | grep '^|' || echo "(not run)"
  echo
  echo "## Twins ops (bench/gpu/twins_ops.py)"
  sed -n '/^| op |/,$p' "$GM_LOG/twins_ops.log" 2>/dev/null | grep '^|' || echo "(not run)"
  echo
  echo "## Training step (bench/gpu/train_step.py)"
  grep -E '^(== train step|\| (row|simmim|greenmim|per-sample|released) |per-sample /|released /)' \
    "$GM_LOG/train_step.log" 2>/dev/null || echo "(not run)"
  echo
  echo "## greenmim.pretrain on CUDA"
  grep -E '^greenmim.pretrain: (done|error|torch.compile|CUDA graph)|step (30/30|40/40) ' "$GM_LOG/pretrain.log" 2>/dev/null \
    || echo "(not run)"
  echo
  echo "## The loader alone (bench/loader.py)"
  grep -E '^(  |loader)' "$GM_LOG/loader.log" 2>/dev/null || echo "(not run)"
} >>"$GM_SUMMARY"
GM_COPY="docs/perf/${GM_DEVICE}_${GM_DATE}"
if [ "$GM_DEVICE" != unknown-device ] && mkdir -p "$GM_COPY" 2>/dev/null; then
  cp "$GM_LOG"/*.log "$GM_LOG"/*.csv "$GM_SUMMARY" "$GM_COPY"/ 2>/dev/null || true
  echo "logs copied to $GM_COPY" | tee -a "$GM_SUMMARY"
fi
rm -rf "$GM_SCRATCH"
echo
cat "$GM_SUMMARY"
echo "raw logs: $GM_LOG"
exit "$GM_FAILED"
