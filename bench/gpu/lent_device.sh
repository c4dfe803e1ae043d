#!/usr/bin/env bash
# The first command of every session that is lent a device (one H100 or H200): about 8 minutes,
# one call, raw logs into one folder that the caller copies to docs/perf/<device>_<date>/.
#
#   device:  bench/gpu/pack_deps.sh (here, once: Eigen for the host library), then run
#            `bash bench/gpu/lent_device.sh "$OUT"` with carry [".gpu-deps"] and timeout_s 590
#   here:    bench/gpu/lent_device.sh --dry-run [DIR]   every stage at toy size on the CPU (CI-sized)
#
# Stages, in order of value (each is cut at its own limit and at what is left of BUDGET; one that
# cannot start in time is SKIPPED, so the summary always comes back):
#   1. build      the kernels' and host's libraries (CMake, targets greenmim_host + greenmim_cuda),
#                 beside it nvcc of bench/gpu/ab/peg_run_ab.cu and make_jpegs' images (CPU)
#   2. ab         bench/gpu/ab/peg_run_ab.cu (the PEG kernels, prev against new, bit for bit)
#   3. swin-b     train_step.py Swin-B whole models under CUDA graphs, batch 128, every row:
#                 simmim (fused attention), greenmim, per-sample, released, mae, hiera, with MFU
#   4. e2e        greenmim.pretrain end to end on make_jpegs' images (Swin-B, 8 workers, its
#                 defaults on CUDA), and the one line
#                 `pretrain end-to-end: X img/s over N steps; step-only Y img/s (Z.ZZx)`
#                 X: the median of log.jsonl's images_per_s after the warm-up steps; Y: stage 3's
#                 per-sample row (the same model, batch and masks)
#   5. swin-l, twins-l   the same as stage 3 with rows simmim, greenmim, per-sample
#   6. compiled   Swin-B compiled (torch.compile) and graphed, simmim and greenmim rows
#   7. trace      Swin-B eager steps under torch.profiler: host and GPU time by category
#   8. convnextv2-b  train_step.py --model convnextv2_base: greenmim's sparse FCMAE step against the
#                 dense masked FCMAE step (JAX/SparK), ratio 0.6, per-sample masks, both under CUDA
#                 graphs (the trainer's default; the plans made ahead, as its loader), with MFU and the
#                 line `masked-dense / greenmim step time: R` (goal >= 2)
#   9. dw7        greenmim_dw7_gpu_bench (bench/CMakeLists.txt; the build folder reconfigured with
#                 GREENMIM_BUILD_BENCH=ON, that target only): the 7x7 depthwise against a copy's
#                 bandwidth (goal >= 60%)
# Stages 8 and 9 come last, so with the default BUDGET they run only when the earlier ones leave
# time: for them first, run with a larger BUDGET or after a session that measured stages 3-7.
# Files in the folder (a device call returns 10): summary.md, build.log, ab.log, train_swin_b.log,
# pretrain_e2e.log, train_swin_l_twins_l.log, train_compiled.log, trace.log, train_convnext.log, dw7.log.
# Environment: BUDGET (s, default 480), BATCH (128), E2E_STEPS (60), E2E_IMAGES (8192: 64 steps, one epoch),
# PYTHON (python3), GREENMIM_LIB_DIR (--dry-run: the libraries to use; default build/lib),
# GM_MAKE_JPEGS (default bench/make_jpegs.py).
# Exit status: 0 when every stage that ran passed, 1 otherwise.
set -u
set -o pipefail

