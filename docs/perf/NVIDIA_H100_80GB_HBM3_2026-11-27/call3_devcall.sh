#!/bin/bash
# Device call 3 (tenth session): ncu of the production PEG kernels (dw_apply forward and
# dw_grad_partial) at Twins-L stage 1, per-sample layout, the first launch of each in peg_var.
cd "$(dirname "$0")/.." || exit 1
t0=$SECONDS; log(){ echo "[$((SECONDS-t0))s] $*"; }
CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | tr -d .)
/usr/local/cuda/bin/nvcc -std=c++17 -O3 -DNDEBUG -lineinfo --expt-relaxed-constexpr -arch=sm_$CAP -Iinclude -Ikernels/include -Ikernels \
    .devcall/peg_var.cu kernels/common.cu -o /tmp/peg_var; echo "build rc=$?"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for k in dw_apply dw_grad_partial; do
  log "ncu $k"
  timeout 120 $NCU --clock-control none -k "regex:^$k\$" --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section InstructionStats \
    --section SourceCounters /tmp/peg_var > $OUT/ncu_$k.txt 2>&1; echo "ncu rc=$?"
  grep -E "dw_|Duration|Memory Throughput|DRAM Through|L1/TEX Hit|L2 Hit|Achieved Occupancy|Registers Per|Issued Ipc|No Eligible|Stall|Warp Cycles Per Issued|Executed Instructions  " $OUT/ncu_$k.txt | head -40
done
log done
