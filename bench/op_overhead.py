#!/usr/bin/env python3
"""Host time of greenmim's ops on the kernel path, the kernels themselves left out: what a GPU
training step pays in Python per op call, measured on any CPU.

The CUDA path's Python (argument checks, the C views, the workspace query, the autograd
bookkeeping) runs under ``greenmim.emulate_cuda()`` with the kernel library's C calls replaced by
no-ops, on tiny tensors, so the time is the host's alone. Each public op is timed on its own,
forward and forward + backward (``torch.autograd.backward`` of its output with a ready gradient:
the engine's own cost per call is in it), through the eager fast path (greenmim/_dispatch.py) and
through the custom ops' dispatcher (``_dispatch.disabled()``), interleaved; each figure is the best
of 3 medians of ``--reps`` calls. Plain torch ops on the same tiny tensor are the scale: a
``torch.add`` forward, a multiply forward + backward, and the autograd.Function the fast path's
forward ops are (its C apply, two tensors allocated, one returned, four saved: the floor of the
packed attention's forward on this path, greenmim/ops.py's _AttentionPackedFn). The last rows are a Swin block's three
ops together (partition, packed attention, unpartition: the figure earlier notes quote).

What this cannot see on a CPU: the CUDA stream lookup (emulation passes none) and the block conv's
default CUDA path (a row gather and cuBLAS GEMMs in torch: on the emulator the block conv takes
the fused kernels' C calls, ``algo="fused"`` on a GPU).

    python bench/op_overhead.py [--reps 1000] [--json] [--ops attention_packed,partition]
"""
import argparse
import contextlib
import json
import statistics
import sys
import time

import torch

import greenmim
from greenmim import _dispatch as _eager, _lib


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
    clock = time.perf_counter_ns
    for _ in range(reps):
        t = clock()
        fn()
        ts.append(clock() - t)
    return statistics.median(ts) / 1e3


def _forward_backward(fwd, grads):
    """fwd() -> output tensors; then their backward with ``grads`` (made once, outside the timing)."""
    def run():
        torch.autograd.backward(fwd(), grads)
    return run


class _Floor(torch.autograd.Function):
    """The mechanism the fast path's forward ops ride on, doing nothing else: an autograd.Function
    applied through its C entry (as greenmim/_dispatch.py does) that allocates the output and the
    log-sum-exp, returns the output and saves four tensors, as the packed attention's forward does
    (its index, a Python object, on the context)."""

    @staticmethod
    def forward(ctx, qkv, bias, index, algo):
        o, lse = qkv.new_empty(qkv.shape[:2] + qkv.shape[3:]), qkv.new_empty(qkv.shape[:2] + qkv.shape[3:4])
        ctx.save_for_backward(qkv, o, lse, bias)
        ctx.index = index
        return o

    @staticmethod
    def backward(ctx, do):
        return None, None, None, None


