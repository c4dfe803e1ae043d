#!/usr/bin/env python3
"""PyTorch baselines for greenmim's group window attention, on the partitions that
greenmim_gpu_bench wrote (``--json-dir``), so that every path runs on the same groups:

  released : the released GreenMIM code's path, in eager PyTorch: index_select gather into
             padded groups, dense q @ k^T, dense relative-position bias gathered from the table
             (zero across windows), additive -100 mask, softmax (fp32), @ v, index_select
             scatter back.
  sdpa_efficient : torch scaled_dot_product_attention, memory-efficient backend forced
             (sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION)), on the released path's grouped layout
             (same gather into padded groups), with the released path's bias and -100 mask
             materialized as a dense bf16 additive attn_mask [ng*H, G, G] broadcast over the batch
             (built from the table on every call, so the bias gradient flows as in the released path).
  flex     : FlexAttention (torch.compile'd) over the visible tokens sorted by window, with a
             document mask (same window id) and a score_mod adding the bias from the table;
             the permutation to and from window order is included in the time.

  released (compiled) : the released path under torch.compile (only with --paths ...,compiled:
             compiling every partition costs minutes).

Each is timed forward only and forward + backward (gradients of q, k, v and the bias table),
median of --reps runs with CUDA events after warm-up. bf16 inputs. Prints a markdown table and
writes a CSV. Nothing here is needed by the library; failures of one path are reported and the
others still run.
"""
import argparse
import csv
import glob
import json
import math
import os
import sys
import time
import traceback


def median_ms(fn, warmup, reps, cuda=True):
    import torch
    for _ in range(warmup):
        fn()
    if not cuda:  # --device cpu: a smoke test of this script, wall-clock times
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
        times.sort()
        return times[len(times) // 2]
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def load(path):
    with open(path) as f:
        return json.load(f)


def setup(cfg, batch, device):
    import torch
    H, D, p = cfg["heads"], cfg["head_dim"], cfg["window"]
    G, ng, N = cfg["group_size"], cfg["num_groups"], cfg["num_tokens"]
    S = G * ng
    R = (2 * p - 1) ** 2
    gather = torch.tensor(cfg["gather"], dtype=torch.long)
    scatter = torch.tensor(cfg["scatter"], dtype=torch.long)
    win = torch.tensor(cfg["slot_window"], dtype=torch.long)
    crd = torch.tensor(cfg["slot_coord"], dtype=torch.long)
    hh, ww = crd >> 16, crd & 0xFFFF
    # released path: padding slots read an appended zero row (index N)
    gather_pad = torch.where(gather >= 0, gather, torch.full_like(gather, N))
    wg, hg, wwg = win.view(ng, G), hh.view(ng, G), ww.view(ng, G)
    same = (wg[:, :, None] == wg[:, None, :]) & (wg[:, :, None] >= 0)
    rel = (hg[:, :, None] - hg[:, None, :] + p - 1) * (2 * p - 1) + (wwg[:, :, None] - wwg[:, None, :] + p - 1)
    rel = torch.where(same, rel, torch.full_like(rel, R))  # row R of the extended table is zero
    mask = torch.where(same, 0.0, -100.0)
    # flex path: real slots in slot order = tokens sorted by window
    real = gather >= 0
    perm = gather[real]
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(N)
    doc = win[real]
    th, tw = hh[real], ww[real]
    d = dict(H=H, D=D, p=p, G=G, ng=ng, N=N, S=S, R=R, B=batch)
    for k, v in dict(gather_pad=gather_pad, scatter=scatter, rel=rel, mask=mask, perm=perm, inv=inv, doc=doc,
                     th=th, tw=tw).items():
        d[k] = v.to(device)
    return d


def released_forward(s, qkv, table):
    """qkv: [B, N, 3, H, D] bf16; table: [R, H] float32. Returns [B, N, H, D]."""
    import torch
    B, N, H, D, G, ng, S = s["B"], s["N"], s["H"], s["D"], s["G"], s["ng"], s["S"]
    x = torch.cat([qkv, qkv.new_zeros(B, 1, 3, H, D)], 1)
    xg = x.index_select(1, s["gather_pad"]).view(B * ng, G, 3, H, D).permute(2, 0, 3, 1, 4)
    q, k, v = xg[0] * (D ** -0.5), xg[1], xg[2]
    attn = q @ k.transpose(-2, -1)  # [B*ng, H, G, G]
    ext = torch.cat([table, table.new_zeros(1, H)], 0)
    bias = ext[s["rel"].view(-1)].view(ng, G, G, H).permute(0, 3, 1, 2)
    attn = attn.view(B, ng, H, G, G).float() + bias.unsqueeze(0) + s["mask"].view(1, ng, 1, G, G)
    attn = attn.softmax(-1).to(qkv.dtype).view(B * ng, H, G, G)
    o = (attn @ v).transpose(1, 2).reshape(B, S, H, D)
    return o.index_select(1, s["scatter"])


def make_sdpa_efficient(s, table):
    """The grouped layout of the released path through SDPA's memory-efficient kernel, with the
    bias + mask as a dense additive attn_mask. Raises if that backend refuses the inputs."""
    import torch
    import torch.nn.functional as F
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def efficient_only():
            return sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION)
    except ImportError:  # torch < 2.3
        def efficient_only():
            return torch.backends.cuda.sdp_kernel(enable_flash=False, enable_math=False, enable_mem_efficient=True)
    B, H, D, G, ng, S = s["B"], s["H"], s["D"], s["G"], s["ng"], s["S"]
    maskv = s["mask"].view(ng, 1, G, G)

    def forward(qkv):
        x = torch.cat([qkv, qkv.new_zeros(B, 1, 3, H, D)], 1)
        xg = x.index_select(1, s["gather_pad"]).view(B, ng, G, 3, H, D).permute(3, 0, 1, 4, 2, 5)  # [3,B,ng,H,G,D]
        q, k, v = (xg[i].reshape(B, ng * H, G, D) for i in range(3))
        ext = torch.cat([table, table.new_zeros(1, H)], 0)
        bias = ext[s["rel"].view(-1)].view(ng, G, G, H).permute(0, 3, 1, 2)  # [ng, H, G, G]
        attn_mask = (bias + maskv).to(qkv.dtype).reshape(1, ng * H, G, G)  # broadcast over B
        with efficient_only():
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=D ** -0.5)
        o = o.view(B, ng, H, G, D).transpose(2, 3).reshape(B, S, H, D)
        return o.index_select(1, s["scatter"])

    return forward


