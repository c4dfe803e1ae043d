"""Plain-torch oracles of the visible-token Twins layers (test_twins.py): each scatters the
visible tokens into a zero-filled dense grid, runs the dense layer (timm's arithmetic, with the
masked cells read as zero and masked keys excluded), and reads the result back at the visible
cells. Nothing here uses a plan's partition, neighbour or block tables: only each stage's
token positions (``position``: b*H*W + h*W + w per sample)."""
import torch
import torch.nn.functional as F


def to_dense(x, stage):
    """Tokens ``[B, N, C]`` (shared) or ``[1, sum N_b, C]`` (per sample) as a zero-filled grid
    ``[Bd, H, W, C]`` and its visibility ``[Bd, H, W]``."""
    H, W = stage.grid
    pos = stage.position.long()
    C = x.shape[-1]
    if stage.cu_seqlens is None:
        d = x.new_zeros(x.shape[0], H * W, C)
        d[:, pos] = x
        vis = torch.zeros(x.shape[0], H * W, dtype=torch.bool)
        vis[:, pos] = True
    else:
        M = stage.num_masks
        d = x.new_zeros(M * H * W, C)
        d[pos] = x[0]
        vis = torch.zeros(M * H * W, dtype=torch.bool)
        vis[pos] = True
    return d.view(-1, H, W, C), vis.view(-1, H, W)


def from_dense(d, position, per_sample):
    """The grid ``[Bd, H, W, C]`` read at the token positions, in the token layout."""
    pos = position.long()
    C = d.shape[-1]
    if per_sample:
        return d.reshape(-1, C)[pos].unsqueeze(0)
    return d.reshape(d.shape[0], -1, C)[:, pos]


def _attend(q, k, v, key_ok, scale):
    """``q`` ``[Bd, L, h, D]``, ``k``/``v`` ``[Bd, S, h, D]``, ``key_ok`` ``[Bd, S]``."""
    s = torch.einsum("blhd,bshd->bhls", q * scale, k).masked_fill(~key_ok[:, None, None, :], float("-inf"))
    return torch.einsum("bhls,bshd->blhd", s.softmax(-1), v)


def lsa(mod, x, stage):
    """LocallyGroupedAttn: each visible token attends the visible tokens of its ws x ws window."""
    d, vis = to_dense(x, stage)
    Bd, H, W, C = d.shape
    ws, h = mod.ws, mod.num_heads
    qkv = mod.qkv(d).view(Bd, H // ws, ws, W // ws, ws, 3, h, C // h)
    qkv = qkv.permute(0, 1, 3, 2, 4, 5, 6, 7).reshape(-1, ws * ws, 3, h, C // h)
    ok = vis.view(Bd, H // ws, ws, W // ws, ws).permute(0, 1, 3, 2, 4).reshape(-1, ws * ws)
    o = _attend(*qkv.unbind(2), ok, mod.scale)             # windows without a visible token: NaN, never read
    o = o.reshape(Bd, H // ws, W // ws, ws, ws, C).permute(0, 1, 3, 2, 4, 5).reshape(Bd, H, W, C)
    return mod.proj(from_dense(o, stage.position, stage.cu_seqlens is not None))


def gsa(mod, x, stage):
    """GlobalSubSampleAttn: keys and values from the dense sr x sr conv of the zero-filled grid,
    kept where a block holds a visible token; every visible query attends its sample's keys."""
    d, vis = to_dense(x, stage)
    Bd, H, W, C = d.shape
    h = mod.num_heads
    q = mod.q(d).view(Bd, H * W, h, C // h)
    if mod.sr is not None:
        src = mod.norm(mod.sr(d.permute(0, 3, 1, 2)).flatten(2).transpose(1, 2))
        ok = F.max_pool2d(vis[:, None].double(), mod.sr_ratio).flatten(1) > 0
    else:
        src, ok = d.view(Bd, H * W, C), vis.view(Bd, H * W)
    k, v = mod.kv(src).view(Bd, -1, 2, h, C // h).unbind(2)
    o = _attend(q, k, v, ok, (C // h) ** -0.5).reshape(Bd, H, W, C)
    return mod.proj(from_dense(o, stage.position, stage.cu_seqlens is not None))


def peg(mod, x, stage):
    """PosConv: the dense depthwise 3x3 conv of the zero-filled grid (+ x), at the visible cells."""
    d, _ = to_dense(x, stage)
    conv = mod.proj[0]
    y = conv(d.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
    if mod.residual:
        y = y + d
    return from_dense(y, stage.position, stage.cu_seqlens is not None)


def embed(mod, x, prev):
    """SparsePatchEmbed: the dense 2x2 stride-2 conv of the zero-filled grid and LayerNorm, read
    at the next stage's tokens; also returns the next stage's visibility by the any rule."""
    d, vis = to_dense(x, prev)
    y = mod.norm(mod.proj(d.permute(0, 3, 1, 2)).permute(0, 2, 3, 1))
    nxt = F.max_pool2d(vis[:, None].double(), 2)[:, 0] > 0
    return from_dense(y, prev.embed.position, prev.cu_seqlens is not None), nxt
