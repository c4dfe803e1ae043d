#!/bin/bash
# Device call (session 6): block-major Twins (reshape block convs) + depthwise prefetch, A/B vs the parent.
cd "$(dirname "$0")"            # .devsnap
mv ../.gpu-deps . 2>/dev/null
t0=$SECONDS; log(){ echo "[$((SECONDS-t0))s] $*"; }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
B=build-gpu
log build
JOBS=16 SKIP_TESTS=1 SKIP_SANITIZER=1 SKIP_BENCH=1 SKIP_TORCH=1 SKIP_PYTESTS=1 BUDGET=200 OUT=/tmp/r bench/gpu/run.sh > $OUT/build.txt 2>&1; echo build rc=$?; tail -2 $OUT/build.txt
CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | tr -d .)
log "old build (background), arch $CAP"
( cd old && cp -r ../.gpu-deps . && GM_CAP=$CAP JOBS=12 SKIP_TESTS=1 SKIP_SANITIZER=1 SKIP_BENCH=1 SKIP_TORCH=1 SKIP_PYTESTS=1 BUDGET=200 OUT=/tmp/r2 bench/gpu/run.sh > $OUT/old_build.txt 2>&1; echo "old build rc=$?" > $OUT/old_rc.txt ) &
OLDPID=$!
log "variant build (8 samples per CTA), background"
( cd var && cmake -S . -B build-var -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DGREENMIM_CUDA=ON -DGREENMIM_CUDA_ARCHITECTURES=$CAP -DGREENMIM_BUILD_TOOLS=OFF -DGREENMIM_BUILD_BENCH=ON -DGREENMIM_BUILD_EXAMPLES=OFF -DCMAKE_PREFIX_PATH=$PWD/../.gpu-deps/usr > $OUT/var_build.txt 2>&1 && cmake --build build-var -j 8 --target greenmim_conv_gpu_bench >> $OUT/var_build.txt 2>&1; echo "var build rc=$?" > $OUT/var_rc.txt ) &
VARPID=$!
log gpu tests conv
timeout 100 $B/bin/greenmim_gpu_tests -tc='gpu depthwise*,gpu block conv*' > $OUT/gpu_tests.txt 2>&1; echo rc=$?; tail -3 $OUT/gpu_tests.txt
log racecheck+memcheck depthwise
for t in racecheck memcheck; do timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool $t --error-exitcode 1 --print-limit 20 $B/bin/greenmim_gpu_tests -tc='gpu depthwise*' > $OUT/sanitizer_$t.txt 2>&1; echo "$t rc=$?"; tail -1 $OUT/sanitizer_$t.txt; done
export PYTHONPATH=$PWD/python GREENMIM_LIB_DIR=$PWD/$B/lib OMP_NUM_THREADS=1
log pytest
(cd python && timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_conv_ops.py tests/test_cuda.py tests/test_twins.py tests/test_twins_mim.py > $OUT/pytest.txt 2>&1; echo pytest rc=$?; tail -2 $OUT/pytest.txt)
log wait old build
wait $OLDPID; cat $OUT/old_rc.txt; wait $VARPID; cat $OUT/var_rc.txt
log conv bench new / old
for r in 1 2; do
  echo "== new ($r)"; timeout 60 $B/bin/greenmim_conv_gpu_bench --batch 64 2>&1 | grep -E "peg|op " 
  echo "== old ($r)"; timeout 60 old/$B/bin/greenmim_conv_gpu_bench --batch 64 2>&1 | grep -E "peg|op "
  echo "== var: 8 samples per CTA ($r)"; timeout 60 var/build-var/bin/greenmim_conv_gpu_bench --batch 64 2>&1 | grep -E "peg|op "
done > $OUT/conv_ab.txt 2>&1; cat $OUT/conv_ab.txt
log twins ops
timeout 150 python3 bench/gpu/twins_ops.py --batch 64 > $OUT/twins_ops.txt 2>&1; echo twins_ops rc=$?
grep -E "stage|depthwise|GSA|patch" $OUT/twins_ops.txt | grep -v "masked dense\|dense cuDNN" 
log train step twins-l graphs: new, old, new
timeout 90 python3 bench/gpu/train_step.py --model twins_svt_large --batch 128 --full --graphs --no-breakdown --rows simmim,greenmim > $OUT/train_new.txt 2>&1; echo rc=$?; grep -E "^\| (simmim|greenmim)" $OUT/train_new.txt
(cd old && PYTHONPATH=$PWD/python GREENMIM_LIB_DIR=$PWD/$B/lib timeout 90 python3 bench/gpu/train_step.py --model twins_svt_large --batch 128 --full --graphs --no-breakdown --rows greenmim) > $OUT/train_old.txt 2>&1; echo rc=$?; grep -E "^\| (simmim|greenmim)" $OUT/train_old.txt
timeout 90 python3 bench/gpu/train_step.py --model twins_svt_large --batch 128 --full --graphs --no-breakdown --rows greenmim > $OUT/train_new2.txt 2>&1; echo rc=$?; grep -E "^\| (simmim|greenmim)" $OUT/train_new2.txt
log ncu depthwise
timeout 80 /usr/local/cuda/bin/ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats -k "regex:dw_" --launch-count 6 $B/bin/greenmim_conv_gpu_bench --batch 64 --reps 1 --warmup 0 > $OUT/ncu_dw.txt 2>&1; echo ncu rc=$?
grep -E "dw_apply|dw_grad|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per" $OUT/ncu_dw.txt | head -60
log done
