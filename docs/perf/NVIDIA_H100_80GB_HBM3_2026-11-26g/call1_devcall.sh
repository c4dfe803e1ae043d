#!/bin/bash
# Device call 1 (session 7): the PEG forward with weights in registers and token tiles per CTA.
cd "$(dirname "$0")"            # .devsnap
mv ../.gpu-deps . 2>/dev/null
t0=$SECONDS; log(){ echo "[$((SECONDS-t0))s] $*"; }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | tr -d .)
B=build-gpu
log "micro-bench build (background)"
( /usr/local/cuda/bin/nvcc -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -arch=sm_$CAP -Iinclude -Ikernels/include -Ikernels peg_variants.cu kernels/common.cu -o /tmp/peg_variants > $OUT/pv_build.txt 2>&1; echo "pv build rc=$?" >> $OUT/pv_build.txt ) &
PVPID=$!
log build
JOBS=14 SKIP_TESTS=1 SKIP_SANITIZER=1 SKIP_BENCH=1 SKIP_TORCH=1 SKIP_PYTESTS=1 BUDGET=200 OUT=/tmp/r bench/gpu/run.sh > /tmp/build.txt 2>&1; echo build rc=$?; tail -2 /tmp/build.txt
wait $PVPID; tail -1 $OUT/pv_build.txt
log "PEG variants (x2)"
for r in 1 2; do timeout 60 /tmp/peg_variants; done > $OUT/peg_variants.txt 2>&1; cat $OUT/peg_variants.txt
log gpu tests conv
timeout 100 $B/bin/greenmim_gpu_tests -tc='gpu depthwise*,gpu block conv*,depthwise*' > $OUT/gpu_tests.txt 2>&1; echo rc=$?; tail -3 $OUT/gpu_tests.txt
log racecheck+memcheck depthwise
for t in racecheck memcheck; do timeout 70 /usr/local/cuda/bin/compute-sanitizer --tool $t --error-exitcode 1 --print-limit 20 $B/bin/greenmim_gpu_tests -tc='gpu depthwise*' > /tmp/san_$t.txt 2>&1; echo "$t rc=$?"; tail -2 /tmp/san_$t.txt; done
export PYTHONPATH=$PWD/python GREENMIM_LIB_DIR=$PWD/$B/lib OMP_NUM_THREADS=1
log pytest
(cd python && timeout 120 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_conv_ops.py tests/test_cuda.py -k "graph or conv or twins or depthwise" > $OUT/pytest.txt 2>&1; echo pytest rc=$?; tail -2 $OUT/pytest.txt)
log twins ops
timeout 150 python3 bench/gpu/twins_ops.py --batch 64 > $OUT/twins_ops.txt 2>&1; echo twins_ops rc=$?
grep -E "depthwise|GSA|patch" $OUT/twins_ops.txt | grep -v "masked dense\|dense cuDNN\|fused" ; tail -3 $OUT/twins_ops.txt | grep -i error
log ncu per-sample stage 1
timeout 60 /usr/local/cuda/bin/ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats -k "regex:dw_apply" /tmp/peg_variants --once 1 1 > $OUT/ncu.txt 2>&1; echo ncu rc=$?
grep -E "dw_apply|Duration|Memory Throughput|DRAM Throughput|L1/TEX Hit|L2 Hit|Achieved Occupancy|Registers Per|Mem Busy|Max Bandwidth" $OUT/ncu.txt | head -40
log train step twins-l graphs
timeout 70 python3 bench/gpu/train_step.py --model twins_svt_large --batch 128 --full --graphs --no-breakdown --rows simmim,greenmim > $OUT/train.txt 2>&1; echo rc=$?; grep -E "^\| (simmim|greenmim)|could not|Error" $OUT/train.txt
log done
