#!/bin/bash
# Device call 2 (tenth session): peg_var.cu (staged-tile forward/dx, 4-channel dweight) against
# production; the whole Python test suite on CUDA; twins_ops.py whole.
cd "$(dirname "$0")/.." || exit 1
t0=$SECONDS; log(){ echo "[$((SECONDS-t0))s] $*"; }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader
CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | tr -d .)
NVCC=/usr/local/cuda/bin/nvcc
B=build-gpu
( $NVCC -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -arch=sm_$CAP -Iinclude -Ikernels/include -Ikernels \
    .devcall/peg_var.cu kernels/common.cu -o /tmp/peg_var > /tmp/var_build.txt 2>&1; echo "var build rc=$?" >> /tmp/var_build.txt ) &
VPID=$!
log build
JOBS=14 SKIP_TESTS=1 SKIP_SANITIZER=1 SKIP_BENCH=1 SKIP_TORCH=1 SKIP_PYTESTS=1 BUDGET=200 OUT=/tmp/r bench/gpu/run.sh > $OUT/build.txt 2>&1; echo build rc=$?; tail -3 $OUT/build.txt
(cmake -S . -B $B -DGREENMIM_BUILD_TOOLS=ON && cmake --build $B -j 14 --target greenmim_tool) >> $OUT/build.txt 2>&1; echo tool rc=$?
wait $VPID; cat /tmp/var_build.txt >> $OUT/build.txt; tail -1 /tmp/var_build.txt
log peg_var
for r in 1 2; do echo "== run $r"; timeout 90 /tmp/peg_var; echo "peg_var rc=$?"; done > $OUT/peg_var.txt 2>&1; cat $OUT/peg_var.txt
export PYTHONPATH=$PWD/python GREENMIM_LIB_DIR=$PWD/$B/lib OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
log twins ops
timeout 100 python3 bench/gpu/twins_ops.py --batch 64 > $OUT/twins_ops.txt 2>&1; echo twins_ops rc=$?
log pytest, the whole suite
(cd python && timeout 240 python3 -m pytest -q -n 12 -rs -p no:cacheprovider --durations=15 tests > $OUT/pytest_all.txt 2>&1; echo pytest rc=$?; tail -25 $OUT/pytest_all.txt)
log done
