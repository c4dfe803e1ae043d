#!/bin/bash
# ptxas -v output (both archs in one file) -> rows: arch, kernel, registers, spill st, spill ld, stack
for f in "$@"; do
  awk '
    /Compiling entry function/ { match($0, /'"'"'[^'"'"']+'"'"'/); fn = substr($0, RSTART + 1, RLENGTH - 2);
                                 match($0, /for '"'"'sm_[0-9]+'"'"'/); arch = substr($0, RSTART + 5, RLENGTH - 6) }
    /bytes stack frame/ { stack = $1; st = $5; ld = $9 }
    /Used [0-9]+ registers/ { for (i = 1; i <= NF; i++) if ($i == "Used") regs = $(i + 1);
                              print arch "\t" fn "\t" regs "\t" st "\t" ld "\t" stack }' "$f"
done | c++filt | sed 's/(anonymous namespace):://g' | sort
