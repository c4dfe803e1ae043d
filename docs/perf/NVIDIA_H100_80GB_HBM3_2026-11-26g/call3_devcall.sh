#!/bin/bash
# Device call 2 (session 7): PEG forward variants (micro-bench) and the warps' stall reasons.
cd "$(dirname "$0")"            # .devsnap
t0=$SECONDS; log(){ echo "[$((SECONDS-t0))s] $*"; }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | tr -d .)
log "micro-bench build"
/usr/local/cuda/bin/nvcc -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -arch=sm_$CAP -Iinclude -Ikernels/include -Ikernels peg_variants.cu kernels/common.cu -o /tmp/peg_variants > $OUT/pv_build.txt 2>&1; echo "pv build rc=$?"
log "PEG variants (x2)"
for r in 1 2; do timeout 60 /tmp/peg_variants; done > $OUT/peg_variants.txt 2>&1; cat $OUT/peg_variants.txt
for L in; do
  log "ncu layout $L stage 1: base, ca, u2"
  timeout 60 /usr/local/cuda/bin/ncu --clock-control none --cache-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats -k "regex:dw_apply_(base|ca|u2)" /tmp/peg_variants --once $L 1 > $OUT/ncu_l$L.txt 2>&1; echo ncu rc=$?
  grep -E "dw_apply|Duration|Memory Throughput|L1/TEX Cache|Compute \(SM\)|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issued Warp|No Eligible|Active Warps Per" $OUT/ncu_l$L.txt | head -40
done
log done
