#!/bin/bash
# Device call 4 (tenth session): the production PEG forward at other minimum CTA counts of its split
# (ncu in call 3: 384 CTAs at Twins-L stage 1 = 0.73 waves at 4 CTAs per SM).
cd "$(dirname "$0")/.." || exit 1
CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | tr -d .)
/usr/local/cuda/bin/nvcc -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -arch=sm_$CAP -Iinclude -Ikernels/include -Ikernels \
    .devcall/peg_var.cu kernels/common.cu -o /tmp/peg_var; echo "build rc=$?"
for r in 1 2; do echo "== run $r"; timeout 60 /tmp/peg_var split; echo "rc=$?"; done 2>&1 | tee $OUT/split.txt
