#!/usr/bin/env bash
# Draws the paper's figure "optimal group size at each stage" from `greenmim simulate --curve`.
# usage: scripts/plot_curve.sh docs/figures/optimal_group_size.csv docs/figures/optimal_group_size.png
set -euo pipefail
csv="$1"; png="$2"
command -v gnuplot >/dev/null || { echo "plot_curve: gnuplot missing (apt-get install gnuplot-nox)" >&2; exit 1; }
gnuplot <<GP
set datafile separator ","
set terminal pngcairo size 1500,420 font ",10"
set output "$png"
set multiplot layout 1,3 title "Swin-B, 224 px, ratio 0.75, 100 masks: attention cost vs group size (mean +- std; paper's DP at fixed G, and fast)"
do for [s=1:3] {
  set title sprintf("stage %d", s)
  set xlabel "group size G"
  set ylabel "MFLOPs"
  set xrange [0:(s==1 ? 300 : (s==2 ? 200 : 50))]
  set key top left
  plot "$csv" every ::1 using (\$1==s ? \$2 : 1/0):(\$4-\$5):(\$4+\$5) with filledcurves fc rgb "#c8e6c9" title "paper DP, +-1 std", \
       "" every ::1 using (\$1==s ? \$2 : 1/0):4 with lines lw 2 lc rgb "#1b5e20" title "paper DP, mean", \
       "" every ::1 using (\$1==s ? \$2 : 1/0):6 with lines lw 1 dt 2 lc rgb "#0d47a1" title "fast at fixed G, mean"
}
unset multiplot
GP
