#!/usr/bin/env python3
"""Twins' convolutions on visible tokens against their peers, at Twins-L's shapes (224 px,
32-px mask units, batch --batch, bf16 on CUDA), forward and forward+backward, median ms:

  depthwise 3x3 (PEG)  greenmim.ops.submanifold_depthwise_conv3x3 on the visible tokens, against
                       a copy of the same bytes (x.clone(): the bandwidth ceiling; target: the
                       conv at >= 70% of the copy's rate at stage 1), and the masked dense conv
                       in cuDNN (zero the masked cells, convolve the whole grid: ConvNeXt V2's
                       and SparK's choice, the peer to beat at 25-40% visible tokens)
  block conv           greenmim.ops.block_conv (GSA sub-sampling sr 8/4/2, patch embedding s 2) on
                       the plan's tables: its default, one GEMM over a view of the tokens (the
                       plan's block-major order makes whole blocks runs of tokens), and two rows
                       of the paths a table with partly visible blocks takes: "(gather +
                       cuBLAS)", the rows gathered then cuBLAS, and "(fused kernels)", the C
                       ABI's gather-GEMM kernels; against the same GEMM in cuBLAS (torch.mm on
                       [N_out, s*s*C_in] rows, bf16 weights; target: >= 60% of its rate), the
                       same GEMM as a mixed-precision layer pays it (F.linear under autocast with
                       fp32 weight and bias: their casts, the bias, fp32 gradients) and the dense
                       cuDNN conv over the full grid (target: faster); and the default path with
                       the weight channels_last (as after model.to(memory_format=
                       torch.channels_last)), against the autocast layer

On CUDA each callable is captured in a CUDA graph and its replays timed with events (the GPU's
time, as the trainer's --cuda_graphs runs them); --eager times each call alone, synchronized,
host time included (what an eager step pays: 40-100 us a call here, more than most kernels).

Rates: the depthwise conv moves 2 N C elements (in, out; the table is small), the block conv
does N_out * s^2 C_in * C_out multiply-adds. Visible ratios: --keep (default 0.25,0.40).

    python bench/gpu/twins_ops.py [--batch 64] [--keep 0.25,0.4] [--reps 20] [--csv out.csv]
    python bench/gpu/twins_ops.py --device cpu --batch 1 --reps 1     # a smoke run (times mean nothing)
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import greenmim

# stage: (grid, C, sr of GSA, C of the next stage)
STAGES = {1: (56, 128, 8, 256), 2: (28, 256, 4, 512), 3: (14, 512, 2, 1024)}


def timed(fn, reps, warmup, cuda, graphs=True):
    if cuda and graphs:
        return timed_graph(fn, reps, max(warmup, 2))
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def timed_graph(fn, reps, warmup, per=10):
    """Median over `reps` of (`per` replays of fn captured in a CUDA graph, timed with events) / per."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(per):
            g.replay()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) / per)
    del g
    return statistics.median(ts)


