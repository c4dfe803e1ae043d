#!/bin/bash
# Device call 5 (session 7): the PEG backward's dweight cut, micro-bench.
cd "$(dirname "$0")"            # .devsnap
t0=$SECONDS; log(){ echo "[$((SECONDS-t0))s] $*"; }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | tr -d .)
log build
/usr/local/cuda/bin/nvcc -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -arch=sm_$CAP -Iinclude -Ikernels/include -Ikernels peg_bwd_split.cu kernels/common.cu -o /tmp/peg_bwd_split > $OUT/pb_build.txt 2>&1; echo "build rc=$?"
log run
timeout 120 /tmp/peg_bwd_split > $OUT/peg_bwd_split.txt 2>&1; echo rc=$?; cat $OUT/peg_bwd_split.txt
log done
