"""The visible-token Swin encoder: equal to timm's SwinTransformer when every token is visible,
every attention equal to the window oracle under masks, per-sample packing equal to one sample
at a time, timm checkpoints loading parameter for parameter."""
import pytest
import torch

import greenmim
from conftest import oracle_attention

timm = pytest.importorskip("timm")

TINY = dict(img_size=224, patch_size=4, embed_dim=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8), window_size=7)


def _pair(dtype=torch.float64, **kw):
    cfg = {**TINY, **kw}
    ref = timm.models.swin_transformer.SwinTransformer(num_classes=0, drop_path_rate=0.0, **cfg).to(dtype).eval()
    ours = greenmim.VisibleSwinTransformer(**cfg).to(dtype).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ref, ours


def test_all_visible_equals_timm():
    ref, ours = _pair()
    x = torch.randn(2, 3, 224, 224, dtype=torch.float64)
    plan = ours.plan(torch.ones(7, 7, dtype=torch.bool))
    with torch.no_grad():
        want = ref.forward_features(x)                  # [B, 7, 7, C], cyclic shift + -100 mask
        got = ours.forward_features(x, plan)            # [B, 49, C]
    torch.testing.assert_close(got, want.reshape(2, 49, -1), rtol=1e-9, atol=1e-9)


def test_all_visible_per_sample_equals_timm():
    ref, ours = _pair()
    x = torch.randn(2, 3, 224, 224, dtype=torch.float64)
    plan = ours.plan(torch.ones(2, 7, 7, dtype=torch.bool))
    with torch.no_grad():
        got = ours.forward_features(x, plan)            # [1, 2 * 49, C]
        want = ref.forward_features(x).reshape(1, 98, -1)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def _attention_hooks(model, log):
    def hook(mod, args, kwargs, out):
        x, part = args
        norm = kwargs.get("norm")       # blocks hand the residual and norm1 (applied fused in training)
        log.append((mod, (norm(x) if norm is not None else x).detach(), part, out.detach()))
    return [m.register_forward_hook(hook, with_kwargs=True) for m in model.modules()
            if isinstance(m, greenmim.swin.GroupWindowAttention)]


@pytest.mark.parametrize("per_sample", [False, True])
def test_every_attention_equals_window_oracle(per_sample):
    _, ours = _pair()
    vis = greenmim.random_masks(3 if per_sample else None)
    plan = ours.plan(vis)
    log = []
    hooks = _attention_hooks(ours, log)
    with torch.no_grad():
        ours(torch.randn(3, 3, 224, 224, dtype=torch.float64), plan)
    for h in hooks:
        h.remove()
    assert len(log) == sum(TINY["depths"])
    shifted_seen = False
    for mod, x, part, out in log:
        shifted_seen |= part.shift > 0
        B, N, C = x.shape
        qkv = mod.qkv(x).view(B, N, 3, mod.num_heads, mod.head_dim)
        o = oracle_attention(*qkv.unbind(2), mod.relative_position_bias_table, part, part.window)
        torch.testing.assert_close(out, mod.proj(o.reshape(B, N, C)), rtol=1e-10, atol=1e-10)
    assert shifted_seen


def test_per_sample_equals_one_sample_at_a_time():
    _, ours = _pair()
    vis = greenmim.random_masks(3)
    x = torch.randn(3, 3, 224, 224, dtype=torch.float64)
    with torch.no_grad():
        plan = ours.plan(vis)
        packed = ours.forward_features(x, plan)
        cu = plan.stages[-1].cu_seqlens
        for b in range(3):
            alone = ours.forward_features(x[b:b + 1], ours.plan(vis[b]))
            torch.testing.assert_close(packed[:, int(cu[b]):int(cu[b + 1])], alone, rtol=1e-10, atol=1e-10)


def test_released_attention_impl_agrees_and_trains():
    ref, ours = _pair()
    rel = greenmim.VisibleSwinTransformer(**TINY, attn_impl="released").double()
    rel.load_state_dict(ours.state_dict())
    x = torch.randn(2, 3, 224, 224, dtype=torch.float64)
    plan = ours.plan(greenmim.random_masks())
    a, b = ours.forward_features(x, plan), rel.forward_features(x, plan)
    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
    a.square().mean().backward()
    b.square().mean().backward()
    for (n, p), (_, q) in zip(ours.named_parameters(), rel.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-7, atol=1e-9, msg=n)