def fwd_bwd(f, *inputs):
    def run():
        out = f(*inputs)
        out.backward(torch.ones_like(out))
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--keep", default="0.25,0.4", help="fractions of visible mask units")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--csv", default="")
    ap.add_argument("--eager", action="store_true", help="time each call alone, host time included (no CUDA graphs)")
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    dt = torch.bfloat16 if cuda else torch.float32
    name = torch.cuda.get_device_name(dev) if cuda else "CPU (smoke run: times mean nothing)"
    how = "eager calls, host time included" if a.eager or not cuda else "CUDA graph replays, GPU time"
    print(f"== Twins ops on visible tokens, Twins-L shapes, batch {a.batch}, {dt}, {name}, torch {torch.__version__}, "
          f"{how}")
    print("| op | stage | visible | greenmim fwd ms | fwd+bwd ms | peer | peer fwd ms | peer fwd+bwd ms | "
          "greenmim rate | peer rate | rate ratio | speed-up vs peer (fwd, fwd+bwd) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    g = torch.Generator().manual_seed(0)
    T = lambda ms: ms * 1e-3

    def emit(op, stage, keep, ours, peer, peer_t, rate_ours, rate_peer, unit):
        r = dict(op=op, stage=stage, visible=keep, fwd_ms=ours[0], fwd_bwd_ms=ours[1], peer=peer, peer_fwd_ms=peer_t[0],
                 peer_fwd_bwd_ms=peer_t[1], rate=rate_ours, peer_rate=rate_peer, unit=unit)
        rows.append(r)
        print(f"| {op} | {stage} | {keep:.2f} | {ours[0]:.3f} | {ours[1]:.3f} | {peer} | {peer_t[0]:.3f} | "
              f"{peer_t[1]:.3f} | {rate_ours:.1f} {unit} | {rate_peer:.1f} {unit} | {rate_ours / rate_peer:.2f} | "
              f"{peer_t[0] / ours[0]:.2f}x, {peer_t[1] / ours[1]:.2f}x |",
              flush=True)

    for keep in [float(k) for k in a.keep.split(",")]:
        vis = greenmim.random_masks(a.batch, ratio=1 - keep, generator=g)
        plan = greenmim.plan_twins(vis, device=dev)
        for s, (grid, C, sr, C_next) in STAGES.items():
            st = plan.stages[s - 1]
            N = st.num_tokens
            x = torch.randn(1, N, C, device=dev, dtype=dt, requires_grad=True)
            run = lambda f, *i: (timed(lambda: f(*i), a.reps, a.warmup, cuda, not a.eager),
                                 timed(fwd_bwd(f, *i), a.reps, a.warmup, cuda, not a.eager))
            # PEG
            w = torch.randn(C, 1, 3, 3, device=dev, requires_grad=True)
            b = torch.randn(C, device=dev, requires_grad=True)
            peg = lambda x: greenmim.ops.submanifold_depthwise_conv3x3(x, st.neighbors, w, b, residual=True)
            ours = run(peg, x)
            gbs = lambda ms: 2 * N * C * x.element_size() / T(ms) / 1e9
            copy = run(lambda x: x.clone(), x)
            emit("depthwise 3x3", s, keep, ours, "copy", copy, gbs(ours[0]), gbs(copy[0]), "GB/s")
            dense = torch.randn(a.batch, C, grid, grid, device=dev, dtype=dt, requires_grad=True)
            m = torch.zeros(a.batch * grid * grid, device=dev, dtype=dt)
            m[st.position.long()] = 1
            m = m.view(a.batch, 1, grid, grid)
            cudnn = lambda d: F.conv2d(d * m, w.to(dt), b.to(dt), padding=1, groups=C)
            peer = run(cudnn, dense)
            emit("depthwise 3x3", s, keep, ours, "masked dense cuDNN", peer, gbs(ours[0]), gbs(peer[0]), "GB/s")
            # block convs: GSA sub-sampling (C -> C, sr) and the patch embedding (C -> C_next, 2)
            for op, table, k, co in (("GSA sr conv", st.keys, sr, C), ("patch embedding", st.embed, 2, C_next)):
                wk = torch.randn(co, C, k, k, device=dev, requires_grad=True)
                bk = torch.randn(co, device=dev, requires_grad=True)
                ours = run(lambda x: greenmim.ops.block_conv(x, table, wk, bk), x)
                n_out = table.num_outputs
                tflops = lambda ms: 2 * n_out * k * k * C * co / T(ms) / 1e12
                A = torch.randn(n_out, k * k * C, device=dev, dtype=dt, requires_grad=True)
                Wm = torch.randn(k * k * C, co, device=dev, dtype=dt, requires_grad=True)
                gemm = run(lambda A: A @ Wm, A)
                emit(op, s, keep, ours, "cuBLAS GEMM", gemm, tflops(ours[0]), tflops(gemm[0]), "TFLOP/s")
                # the same GEMM as a mixed-precision layer pays it: fp32 weight and bias cast under
                # autocast (what timm's nn.Linear costs in an AMP step), the gradients back in fp32
                W32 = torch.randn(co, k * k * C, device=dev, requires_grad=True)
                b32 = torch.randn(co, device=dev, requires_grad=True)

                def amp_linear(A):
                    with torch.autocast(dev.type, dtype=dt, enabled=cuda):
                        return F.linear(A, W32, b32)
                amp = run(amp_linear, A)
                emit(op, s, keep, ours, "autocast F.linear (fp32 weight, bias)", amp, tflops(ours[0]), tflops(amp[0]),
                     "TFLOP/s")
                # the weight channels_last (model.to(memory_format=torch.channels_last)): W''s copy
                # and its gradient's read and write C_in contiguously
                wk_cl = wk.detach().to(memory_format=torch.channels_last).requires_grad_(True)
                cl = run(lambda x: greenmim.ops.block_conv(x, table, wk_cl, bk), x)
                emit(op + " (channels_last weight)", s, keep, cl, "autocast F.linear (fp32 weight, bias)", amp,
                     tflops(cl[0]), tflops(amp[0]), "TFLOP/s")
                gathered = dataclasses.replace(table, reshape=False)     # the path of partly visible blocks
                via_gather = run(lambda x: greenmim.ops.block_conv(x, gathered, wk, bk), x)
                emit(op + " (gather + cuBLAS)", s, keep, via_gather, "cuBLAS GEMM", gemm, tflops(via_gather[0]),
                     tflops(gemm[0]), "TFLOP/s")
                fused = run(lambda x: greenmim.ops.block_conv(x, table, wk, bk, algo="fused"), x)
                emit(op + " (fused kernels)", s, keep, fused, "cuBLAS GEMM", gemm, tflops(fused[0]), tflops(gemm[0]),
                     "TFLOP/s")
                full = run(lambda d: F.conv2d(d, wk.to(dt), bk.to(dt), stride=k), dense)
                dense_tf = lambda ms: 2 * a.batch * (grid // k) ** 2 * k * k * C * co / T(ms) / 1e12
                emit(op, s, keep, ours, "dense cuDNN conv (all tokens)", full, tflops(ours[0]), dense_tf(full[0]),
                     "TFLOP/s")
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=list(rows[0]))
            wr.writeheader()
            wr.writerows(rows)
    print("twins_ops: done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
