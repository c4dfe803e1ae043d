#!/bin/bash
# Device call 1 (tenth session): peg_ab (the PEG kernels of 0740302 against the seventh session's),
# the whole GPU test suite, sanitizers on the conv cases, the conv bench, the Twins pytest subset,
# twins_ops.py (channels_last block-conv rows new since the last run), the Twins-L training step.
cd "$(dirname "$0")/.." || exit 1
t0=$SECONDS; log(){ echo "[$((SECONDS-t0))s] $*"; }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader
CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | tr -d .)
NVCC=/usr/local/cuda/bin/nvcc; SAN=/usr/local/cuda/bin/compute-sanitizer
B=build-gpu
( $NVCC -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -arch=sm_$CAP -Iinclude -Ikernels/include -Ikernels \
    bench/gpu/ab/peg_ab.cu kernels/common.cu -o /tmp/peg_ab > /tmp/ab_build.txt 2>&1; echo "ab build rc=$?" >> /tmp/ab_build.txt ) &
ABPID=$!
log build
JOBS=14 SKIP_TESTS=1 SKIP_SANITIZER=1 SKIP_BENCH=1 SKIP_TORCH=1 SKIP_PYTESTS=1 BUDGET=200 OUT=/tmp/r bench/gpu/run.sh > $OUT/build.txt 2>&1; echo build rc=$?; tail -3 $OUT/build.txt
wait $ABPID; cat /tmp/ab_build.txt >> $OUT/build.txt; tail -1 /tmp/ab_build.txt
log peg_ab
timeout 90 /tmp/peg_ab > $OUT/peg_ab.txt 2>&1; echo peg_ab rc=$?; cat $OUT/peg_ab.txt
log gpu tests, all
timeout 150 $B/bin/greenmim_gpu_tests --duration=true > $OUT/gpu_tests.txt 2>&1; echo rc=$?; tail -3 $OUT/gpu_tests.txt
log racecheck+memcheck on the conv cases
for t in racecheck memcheck; do echo "== $t"; timeout 60 $SAN --tool $t --error-exitcode 1 --print-limit 20 $B/bin/greenmim_gpu_tests -tc='gpu depthwise*,gpu block conv*' 2>&1 | tail -4; echo "$t rc=${PIPESTATUS[0]}"; done > $OUT/sanitizer.txt 2>&1; grep -E "rc=|ERROR SUMMARY|RACECHECK SUMMARY" $OUT/sanitizer.txt
log conv bench
{ timeout 40 $B/bin/greenmim_conv_gpu_bench --batch 64; echo rc=$?; timeout 40 $B/bin/greenmim_conv_gpu_bench --batch 64 --per-sample; echo rc=$?; } > $OUT/conv_bench.txt 2>&1; grep -E "rc=" $OUT/conv_bench.txt
export PYTHONPATH=$PWD/python GREENMIM_LIB_DIR=$PWD/$B/lib OMP_NUM_THREADS=1
log pytest twins/conv/cuda
(cd python && timeout 170 python3 -m pytest -q -n 8 -rs -p no:cacheprovider tests/test_conv_ops.py tests/test_cuda.py tests/test_twins.py tests/test_twins_mim.py > $OUT/pytest.txt 2>&1; echo pytest rc=$?; tail -3 $OUT/pytest.txt)
log twins ops
timeout 100 python3 bench/gpu/twins_ops.py --batch 64 > $OUT/twins_ops.txt 2>&1; echo twins_ops rc=$?
grep -E "^\|" $OUT/twins_ops.txt | head -60
log train step twins-l graphs
timeout 90 python3 bench/gpu/train_step.py --model twins_svt_large --batch 128 --full --graphs --no-breakdown --rows simmim,greenmim > $OUT/train.txt 2>&1; echo rc=$?; grep -E "^\| (row|simmim|greenmim)" $OUT/train.txt
log done
