#!/usr/bin/env bash
# Nsight Compute profiles of the kernels at the shapes where they miss their targets
# (docs/perf/kernel-journal.md): the attention forward/backward and gather/scatter at Swin-B
# stages 1 and 3 (window 7, batch 128, bf16, both shifts), and Twins-L stage 1's convolutions
# (PEG depthwise forward/backward, GSA sub-sampling and patch-embedding block convs, batch 64).
# Each kernel is profiled once (the benchmarks run with --reps 1 --warmup 0 under ncu).
#
# Usage: bench/gpu/ncu.sh     (after bench/gpu/run.sh has built BUILD_DIR)
# Environment: BUILD_DIR (default build-gpu), OUT (reports go there; default a fresh folder),
#   NCU (default /usr/local/cuda/bin/ncu), NCU_TIMEOUT (seconds per profile, default 150),
#   NCU_WHAT ("attention conv" by default: which profiles to take).
# Writes ncu_attention.txt and ncu_conv.txt. Clocks are left alone (METHOD.md): --clock-control none.
set -u
GM_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$GM_ROOT" || exit 1
BUILD_DIR="${BUILD_DIR:-build-gpu}"
OUT="${OUT:-$(mktemp -d /tmp/greenmim-ncu-XXXXXX)}"
NCU="${NCU:-/usr/local/cuda/bin/ncu}"
NCU_TIMEOUT="${NCU_TIMEOUT:-150}"
NCU_WHAT="${NCU_WHAT:-attention conv}"
mkdir -p "$OUT"
GM_SECTIONS=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis
             --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats)
rc=0
profile() {  # report-name kernel-regex launch-count command...
  local name="$1" regex="$2" count="$3"
  shift 3
  echo ">>> ncu $name: $*" | tee "$OUT/$name.txt"
  timeout "$NCU_TIMEOUT" "$NCU" --clock-control none "${GM_SECTIONS[@]}" -k "regex:$regex" --launch-count "$count" \
    "$@" >>"$OUT/$name.txt" 2>&1
  local r=$?
  echo "== ncu $name: rc=$r ($OUT/$name.txt)"
  [ "$r" -eq 0 ] || rc=1
}
case " $NCU_WHAT " in *" attention "*)
  profile ncu_attention 'attention|dbias|copy_rows' 48 \
    "$BUILD_DIR/bin/greenmim_gpu_bench" --batch 128 --stages 13 --windows 7 --reps 1 --warmup 0 --copy-mb 64 ;;
esac
case " $NCU_WHAT " in *" conv "*)
  # stage 1: PEG fwd, PEG bwd (dx, partials, reduce), GSA fwd and bwd, patch embedding fwd and bwd
  profile ncu_conv 'dw_|gather_gemm|splitk_reduce|zero_rows' 20 \
    "$BUILD_DIR/bin/greenmim_conv_gpu_bench" --batch 64 --reps 1 --warmup 0 ;;
esac
exit "$rc"