def make_flex(s, table):
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    doc, th, tw, p, R = s["doc"], s["th"], s["tw"], s["p"], s["R"]

    def mask_mod(b, h, q_idx, kv_idx):
        return doc[q_idx] == doc[kv_idx]

    def score_mod(score, b, h, q_idx, kv_idx):
        rel = (th[q_idx] - th[kv_idx] + p - 1) * (2 * p - 1) + (tw[q_idx] - tw[kv_idx] + p - 1)
        rel = torch.clamp(rel, 0, R - 1)  # cross-window pairs are masked; keep the index in range
        return score + table[rel, h]

    block_mask = create_block_mask(mask_mod, B=None, H=None, Q_LEN=s["N"], KV_LEN=s["N"], device=table.device)
    flex = torch.compile(flex_attention)

    def forward(qkv):
        x = qkv.index_select(1, s["perm"])  # window order
        q, k, v = (x[:, :, i].transpose(1, 2) for i in range(3))  # [B, H, N, D]
        o = flex(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=s["D"] ** -0.5)
        return o.transpose(1, 2).index_select(1, s["inv"])  # back to token order

    return forward


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json-dir", required=True)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--csv", default="")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a smoke test of the script at toy sizes (times meaningless)")
    ap.add_argument("--budget-s", type=float, default=0,
                    help="stop starting new rows after this many seconds (0: no limit); rows left out are named")
    ap.add_argument("--paths", default="released,sdpa_efficient,flex",
                    help="comma-separated subset of released,sdpa_efficient,flex,compiled (default: all but compiled)")
    args = ap.parse_args()
    want = set(p.strip() for p in args.paths.split(",") if p.strip())
    unknown = want - {"released", "sdpa_efficient", "flex", "compiled"}
    if unknown:
        print(f"torch_bench: unknown --paths {sorted(unknown)}")
        return 2
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        print(f"torch_bench: PyTorch not importable ({e}); skipped")
        return 0
    if args.device == "cpu":  # smoke test of the script itself (SDPA's memory-efficient kernel is CUDA-only)
        dev = torch.device("cpu")
        print(f"torch {torch.__version__}, device cpu (smoke test: times are meaningless)")
    elif not torch.cuda.is_available():
        print("torch_bench: no CUDA device visible to PyTorch; skipped")
        return 0
    else:
        dev = torch.device("cuda")
        print(f"torch {torch.__version__}, device {torch.cuda.get_device_name(0)}")
    on_cuda = dev.type == "cuda"
    files = sorted(glob.glob(os.path.join(args.json_dir, "partition_stage*_shift*.json")))
    if not files:
        print(f"torch_bench: no partition JSON in {args.json_dir}")
        return 1
    # every partition's inputs first, then the rows path by path (released, compiled, sdpa, flex),
    # so that a --budget-s cut leaves out the slowest paths' rows, not the cheap ones
    cases = []  # (path order, partition order, tag, cfg, s, qkv, table, dout, name, fwd)
    for pi, path in enumerate(files):
        cfg = load(path)
        s = setup(cfg, cfg["batch"], dev)
        B, N, H, D = s["B"], s["N"], s["H"], s["D"]
        gen = torch.Generator(device=dev).manual_seed(1234)
        qkv = torch.randn(B, N, 3, H, D, device=dev, generator=gen).to(torch.bfloat16).requires_grad_(True)
        table = (0.5 * torch.randn(s["R"], H, device=dev, generator=gen)).requires_grad_(True)
        dout = torch.randn(B, N, H, D, device=dev, generator=gen).to(torch.bfloat16)
        tag = f"stage {cfg['stage']} shift {cfg['shift']}"
        paths = []
        if "released" in want:
            paths.append((0, "released (eager)", lambda x, s=s, table=table: released_forward(s, x, table)))
        if "compiled" in want:
            paths.append((1, "released (compiled)",
                          torch.compile(lambda x, s=s, table=table: released_forward(s, x, table))))
        makers = [(2, "sdpa_efficient", "sdpa (mem-efficient, dense bias)", make_sdpa_efficient),
                  (3, "flex", "flex_attention", make_flex)]
        for order, key, name, make in makers:
            if key not in want:
                continue
            try:
                paths.append((order, name, make(s, table)))
            except Exception as e:  # noqa: BLE001
                print(f"{tag}: {name} unavailable: {e}")
        for order, name, fwd in paths:
            cases.append((order, pi, tag, cfg, s, qkv, table, dout, name, fwd))
    cases.sort(key=lambda c: (c[0], c[1]))
    rows = []
    t_start = time.monotonic()
    skipped = []
    for _, _, tag, cfg, s, qkv, table, dout, name, fwd in cases:
        if args.budget_s > 0 and time.monotonic() - t_start > args.budget_s:
            skipped.append(f"{tag} {name}")
            continue
        try:
            ref = released_forward(s, qkv, table).float()
            out = fwd(qkv)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            with torch.no_grad():
                t_f = median_ms(lambda: fwd(qkv), args.warmup, args.reps, on_cuda)

            def fb():
                qkv.grad = None
                table.grad = None
                fwd(qkv).backward(dout)

            try:
                t_fb = median_ms(fb, args.warmup, args.reps, on_cuda)
            except Exception as e:  # noqa: BLE001
                print(f"{tag} {name}: backward failed: {e}")
                t_fb = float("nan")
            rows.append(dict(path=name, stage=cfg["stage"], shift=cfg["shift"], G=s["G"], groups=s["ng"],
                             tokens=s["N"], batch=s["B"], fwd_ms=t_f, fwd_bwd_ms=t_fb, rel_err_vs_released=err))
        except Exception:  # noqa: BLE001
            print(f"{tag} {name}: failed")
            traceback.print_exc()
    print("\n| path | stage | shift | G | groups | tokens/sample | forward ms | forward+backward ms | rel. diff vs released |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['path']} | {r['stage']} | {r['shift']} | {r['G']} | {r['groups']} | {r['tokens']} | "
              f"{r['fwd_ms']:.4f} | {r['fwd_bwd_ms']:.4f} | {r['rel_err_vs_released']:.2e} |")
    if skipped:
        print(f"\nskipped for the --budget-s {args.budget_s:g} s limit: " + "; ".join(skipped))
    if args.csv and rows:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            w.writeheader()
            w.writerows(rows)
        print(f"\nwrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
