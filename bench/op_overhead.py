#!/usr/bin/env python3
"""Host time of greenmim's ops on the kernel path, the kernels themselves left out: what a GPU
training step pays in Python per op call, measured on any CPU.

The CUDA path's Python (argument checks, the C views, the workspace query, the autograd
bookkeeping) runs under ``greenmim.emulate_cuda()`` with the kernel library's C calls replaced by
no-ops, on tiny tensors, so the time is the host's alone. Each row is timed through the eager
fast path (greenmim/_eager.py) and through the custom ops' dispatcher (``_eager.disabled()``),
interleaved; the figure is the best of 3 medians. A plain ``torch.add`` on the same tiny tensor is
the scale.

    python bench/op_overhead.py [--reps 1000]
"""
import argparse
import contextlib
import statistics
import sys
import time

import torch

import greenmim
from greenmim import _eager, _lib


class _NullKernels:
    """Every gm_* entry point returns cudaSuccess and does nothing; workspaces are 0 bytes."""

    def __getattr__(self, name):
        return lambda *args: 0


@contextlib.contextmanager
def null_kernels():
    """Within it, the emulated kernel library is ``_NullKernels`` (bench/activation_memory.py uses it too)."""
    real = _lib._libs.get("emu")
    _lib._libs["emu"] = _NullKernels()
    try:
        yield
    finally:
        if real is None:
            _lib._libs.pop("emu", None)
        else:
            _lib._libs["emu"] = real


def _median_us(fn, reps):
    for _ in range(max(reps // 10, 10)):
        fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=1000)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)

    # a Swin block's ops (one head of 32, one 8x8-token stage, window 4, shift 2) and Twins' convs
    mask = torch.rand(8, 8, generator=gen) < 0.5
    mask[0, 0] = True
    part = greenmim.stage_partition(mask, 4, 2, channels=32, cache=False)
    N = part.num_tokens
    qkv = torch.randn(1, N, 3, 1, 32, requires_grad=True)
    bias = torch.randn(49, 1, requires_grad=True)
    x = torch.randn(1, N, 32, requires_grad=True)
    nt, bt = greenmim.neighbor_table(mask, cache=False), greenmim.block_table(mask, 2, cache=False)
    xc = torch.randn(1, nt.num_tokens, 16, requires_grad=True)
    wd, bd = torch.randn(16, 1, 3, 3, requires_grad=True), torch.randn(16, requires_grad=True)
    wb = torch.randn(32, 16, 2, 2, requires_grad=True)

    def block():
        y = greenmim.partition_tokens(x, part)
        o = greenmim.group_window_attention_packed(qkv, bias, part)
        return y, o, greenmim.unpartition_tokens(y, part)

    def block_fb():
        y, o, z = block()
        (y.sum() + o.sum() + z.sum()).backward()

    def convs():
        return greenmim.submanifold_depthwise_conv3x3(xc, nt, wd, bd, residual=True), greenmim.block_conv(xc, bt, wb)

    def convs_fb():
        p, q = convs()
        (p.sum() + q.sum()).backward()

    rows = [("partition + attention + unpartition, forward", block),
            ("partition + attention + unpartition, forward + backward", block_fb),
            ("depthwise 3x3 + block conv, forward", convs),
            ("depthwise 3x3 + block conv, forward + backward", convs_fb)]
    with null_kernels():
        plain = torch.randn(1, N, 32)
        print(f"== host time per call, kernels left out; torch {torch.__version__}, best of 3 medians of {a.reps}")
        print(f"torch.add on the same tiny tensor: {_median_us(lambda: plain + plain, a.reps):.1f} us")
        print("| ops | fast path us | dispatcher us | saved |")
        print("|---|---|---|---|")
        with greenmim.emulate_cuda():
            for name, fn in rows:
                fast, slow = [], []
                for _ in range(3):
                    fast.append(_median_us(fn, a.reps))
                    with _eager.disabled():
                        slow.append(_median_us(fn, a.reps))
                f, s = min(fast), min(slow)
                print(f"| {name} | {f:.0f} | {s:.0f} | {100 * (1 - f / s):.0f}% |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