def cases(gen: torch.Generator):
    """name -> (forward callable returning a tuple of tensors, its gradients): a Swin block's ops
    (one head of 32, an 8x8-token stage, window 4, shift 2) and Twins' two convs."""
    mask = torch.rand(8, 8, generator=gen) < 0.5
    mask[0, 0] = True
    part = greenmim.testing.stage_partition(mask, 4, 2, channels=32, cache=False)
    N = part.num_tokens
    rg = dict(requires_grad=True)
    qkv = torch.randn(1, N, 3, 1, 32, generator=gen, **rg)
    q, k, v = (torch.randn(1, N, 1, 32, generator=gen, **rg) for _ in range(3))
    bias = torch.randn(49, 1, generator=gen, **rg)
    x = torch.randn(1, N, 32, generator=gen, **rg)
    y = torch.randn(1, part.gather.numel(), 32, generator=gen, **rg)
    nt, bt = greenmim.conv_tables.neighbor_table(mask, cache=False), greenmim.conv_tables.block_table(mask, 2, cache=False)
    xc = torch.randn(1, nt.num_tokens, 16, generator=gen, **rg)
    wd, bd = torch.randn(16, 1, 3, 3, generator=gen, **rg), torch.randn(16, generator=gen, **rg)
    wb, bb = torch.randn(32, 16, 2, 2, generator=gen, **rg), torch.randn(32, generator=gen, **rg)

    def grads_of(outs):
        return tuple(torch.randn(o.shape, generator=gen) for o in outs)

    table = {
        "attention_packed": lambda: (greenmim.group_window_attention_packed(qkv, bias, part),),
        "attention": lambda: (greenmim.group_window_attention(q, k, v, bias, part),),
        "partition": lambda: (greenmim.ops.partition_tokens(x, part),),
        "unpartition": lambda: (greenmim.ops.unpartition_tokens(y, part),),
        "depthwise_conv3x3": lambda: (greenmim.ops.submanifold_depthwise_conv3x3(xc, nt, wd, bd, residual=True),),
        "block_conv": lambda: (greenmim.ops.block_conv(xc, bt, wb, bb),),
    }

    def block():
        z = greenmim.ops.partition_tokens(x, part)
        o = greenmim.group_window_attention_packed(qkv, bias, part)
        return z, o, greenmim.ops.unpartition_tokens(z, part)

    table["swin_block (partition + attention + unpartition)"] = block
    return table, grads_of


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=1000)
    ap.add_argument("--ops", default=None, help="comma-separated op names (default: all)")
    ap.add_argument("--json", action="store_true", help="also print the rows as one JSON object on the last line")
    a = ap.parse_args(argv)
    if a.reps < 1:
        ap.error("--reps must be >= 1")
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    rows, grads_of = cases(gen)
    if a.ops:
        want = [o for o in a.ops.split(",") if o]
        bad = [o for o in want if o not in rows and not any(r.startswith(o) for r in rows)]
        if bad:
            ap.error(f"unknown ops {bad}; choose from {[r.split(' ')[0] for r in rows]}")
        rows = {r: f for r, f in rows.items() if any(r == o or r.startswith(o + " ") for o in want)}
    result = dict(torch=torch.__version__, reps=a.reps, rows=[])
    with null_kernels():
        plain = torch.randn(1, 64, 32)
        leaf = torch.randn(1, 64, 32, requires_grad=True)
        g = torch.randn(1, 64, 32)
        result["torch_add_us"] = add = min(_median_us(lambda: plain + plain, a.reps) for _ in range(3))
        result["torch_mul_fwd_bwd_us"] = mul = min(
            _median_us(_forward_backward(lambda: (leaf * 2,), (g,)), a.reps) for _ in range(3))
        qkv = torch.randn(1, 30, 3, 1, 32, requires_grad=True)
        bias, index = torch.randn(49, 1, requires_grad=True), [torch.zeros(60, dtype=torch.int32)] * 4
        apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, _Floor)
        result["function_floor_us"] = floor = min(_median_us(lambda: apply(qkv, bias, index, "auto"), a.reps)
                                                  for _ in range(3))
        print(f"== host time per call, kernels left out; torch {torch.__version__}, best of 3 medians of {a.reps}")
        print(f"scale: torch.add on a tiny tensor {add:.1f} us; a multiply forward + backward {mul:.1f} us; an "
              f"autograd.Function alone (C apply, 2 tensors made, 1 returned, 4 saved) {floor:.1f} us")
        print("| op | pass | fast path us | dispatcher us | saved |")
        print("|---|---|---|---|---|")
        with greenmim.emulate_cuda():
            for name, fwd in rows.items():
                grads = grads_of(fwd())
                for pas, fn in (("forward", fwd), ("forward + backward", _forward_backward(fwd, grads))):
                    fast, slow = [], []
                    for _ in range(3):
                        fast.append(_median_us(fn, a.reps))
                        with _eager.disabled():
                            slow.append(_median_us(fn, a.reps))
                    f, s = min(fast), min(slow)
                    result["rows"].append(dict(op=name.split(" ")[0], pass_=pas, fast_us=round(f, 2),
                                               dispatcher_us=round(s, 2)))
                    print(f"| {name} | {pas} | {f:.1f} | {s:.1f} | {100 * (1 - f / s):.0f}% |", flush=True)
    if a.json:
        for r in result["rows"]:
            r["pass"] = r.pop("pass_")
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
