"""Shared helpers of the package tests: random masks and plans, and an independent oracle."""
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import greenmim


def pytest_report_header(config):
    return f"torch {torch.__version__}, greenmim libs from {os.environ.get('GREENMIM_LIB_DIR', '(default search)')}"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(int.from_bytes(os.urandom(4), "little") if os.environ.get("GREENMIM_RANDOM_SEED") else 1234)
    yield


def random_stage_mask(grid, unit, batch=None, keep=None, gen=None):
    """A mask at token resolution `grid x grid` made of `unit x unit` blocks (mask units)."""
    u = grid // unit
    B = 1 if batch is None else batch
    m = torch.zeros(B, u * u, dtype=torch.bool)
    for b in range(B):
        k = keep if keep is not None else int(torch.randint(1, u * u + 1, (1,), generator=gen))
        m[b, torch.randperm(u * u, generator=gen)[:k]] = True
    m = m.view(B, u, u).repeat_interleave(unit, 1).repeat_interleave(unit, 2)
    return m[0] if batch is None else m


def token_coords(part):
    """(h, w) of each token of the axis, from the partition alone."""
    c = part.slot_coord.long()[part.scatter.long()]
    return c >> 16, c & 0xFFFF


def oracle_attention(q, k, v, bias_table, part, window, scale=None):
    """Dense window-by-window attention over the token axis in plain torch: token i attends the
    tokens of its own window (same sample), nothing else. No groups, no padding."""
    B, N, H, D = q.shape
    scale = D ** -0.5 if scale is None else scale
    tw = part.token_window.long()
    h, w = token_coords(part)
    same = tw[:, None] == tw[None, :]
    s = torch.einsum("bihd,bjhd->bhij", q * scale, k)
    if bias_table is not None:
        rel = ((h[:, None] - h[None, :]) + window - 1) * (2 * window - 1) + (w[:, None] - w[None, :]) + window - 1
        rel = torch.where(same, rel, torch.zeros_like(rel))
        s = s + bias_table[rel.view(-1)].view(N, N, H).permute(2, 0, 1).to(q.dtype)
    s = s.masked_fill(~same, float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", s.softmax(-1), v)


def released_tree(sd):
    """A greenmim state dict laid out as the released MaskedAutoencoder's: each downsample closes
    the stage before (layers.i.downsample -> layers.i-1.downsample), plus its derived buffers."""
    out = {}
    for k, v in sd.items():
        parts = k.split(".")
        if k.startswith("encoder.layers.") and parts[3] == "downsample":
            parts[2] = str(int(parts[2]) - 1)
        out[".".join(parts)] = v
        if k.endswith("attn.relative_position_bias_table"):
            out[k.replace("relative_position_bias_table", "relative_position_index")] = torch.zeros(49, 49,
                                                                                                   dtype=torch.long)
    return out


def row_first_merge(x, weights):
    """Patch merging as the 2022 released code did it: a 2x2 block concatenated row-first
    (0,0), (0,1), (1,0), (1,1), LayerNorm(4C) (eps 1e-5), then the reduction; ``x`` [B, H, W, C],
    ``weights`` the downsample's norm.weight, norm.bias, reduction.weight."""
    C = x.shape[-1]
    row_first = torch.cat([x[:, 0::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 0::2], x[:, 1::2, 1::2]], -1)
    y = torch.nn.functional.layer_norm(row_first, (4 * C,), weights["norm.weight"], weights["norm.bias"], eps=1e-5)
    return y @ weights["reduction.weight"].T


ROOT = pathlib.Path(__file__).resolve().parents[2]

# one rank of greenmim.pretrain under torchrun, saving its (full) parameters and losses
_RANK_DRIVER = """
import sys, torch
from greenmim.pretrain import args as A, dist, engine
a = A.parser().parse_args(sys.argv[2:])
A.validate(a)
ctx = dist.setup(a.device, a.fsdp)
s = engine.run(a, ctx)
sd = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu().clone()
      for k, v in s["model"].state_dict().items()}
torch.save({"params": sd, "losses": s["losses"]}, f"{sys.argv[1]}/rank{ctx.rank}.pt")
dist.teardown(ctx)
"""


def child_env(**extra):
    """This interpreter's environment for a child process: the package on PYTHONPATH, one thread."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    env.update(extra)
    return env


def torchrun_ranks(tmp_path, name, nproc, *argv):
    """``greenmim.pretrain`` with ``argv`` under ``torchrun --standalone --nproc_per_node nproc``:
    (the completed process, each rank's {"params", "losses"}, or None when it failed)."""
    d = tmp_path / name
    d.mkdir()
    driver = tmp_path / "rank_driver.py"
    driver.write_text(_RANK_DRIVER)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(driver),
           str(d), *argv]
    out = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=600)
    return out, [torch.load(d / f"rank{r}.pt", weights_only=False) for r in range(nproc)] if out.returncode == 0 \
        else None
