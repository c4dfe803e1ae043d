#!/usr/bin/env python3
"""Summarise the SASS of CUDA kernels (cuobjdump -sass output) for reading without a device.

Usage: sass_summary.py SASS_FILE [KERNEL_REGEX]   (scripts/kernel_sass runs it)
       sass_summary.py --self-test                  (ctest sass_summary_self_test)

For every kernel whose demangled name matches KERNEL_REGEX (default: all):
- its instruction count, and the local-memory traffic (STL/LDL: register spills);
- each loop (a backward branch and its target), with its instruction mix: global and shared
  loads and stores, FMAs, conversions, branches;
- for the innermost loops, every global load and how many instructions later its first
  destination register is read ("use after"). A load used by the next instruction stalls its warp
  for the whole latency; loads issued together and used tens of instructions later overlap.

Static counts: a loop's count is what one trip issues when no branch inside it is taken or
skipped; code that the compiler duplicated (a loop unswitched on a uniform flag) counts twice.
"""
import re
import subprocess
import sys
from collections import Counter

MIX = [  # (column, regex on the opcode)
    ("LDG", r"^LDG"), ("STG", r"^STG"), ("LDS", r"^LDS"), ("STS", r"^STS"),
    ("FMA", r"^(FFMA|HFMA2|DFMA)"), ("MMA", r"^(HMMA|IMMA|HGMMA|DMMA)"),
    ("CVT", r"^(F2F|F2FP|I2F|F2I|PRMT)"), ("LDL", r"^LDL"), ("STL", r"^STL"), ("BRA", r"^BRA"),
]


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
        return out.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return names


def parse(path):
    """{mangled name: [(address, text)]} from cuobjdump -sass output."""
    funcs, cur = {}, None
    for line in open(path, encoding="utf-8", errors="replace"):
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), m.group(2)))
    return funcs


def opcode(text):
    t = re.sub(r"^@!?U?P[T0-9]+\s+", "", text)  # drop the predicate guard
    return t.split()[0] if t else ""


def loops_of(ins):
    at = {a: i for i, (a, _) in enumerate(ins)}
    out = []
    for i, (a, t) in enumerate(ins):
        m = re.search(r"\bBRA\b(?:\s+!?U?P\d,)?\s+(?:`\()?0x([0-9a-f]+)", t)
        if m:
            tgt = int(m.group(1), 16)
            if tgt < a and tgt in at:  # (a branch to itself ends every kernel)
                out.append((at[tgt], i))
    return sorted(set(out))


def mix(ins, lo, hi):
    c = Counter()
    for _, t in ins[lo:hi + 1]:
        op = opcode(t)
        for col, rx in MIX:
            if re.match(rx, op):
                c[col] += 1
    return c


def use_after(ins, i, hi):
    """Instructions from global load i to the first read of its destination, within [i, hi]."""
    t = ins[i][1]
    m = re.search(r"LDG\S*\s+(R\d+)", t)
    if not m:
        return None
    r = int(m.group(1)[1:])
    op = opcode(t)
    width = 4 if ".128" in op else 2 if ".64" in op else 1
    regs = [f"R{r + k}" for k in range(width)]
    for j in range(i + 1, hi + 1):
        body = re.sub(r"^@!?U?P[T0-9]+\s+", "", ins[j][1])
        op, _, operands = body.partition(" ")
        # a store reads all its operands; anything else writes its first and reads the rest
        srcs = operands if op.startswith(("STG", "STS", "STL", "ST.")) else operands.partition(",")[2]
        if any(re.search(rf"\b{x}\b", srcs) for x in regs):
            return j - i
    return None


def summarise(funcs, rx=None):
    """[(demangled name, instructions, total mix, [(lo addr, hi addr, n, mix, innermost, [use after])])]"""
    names = list(funcs)
    out = []
    for name, nice in zip(names, demangle(names)):
        nice = nice.replace("(anonymous namespace)::", "")
        if rx and not rx.search(nice):
            continue
        ins = funcs[name]
        lps = loops_of(ins)
        loops = []
        for lo, hi in lps:
            inner = not any(l2 > lo and h2 < hi for l2, h2 in lps if (l2, h2) != (lo, hi))
            d = [use_after(ins, i, hi) for i in range(lo, hi + 1) if opcode(ins[i][1]).startswith("LDG")] if inner else []
            loops.append((ins[lo][0], ins[hi][0], hi - lo + 1, mix(ins, lo, hi), inner, d))
        out.append((nice, len(ins), mix(ins, 0, len(ins) - 1), loops))
    return out


SELF_TEST = """
\t\tFunction : _Z3fooPf
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0020*/                   LDG.E R8, desc[UR4][R2.64+0x10] ;
        /*0030*/                   MOV R5, R9 ;
        /*0040*/                   FFMA R10, R6, R6, R10 ;
        /*0050*/              @!P0 FFMA R10, R8, R8, R10 ;
        /*0060*/                   STL [R1], R10 ;
        /*0070*/               @P1 BRA 0x10 ;
        /*0080*/                   EXIT ;
        /*0090*/                   BRA 0x90;
"""


def self_test():
    """The summary of a known listing: one loop, two loads each read 3 instructions later."""
    import os
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".sass", delete=False) as f:
        f.write(SELF_TEST)
    try:
        (name, n, total, loops), = summarise(parse(f.name))
    finally:
        os.unlink(f.name)
    assert name.startswith("foo("), name
    assert n == 10 and total["STL"] == 1 and total["LDG"] == 2, (n, total)
    assert len(loops) == 1, loops  # the branch to itself is not a loop
    lo, hi, count, m, inner, d = loops[0]
    assert (lo, hi, count, inner) == (0x10, 0x70, 7, True), loops[0]
    assert (m["LDG"], m["FMA"], m["STL"], m["BRA"]) == (2, 2, 1, 1), m
    assert d == [3, 3], d  # the MOV writes R5 and reads R9: not a use of the 128-bit load
    print("sass_summary self-test: ok")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    if sys.argv[1] == "--self-test":
        self_test()
        return
    rx = re.compile(sys.argv[2]) if len(sys.argv) > 2 else None
    res = summarise(parse(sys.argv[1]), rx)
    if not res:
        sys.exit(f"no kernel matches {sys.argv[2]!r}; kernels: " + ", ".join(n for n, *_ in summarise(parse(sys.argv[1]))))
    for nice, n, total, loops in res:
        print(f"{nice}\n  {n} instructions; spills: {total['STL']} STL, {total['LDL']} LDL")
        for lo, hi, count, c, inner, d in loops:
            cols = " ".join(f"{k} {c[k]}" for k, _ in MIX if c[k])
            print(f"  loop {lo:#06x}-{hi:#06x}{' (innermost)' if inner else ''}: {count} instructions; {cols}")
            if d:
                print("    global loads, instructions to first use: " + ", ".join("-" if x is None else str(x) for x in d))


if __name__ == "__main__":
    main()