@pytest.mark.parametrize("name", ["swin_base_patch4_window7_224", "swin_large_patch4_window7_224"])
def test_timm_checkpoint_loads_parameter_for_parameter(name):
    full = name == "swin_base_patch4_window7_224"      # Swin-L: names and shapes only (meta tensors)
    with torch.device("cpu" if full else "meta"):
        ref = timm.create_model(name, pretrained=False, num_classes=1000)
        ours = greenmim.create_model(name, num_classes=1000)
    sd = ref.state_dict()
    assert {k: tuple(v.shape) for k, v in sd.items()} == {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    ours.load_state_dict(sd, strict=True, assign=not full)
    if full:
        x = torch.randn(1, 3, 224, 224)
        with torch.no_grad():
            plan = ours.plan(torch.ones(7, 7, dtype=torch.bool))
            torch.testing.assert_close(ours.forward_features(x, plan), ref.eval().forward_features(x).reshape(1, 49, -1),
                                       rtol=2e-4, atol=2e-4)
            logits = ours.forward_head(ours.forward_features(x, plan), plan)
            torch.testing.assert_close(logits, ref(x), rtol=2e-4, atol=2e-4)


def test_training_step_reduces_loss_on_cpu():
    torch.manual_seed(0)
    model = greenmim.VisibleSwinTransformer(**TINY, drop_path_rate=0.1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(2, 3, 224, 224)
    plan = model.plan(greenmim.random_masks(2))
    target = torch.randn(1, plan.stages[-1].num_tokens, model.num_features)
    losses = []
    for _ in range(4):
        loss = (model.forward_features(x, plan) - target).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]
    assert model.layers[0].blocks[1].attn.relative_position_bias_table.grad.abs().sum() > 0


def test_simmim_192_window6_geometry():
    """SimMIM's recipe: 192 px, window 6, 32-px mask units covering 8x8 patches at stage 1, so
    windows (6x6) do not line up with mask units. All visible equals timm; masked, every
    attention equals the window oracle."""
    cfg = {**TINY, "img_size": 192, "window_size": 6}
    ref, ours = _pair(**{k: v for k, v in cfg.items() if k not in TINY or TINY[k] != v})
    x = torch.randn(2, 3, 192, 192, dtype=torch.float64)
    with torch.no_grad():
        got = ours.forward_features(x, ours.plan(torch.ones(6, 6, dtype=torch.bool)))
        want = ref.forward_features(x)
    torch.testing.assert_close(got, want.reshape(2, -1, want.shape[-1]), rtol=1e-9, atol=1e-9)
    plan = ours.plan(greenmim.random_masks(2, grid=6))
    assert [s.grid for s in plan.stages] == [(48, 48), (24, 24), (12, 12), (6, 6)]
    assert plan.stages[3].partitions[1].window == 6 and plan.stages[3].partitions[1].shift == 0
    log = []
    hooks = _attention_hooks(ours, log)
    with torch.no_grad():
        ours(x, plan)
    for h in hooks:
        h.remove()
    for mod, xin, part, out in log:
        B, N, C = xin.shape
        qkv = mod.qkv(xin).view(B, N, 3, mod.num_heads, mod.head_dim)
        o = oracle_attention(*qkv.unbind(2), mod.relative_position_bias_table, part, part.window)
        torch.testing.assert_close(out, mod.proj(o.reshape(B, N, C)), rtol=1e-10, atol=1e-10)


def test_forward_head_per_sample_equals_shared_per_image():
    ours = greenmim.VisibleSwinTransformer(**TINY, num_classes=5).double().eval()
    vis = greenmim.random_masks(3)
    x = torch.randn(3, 3, 224, 224, dtype=torch.float64)
    with torch.no_grad():
        plan = ours.plan(vis)
        packed = ours.forward_head(ours.forward_features(x, plan), plan)
        alone = torch.cat([ours.forward_head(ours.forward_features(x[b:b + 1], p), p) for b in range(3)
                           for p in [ours.plan(vis[b])]])
    assert packed.shape == (3, 5)
    torch.testing.assert_close(packed, alone, rtol=1e-10, atol=1e-10)
