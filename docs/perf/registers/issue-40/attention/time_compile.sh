#!/bin/bash
# one nvcc per file, both archs (the CMake flags) plus -Xptxas -v: CPU time and ptxas' report
run() {  # root file tag
  local R=$1 f=$2 tag=$3
  local NV="/usr/local/cuda/bin/nvcc -I$R/kernels/include -I$R/include -O3 -DNDEBUG --generate-code=arch=compute_80,code=[compute_80,sm_80] --generate-code=arch=compute_90,code=[compute_90,sm_90] -Xcompiler=-fPIC --expt-relaxed-constexpr -lineinfo -std=c++17 -Xptxas -v -x cu -c"
  echo "== $tag $f"
  { time $NV $R/kernels/$f.cu -o /tmp/k40/$tag.$f.o > /tmp/k40/ptxas.$tag.$f.txt 2>&1 ; } 2>&1
}
run /tmp/kbefore40 attention_bwd before
for f in attention_bwd attention_bwd_fp32 attention_bwd_fp16 attention_bwd_bf16 attention_fwd; do run /tmp/kafter40 $f after; done
run /tmp/kbefore40 attention_fwd before
echo done
