#!/bin/bash
# Device call 2 (session 6): the reshape path after the graph-capture fix; Twins-L step old vs new.
cd "$(dirname "$0")"            # .devsnap
mv ../.gpu-deps . 2>/dev/null
t0=$SECONDS; log(){ echo "[$((SECONDS-t0))s] $*"; }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
B=build-gpu
log build
JOBS=16 SKIP_TESTS=1 SKIP_SANITIZER=1 SKIP_BENCH=1 SKIP_TORCH=1 SKIP_PYTESTS=1 BUDGET=200 OUT=/tmp/r bench/gpu/run.sh > $OUT/build.txt 2>&1; echo build rc=$?; tail -2 $OUT/build.txt
log "old build (background)"
( cd old && cp -r ../.gpu-deps . && JOBS=10 SKIP_TESTS=1 SKIP_SANITIZER=1 SKIP_BENCH=1 SKIP_TORCH=1 SKIP_PYTESTS=1 BUDGET=200 OUT=/tmp/r2 bench/gpu/run.sh > $OUT/old_build.txt 2>&1; echo "old build rc=$?" >> $OUT/old_build.txt ) &
OLDPID=$!
export PYTHONPATH=$PWD/python GREENMIM_LIB_DIR=$PWD/$B/lib OMP_NUM_THREADS=1
log pytest
(cd python && timeout 100 python3 -m pytest -q -n 6 -p no:cacheprovider tests/test_conv_ops.py tests/test_cuda.py -k "graph or block_conv or twins or conv" > $OUT/pytest.txt 2>&1; echo pytest rc=$?; tail -2 $OUT/pytest.txt)
log twins ops
timeout 80 python3 bench/gpu/twins_ops.py --batch 64 > $OUT/twins_ops.txt 2>&1; echo twins_ops rc=$?
grep -E "depthwise|GSA|patch" $OUT/twins_ops.txt | grep -v "masked dense\|dense cuDNN" ; tail -3 $OUT/twins_ops.txt | grep -i error
log wait old build
wait $OLDPID; tail -1 $OUT/old_build.txt
log train step twins-l graphs: new, old, new
timeout 60 python3 bench/gpu/train_step.py --model twins_svt_large --batch 128 --full --graphs --no-breakdown --rows simmim,greenmim > $OUT/train.txt 2>&1; echo rc=$?
(cd old && PYTHONPATH=$PWD/python GREENMIM_LIB_DIR=$PWD/$B/lib timeout 50 python3 bench/gpu/train_step.py --model twins_svt_large --batch 128 --full --graphs --no-breakdown --rows greenmim) >> $OUT/train.txt 2>&1; echo rc=$?
timeout 50 python3 bench/gpu/train_step.py --model twins_svt_large --batch 128 --full --graphs --no-breakdown --rows greenmim >> $OUT/train.txt 2>&1; echo rc=$?
grep -E "^\| (simmim|greenmim)|could not|Error" $OUT/train.txt
log done
