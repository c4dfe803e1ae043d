#!/usr/bin/env python3
"""GSA under per-sample masks: ways to let each sample's visible queries attend that sample's
sub-sampled keys only, timed forward + backward at Twins-L's GSA shapes (224 px, sr 8/4/2/1),
with per-sample masks of uneven sizes (each sample keeps 15-35% of its patches; the key axis
is the sr x sr blocks with a visible patch).

- padded: greenmim's choice (twins.subsampled_attention): queries and keys scattered into
  ``[B, max, ...]``, padded keys masked, one SDPA;
- loop: one SDPA per sample over its slices (a host sync for the offsets, B launches);
- nested: SDPA on jagged nested tensors (torch.nested, layout=torch.jagged);
- flex: FlexAttention over the packed axis with a document mask (compiled; skipped where it
  does not run).

Each is checked against the padded result first.

    OMP_NUM_THREADS=1 python bench/twins_gsa.py [--batch 8] [--reps 5] [--dtype float32]
"""
import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import greenmim
from greenmim.twins import subsampled_attention

# Twins-L GSA: (stage, channels, heads, sr)
STAGES = [(1, 128, 4, 8), (2, 256, 8, 4), (3, 512, 16, 2), (4, 1024, 32, 1)]


def loop(q, k, v, st):
    cu, kcu = st.cu_seqlens.tolist(), st.key_cu_seqlens.tolist()
    out = []
    for b in range(len(cu) - 1):
        qs, ks, vs = (t[0, a:e].transpose(0, 1) for t, (a, e) in ((q, cu[b:b + 2]), (k, kcu[b:b + 2]), (v, kcu[b:b + 2])))
        out.append(F.scaled_dot_product_attention(qs, ks, vs).transpose(0, 1))
    return torch.cat(out).unsqueeze(0)


def nested(q, k, v, st):
    cu, kcu = st.cu_seqlens.long(), st.key_cu_seqlens.long()
    nq = torch.nested.nested_tensor_from_jagged(q[0], cu).transpose(1, 2)
    nk = torch.nested.nested_tensor_from_jagged(k[0], kcu).transpose(1, 2)
    nv = torch.nested.nested_tensor_from_jagged(v[0], kcu).transpose(1, 2)
    return F.scaled_dot_product_attention(nq, nk, nv).transpose(1, 2).values().unsqueeze(0)


def make_flex(st):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    qdoc = greenmim.layers.token_samples(st, st.num_tokens, "cpu")
    kst = type("S", (), {"cu_seqlens": st.key_cu_seqlens})()
    kdoc = greenmim.layers.token_samples(kst, st.num_keys, "cpu")
    mask = create_block_mask(lambda b, h, qi, ki: qdoc[qi] == kdoc[ki], None, None, st.num_tokens, st.num_keys,
                             device="cpu")
    fa = torch.compile(flex_attention)

    def run(q, k, v, st):
        return fa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=mask).transpose(1, 2)
    return run


def timed(fn, q, k, v, st, reps):
    ts = []
    for i in range(reps + 1):
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
        t0 = time.perf_counter()
        o = fn(qq, kk, vv, st)
        o.backward(torch.ones_like(o))
        if i:
            ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3, o.detach()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--no-flex", action="store_true")
    a = ap.parse_args(argv)
    dt = getattr(torch, a.dtype)
    g = torch.Generator().manual_seed(0)
    keep = 0.15 + 0.2 * torch.rand(a.batch, 1, 1, generator=g)
    vis = torch.rand(a.batch, 56, 56, generator=g) < keep
    plan = greenmim.plan_twins(vis)
    print(f"== GSA forward+backward, Twins-L, batch {a.batch} per-sample masks (15-35% of patches), {a.dtype}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); ms, median of {a.reps}")
    print("| stage | queries (max/sample) | keys (max/sample) | padded | loop | nested | flex |")
    print("|---|---|---|---|---|---|---|")
    for s, C, H, sr in STAGES:
        st = plan.stages[s - 1]
        D = C // H
        q = torch.randn(1, st.num_tokens, H, D, dtype=dt, generator=g)
        k = torch.randn(1, st.num_keys, H, D, dtype=dt, generator=g)
        v = torch.randn(1, st.num_keys, H, D, dtype=dt, generator=g)
        ref_ms, ref = timed(subsampled_attention, q, k, v, st, a.reps)
        row = [f"{ref_ms:.2f}"]
        fns = [loop, nested] + ([] if a.no_flex else ["flex"])
        for fn in fns:
            try:
                fn = make_flex(st) if fn == "flex" else fn
                ms, o = timed(fn, q, k, v, st, a.reps)
                torch.testing.assert_close(o, ref, rtol=1e-4, atol=1e-5)
                row.append(f"{ms:.2f}")
            except Exception as e:                       # noqa: BLE001 (a layout torch cannot run here)
                row.append(f"n/a ({type(e).__name__})")
        print(f"| {s} (sr {sr}) | {st.num_tokens} ({st.max_tokens}) | {st.num_keys} ({st.max_keys}) | "
              + " | ".join(row) + (" | skipped |" if a.no_flex else " |"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