GM_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$GM_ROOT" || exit 1
GM_DRY=0
if [ "${1:-}" = "--dry-run" ]; then GM_DRY=1; shift; fi
GM_OUT="${1:-$(mktemp -d /tmp/greenmim-lent-XXXXXX)}"
mkdir -p "$GM_OUT" || exit 1
PYTHON="${PYTHON:-python3}"
BATCH="${BATCH:-128}"
E2E_STEPS="${E2E_STEPS:-60}"
E2E_IMAGES="${E2E_IMAGES:-8192}"
GM_MAKE_JPEGS="${GM_MAKE_JPEGS:-bench/make_jpegs.py}"
GM_SCRATCH="$(mktemp -d /tmp/greenmim-lent-scratch-XXXXXX)"
GM_SUMMARY="$GM_OUT/summary.md"
GM_T0="$(date +%s)"
if [ "$GM_DRY" = 1 ]; then BUDGET="${BUDGET:-900}"; else BUDGET="${BUDGET:-480}"; fi
: > "$GM_SUMMARY"
GM_FAILED=0

say() { echo "== $*" | tee -a "$GM_SUMMARY"; }
left_s() { echo $((BUDGET - ($(date +%s) - GM_T0))); }
stage() {  # name cap_s logfile command...: runs it within min(cap, what is left - 10 s)
  local name="$1" cap="$2" logf="$3"
  shift 3
  local left limit t0 rc
  left="$(left_s)"
  limit=$((left - 10))
  [ "$limit" -gt "$cap" ] && limit="$cap"
  if [ "$limit" -lt 15 ]; then
    say "$name: SKIPPED (budget: ${left}s left of ${BUDGET}s)"
    GM_FAILED=1
    return 1
  fi
  echo ">>> $name (limit ${limit}s): $*" >> "$logf"
  t0="$(date +%s)"
  timeout "$limit" "$@" >> "$logf" 2>&1
  rc=$?
  [ "$rc" -eq 124 ] && echo "!!! $name: stopped at its ${limit}s limit" >> "$logf"
  if [ "$rc" -eq 0 ]; then say "$name: PASS ($(basename "$logf"), $(( $(date +%s) - t0 ))s)"
  else say "$name: FAIL rc=$rc ($(basename "$logf"), $(( $(date +%s) - t0 ))s)"; GM_FAILED=1; fi
  return $rc
}

# ---- device ------------------------------------------------------------------------------------------
GM_DEVICE="cpu-dry-run"
GM_CAP=""
if [ "$GM_DRY" = 0 ] && command -v nvidia-smi >/dev/null 2>&1; then
  GM_DEVICE="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -c 'A-Za-z0-9._-' '_' | sed 's/_*$//')"
  GM_CAP="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')"
  nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader >> "$GM_OUT/build.log" 2>&1
elif [ "$GM_DRY" = 0 ]; then
  say "no nvidia-smi: not a GPU machine (use --dry-run here)"
  exit 2
fi
say "greenmim lent-device run: ${GM_DEVICE}, $(date -u +%Y-%m-%d_%H%M) UTC, git $(git rev-parse --short HEAD 2>/dev/null || echo none)$( [ "$GM_DRY" = 1 ] && echo ', DRY RUN: toy sizes on the CPU, no figure means anything')"
say "copy this folder to docs/perf/${GM_DEVICE}_$(date -u +%Y-%m-%d)/"

# ---- 1. build (and, beside it, the A/B bench's nvcc and the JPEGs) ---------------------------------------
GM_NVCC="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
GM_AB_BIN="$GM_SCRATCH/peg_run_ab"
GM_AB_PID=""
if [ -x "$GM_NVCC" ] && [ -f bench/gpu/ab/peg_run_ab.cu ]; then
  GM_AB_ARCH="${GM_CAP:-90}"
  ( "$GM_NVCC" -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -arch="sm_$GM_AB_ARCH" -Iinclude -Ikernels/include \
      -Ikernels bench/gpu/ab/peg_run_ab.cu kernels/common.cu -o "$GM_AB_BIN" > "$GM_SCRATCH/ab_build.txt" 2>&1
    echo "nvcc rc=$?" >> "$GM_SCRATCH/ab_build.txt" ) &
  GM_AB_PID=$!
