#!/bin/bash
# Device call 6 (session 7): the dweight cut (k_dw_grad_target_ctas): GPU tests, sanitizers, micro-bench, twins_ops.
cd "$(dirname "$0")"            # .devsnap
mv ../.gpu-deps . 2>/dev/null
t0=$SECONDS; log(){ echo "[$((SECONDS-t0))s] $*"; }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | tr -d .)
B=build-gpu
( /usr/local/cuda/bin/nvcc -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -arch=sm_$CAP -Iinclude -Ikernels/include -Ikernels peg_bwd_split.cu kernels/common.cu -o /tmp/peg_bwd_split > $OUT/pb_build.txt 2>&1; echo "pb build rc=$?" >> $OUT/pb_build.txt ) &
PBPID=$!
log build
JOBS=14 SKIP_TESTS=1 SKIP_SANITIZER=1 SKIP_BENCH=1 SKIP_TORCH=1 SKIP_PYTESTS=1 BUDGET=200 OUT=/tmp/r bench/gpu/run.sh > /tmp/build.txt 2>&1; echo build rc=$?; tail -1 /tmp/build.txt
wait $PBPID; tail -1 $OUT/pb_build.txt
log gpu tests conv
timeout 100 $B/bin/greenmim_gpu_tests -tc='gpu depthwise*,gpu block conv*,depthwise*' > $OUT/gpu_tests.txt 2>&1; echo rc=$?; tail -3 $OUT/gpu_tests.txt
log racecheck+memcheck depthwise
for t in racecheck memcheck; do timeout 70 /usr/local/cuda/bin/compute-sanitizer --tool $t --error-exitcode 1 --print-limit 20 $B/bin/greenmim_gpu_tests -tc='gpu depthwise*' > /tmp/san_$t.txt 2>&1; echo "$t rc=$?"; tail -1 /tmp/san_$t.txt; done
log micro-bench
timeout 60 /tmp/peg_bwd_split > $OUT/peg_bwd_split.txt 2>&1; echo rc=$?; grep -E "stage|current" $OUT/peg_bwd_split.txt
export PYTHONPATH=$PWD/python GREENMIM_LIB_DIR=$PWD/$B/lib OMP_NUM_THREADS=1
log twins ops
timeout 100 python3 bench/gpu/twins_ops.py --batch 64 > $OUT/twins_ops.txt 2>&1; echo twins_ops rc=$?
grep -E "depthwise" $OUT/twins_ops.txt
log done