fi
# make_jpegs in GM_SHARDS processes (seeds 0..K-1, one folder each), merged into one ImageFolder:
# enough images that the trainer's steps fit in one epoch (no worker restart inside the timing)
GM_JPEGS="$GM_SCRATCH/jpegs"
GM_JPEG_N="$E2E_IMAGES"
GM_SHARDS=8
[ "$GM_DRY" = 1 ] && GM_JPEG_N=48 && GM_SHARDS=2
GM_JPEG_PID=""
if [ -f "$GM_MAKE_JPEGS" ]; then
  (
    pids=()
    for k in $(seq 0 $((GM_SHARDS - 1))); do
      "$PYTHON" "$GM_MAKE_JPEGS" "$GM_SCRATCH/shard$k" --n $((GM_JPEG_N / GM_SHARDS)) --seed "$k" > "$GM_SCRATCH/shard$k.txt" 2>&1 &
      pids+=($!)
    done
    rc=0
    for j in "${pids[@]}"; do wait "$j" || rc=1; done
    cat "$GM_SCRATCH"/shard*.txt
    for k in $(seq 0 $((GM_SHARDS - 1))); do
      for d in "$GM_SCRATCH/shard$k"/train/*/; do
        c="$(basename "$d")"
        mkdir -p "$GM_JPEGS/train/$c"
        for f in "$d"*; do mv "$f" "$GM_JPEGS/train/$c/s${k}_$(basename "$f")" || rc=1; done
      done
    done
    echo "make_jpegs: $(find "$GM_JPEGS" -type f | wc -l) images in $GM_JPEGS from $GM_SHARDS shards"
    echo "make_jpegs rc=$rc"
  ) > "$GM_SCRATCH/jpegs.txt" 2>&1 &
  GM_JPEG_PID=$!
fi
if [ "$GM_DRY" = 1 ]; then
  export GREENMIM_LIB_DIR="${GREENMIM_LIB_DIR:-$GM_ROOT/build/lib}"
  if [ -f "$GREENMIM_LIB_DIR/libgreenmim_host.so" ]; then say "build: dry run, libraries from $GREENMIM_LIB_DIR"
  else say "build: FAIL: no libgreenmim_host.so in $GREENMIM_LIB_DIR (build it, or set GREENMIM_LIB_DIR)"; GM_FAILED=1; fi
else
  GM_BUILD=build-lent
  GM_CMAKE=(-DCMAKE_BUILD_TYPE=Release -DGREENMIM_CUDA=ON -DGREENMIM_CUDA_ARCHITECTURES="$GM_CAP"
            -DCMAKE_CUDA_COMPILER="$GM_NVCC" -DGREENMIM_BUILD_TESTS=OFF -DGREENMIM_BUILD_TOOLS=OFF
            -DGREENMIM_BUILD_BENCH=OFF -DGREENMIM_BUILD_EXAMPLES=OFF -DGREENMIM_PYTHON_EXECUTABLE="$(command -v "$PYTHON")")
  [ -d .gpu-deps/usr ] && GM_CMAKE+=("-DCMAKE_PREFIX_PATH=$GM_ROOT/.gpu-deps/usr")
  command -v ninja >/dev/null 2>&1 && GM_CMAKE+=(-G Ninja)
  stage "configure" 60 "$GM_OUT/build.log" cmake -S . -B "$GM_BUILD" "${GM_CMAKE[@]}" &&
    stage "build" 200 "$GM_OUT/build.log" cmake --build "$GM_BUILD" -j "$(nproc)" --target greenmim_host greenmim_cuda
  export GREENMIM_LIB_DIR="$GM_ROOT/$GM_BUILD/lib"
fi
export PYTHONPATH="$GM_ROOT/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$PYTHON" -c "import sys, torch, timm; print('python', sys.version.split()[0], 'torch', torch.__version__, 'timm', timm.__version__, 'cuda', torch.version.cuda, 'nproc', __import__('os').cpu_count())" >> "$GM_OUT/build.log" 2>&1

# ---- 2. the A/B bench ------------------------------------------------------------------------------------
if [ -n "$GM_AB_PID" ]; then
  wait "$GM_AB_PID"
  cat "$GM_SCRATCH/ab_build.txt" >> "$GM_OUT/ab.log"
  if ! grep -q "nvcc rc=0" "$GM_SCRATCH/ab_build.txt"; then say "ab peg_run_ab: FAIL (nvcc; ab.log)"; GM_FAILED=1
  elif [ "$GM_DRY" = 1 ]; then say "ab peg_run_ab: built; not run (dry run: no device)"
  else stage "ab peg_run_ab" 90 "$GM_OUT/ab.log" "$GM_AB_BIN"; fi
else
  say "ab peg_run_ab: SKIPPED (no nvcc or no bench/gpu/ab/peg_run_ab.cu)"
  [ "$GM_DRY" = 0 ] && GM_FAILED=1
fi

# ---- 3. Swin-B under graphs, every row -----------------------------------------------------------------
TS=(bench/gpu/train_step.py --no-breakdown --json)
if [ "$GM_DRY" = 1 ]; then
  GM_FAST=(--cpu --batch 4 --steps 1 --warmup 0)                 # toy models, whole, on the CPU
  GM_GRAPHS=()
else
  GM_FAST=(--batch "$BATCH" --full --steps 10 --warmup 3)
  GM_GRAPHS=(--graphs --plans loader)
fi
stage "train swin-b (graphs, every row)" 150 "$GM_OUT/train_swin_b.log" \
  "$PYTHON" "${TS[@]}" --model swin_base_patch4_window7_224 "${GM_FAST[@]}" "${GM_GRAPHS[@]}"
grep -E "^\| " "$GM_OUT/train_swin_b.log" >> "$GM_SUMMARY"

# ---- 4. the trainer end to end on make_jpegs' images -----------------------------------------------------
if [ -n "$GM_JPEG_PID" ]; then
  wait "$GM_JPEG_PID"
  cat "$GM_SCRATCH/jpegs.txt" >> "$GM_OUT/pretrain_e2e.log"
fi
if [ -z "$GM_JPEG_PID" ] || ! grep -q "make_jpegs rc=0" "$GM_SCRATCH/jpegs.txt"; then
  say "pretrain end-to-end: SKIPPED (no images: $GM_MAKE_JPEGS missing or failed; pretrain_e2e.log)"
  GM_FAILED=1
else
  GM_E2E_DIR="$GM_SCRATCH/pretrain"
  if [ "$GM_DRY" = 1 ]; then
    GM_E2E=(--model green_mim_swin_nano_patch4_dec128b1 --device cpu --batch_size 8 --num_workers 1)
    GM_E2E_STEPS=6
  else
    GM_E2E=(--model green_mim_swin_base_patch4_dec512b1 --device cuda --batch_size "$BATCH" --num_workers 8)
    GM_E2E_STEPS="$E2E_STEPS"
    # the trainer captures CUDA graphs by default once it has --eager; before that, ask for them
    "$PYTHON" -m greenmim.pretrain --help 2>/dev/null | grep -q -- "--eager" || GM_E2E+=(--cuda_graphs)
  fi
  stage "pretrain end-to-end" 150 "$GM_OUT/pretrain_e2e.log" "$PYTHON" -m greenmim.pretrain "${GM_E2E[@]}" \
    --data_path "$GM_JPEGS" --per_sample_masks --epochs 1000 --warmup_epochs 1 --max_steps "$GM_E2E_STEPS" \
    --print_freq 10 --output_dir "$GM_E2E_DIR" --save_freq 100000 --vis_freq 100000
  "$PYTHON" - "$GM_E2E_DIR/log.jsonl" "$GM_OUT/train_swin_b.log" >> "$GM_SUMMARY" 2>> "$GM_OUT/pretrain_e2e.log" <<'PYEOF' || { say "pretrain end-to-end: no line (pretrain_e2e.log)"; GM_FAILED=1; }
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "images_per_s" in r]
warm = min(10, len(rows) // 3)          # capture and warm-up; each row is a rolling mean of 20 steps
x = statistics.median(r["images_per_s"] for r in rows[warm:])
step = None
for line in open(sys.argv[2]):
    if line.startswith("{"):
        step = {r["row"]: r for r in json.loads(line)["rows"]}.get("per-sample")
if step is None:                        # stage 3 failed or was skipped: the line without its ratio
    print(f"pretrain end-to-end: {x:.0f} img/s over {len(rows) - warm} steps; step-only n/a (no per-sample row)")
else:
    y = step["images_per_s"]
    print(f"pretrain end-to-end: {x:.0f} img/s over {len(rows) - warm} steps; step-only {y:.0f} img/s ({x / y:.2f}x)")
PYEOF
  tail -1 "$GM_SUMMARY"
fi

# ---- 5. Swin-L and Twins-L under graphs, with per-sample rows --------------------------------------------------
for gm_model in swin_large_patch4_window7_224 twins_svt_large; do
  stage "train ${gm_model%%_patch*} (graphs)" 100 "$GM_OUT/train_swin_l_twins_l.log" \
    "$PYTHON" "${TS[@]}" --model "$gm_model" --rows simmim,greenmim,per-sample "${GM_FAST[@]}" "${GM_GRAPHS[@]}"
done

# ---- 6. Swin-B compiled and graphed next to SimMIM ----------------------------------------------------------
if [ "$GM_DRY" = 1 ]; then GM_COMPILE=(--toy --full --compile --rows greenmim)      # a CPU compile: one row
else GM_COMPILE=("${GM_FAST[@]}" "${GM_GRAPHS[@]}" --compile --rows simmim,greenmim); fi
stage "train swin-b compiled" 170 "$GM_OUT/train_compiled.log" \
  "$PYTHON" "${TS[@]}" --model swin_base_patch4_window7_224 "${GM_COMPILE[@]}"

# ---- 7. where an eager step's time goes ------------------------------------------------------------------
if [ "$GM_DRY" = 1 ]; then GM_TRACE=(--toy --full --rows greenmim)
else GM_TRACE=(--batch "$BATCH" --full --steps 5 --warmup 2 --rows simmim,greenmim); fi
stage "trace swin-b eager" 90 "$GM_OUT/trace.log" \
  "$PYTHON" "${TS[@]}" --model swin_base_patch4_window7_224 "${GM_TRACE[@]}" --trace "$GM_SCRATCH/traces"

# ---- 8. ConvNeXt V2-B: greenmim's sparse FCMAE step against the dense masked step ----------------------------
if [ "$GM_DRY" = 1 ]; then GM_CNX=(--cpu --batch 4 --steps 1 --warmup 0)
else GM_CNX=(--batch "$BATCH" --steps 10 --warmup 3 --plans loader --graphs); fi   # graphed: the trainer's default
stage "train convnextv2-b (fcmae, masked-dense vs greenmim)" 120 "$GM_OUT/train_convnext.log" \
  "$PYTHON" "${TS[@]}" --model convnextv2_base "${GM_CNX[@]}"
grep -E "^\| (masked-dense|greenmim) \||^masked-dense / greenmim" "$GM_OUT/train_convnext.log" >> "$GM_SUMMARY"

# ---- 9. the 7x7 depthwise kernels against a copy's bandwidth ---------------------------------------------
if [ "$GM_DRY" = 1 ]; then
  say "dw7 greenmim_dw7_gpu_bench: not run (dry run: no device)"
else
  stage "dw7 build" 90 "$GM_OUT/dw7.log" cmake -S . -B "$GM_BUILD" -DGREENMIM_BUILD_BENCH=ON &&
    stage "dw7 build" 90 "$GM_OUT/dw7.log" cmake --build "$GM_BUILD" -j "$(nproc)" --target greenmim_dw7_gpu_bench &&
    stage "dw7 greenmim_dw7_gpu_bench" 60 "$GM_OUT/dw7.log" "$GM_BUILD/bin/greenmim_dw7_gpu_bench" --model base --batch 64
fi

say "done in $(( $(date +%s) - GM_T0 ))s of ${BUDGET}s; logs in $GM_OUT"
rm -rf "$GM_SCRATCH"
exit "$GM_FAILED"
