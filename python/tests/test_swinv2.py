"""Swin V2 on visible tokens: equal to timm's SwinTransformerV2 with every token visible, each
attention equal to the window oracle under masks (windows that do not line up with mask units
included), gradients through the position-bias MLP, timm state_dicts loading."""
import math

import pytest
import torch

import greenmim
from conftest import oracle_attention

timm = pytest.importorskip("timm")
from timm.models.swin_transformer_v2 import SwinTransformerV2  # noqa: E402

TINY = dict(embed_dim=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8))


def _pair(img_size, window_size, dtype=torch.float64):
    ref = SwinTransformerV2(img_size=img_size, window_size=window_size, num_classes=0, **TINY).to(dtype).eval()
    with torch.no_grad():                       # non-trivial values for the V2-specific parameters
        for n, p in ref.named_parameters():
            if n.endswith(("q_bias", "v_bias")):
                p.normal_(0, 0.1)
            if n.endswith("logit_scale"):
                p.uniform_(math.log(5.0), math.log(200.0))   # some above the log(100) clamp
    ours = greenmim.VisibleSwinTransformerV2(img_size=img_size, window_size=window_size, **TINY).to(dtype).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ref, ours


@pytest.mark.parametrize("img_size,window", [(256, 8), (192, 12)])
def test_all_visible_equals_timm_v2(img_size, window):
    ref, ours = _pair(img_size, window)
    x = torch.randn(2, 3, img_size, img_size, dtype=torch.float64)
    g = img_size // 32
    with torch.no_grad():
        got = ours.forward_features(x, ours.plan(torch.ones(g, g, dtype=torch.bool)))
        want = ref.forward_features(x)
    torch.testing.assert_close(got, want.reshape(2, -1, want.shape[-1]), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("img_size,window,per_sample", [(256, 8, False), (192, 12, True), (256, 16, False)])
def test_every_v2_attention_equals_window_oracle(img_size, window, per_sample):
    _, ours = _pair(img_size, window)
    g = img_size // 32
    vis = greenmim.random_masks(2 if per_sample else None, grid=g)
    plan = ours.plan(vis)
    log = []
    hooks = [m.register_forward_hook(lambda mod, a, out: log.append((mod, a[0], a[1], out)))
             for m in ours.modules() if isinstance(m, greenmim.swinv2.GroupWindowAttentionV2)]
    with torch.no_grad():
        ours(torch.randn(2, 3, img_size, img_size, dtype=torch.float64), plan)
    for h in hooks:
        h.remove()
    assert len(log) == sum(TINY["depths"])
    for mod, x, part, out in log:
        B, N, C = x.shape
        bias = torch.cat((mod.q_bias, mod.k_bias, mod.v_bias))
        q, k, v = torch.nn.functional.linear(x, mod.qkv.weight, bias).view(B, N, 3, mod.num_heads, -1).unbind(2)
        scale = torch.clamp(mod.logit_scale, max=math.log(100)).exp().view(1, 1, -1, 1)
        q = torch.nn.functional.normalize(q, dim=-1) * scale
        k = torch.nn.functional.normalize(k, dim=-1)
        o = oracle_attention(q, k, v, mod.bias_table(), part, part.window, scale=1.0)
        torch.testing.assert_close(out, mod.proj(o.reshape(B, N, C)), rtol=1e-10, atol=1e-10)


def test_gradcheck_through_position_bias_mlp():
    attn = greenmim.swinv2.GroupWindowAttentionV2(4, 2, window_size=4).double()
    for m in attn.cpb_mlp:
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.normal_(m.weight, std=0.3)
    part = greenmim.testing.stage_partition(torch.ones(6, 6, dtype=torch.bool), 4, 2, 4, cache=False)
    x = torch.randn(1, part.num_tokens, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: attn(x, part), (x,), atol=1e-6)
    attn(x, part).square().sum().backward()
    assert attn.logit_scale.grad.abs().sum() > 0
    # the bias table's gradient reaches the MLP: one weight against central differences
    w0 = attn.cpb_mlp[0].weight
    with torch.no_grad():
        eps = 1e-6
        w0[0, 0] += eps
        up = attn(x, part).square().sum()
        w0[0, 0] -= 2 * eps
        down = attn(x, part).square().sum()
        w0[0, 0] += eps
    assert w0.grad[0, 0].abs() > 0
    torch.testing.assert_close(w0.grad[0, 0], (up - down) / (2 * eps), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["swinv2_base_window8_256", "swinv2_large_window12_192"])
def test_timm_v2_state_dicts_load(name):
    with torch.device("meta"):                         # names and shapes: no real weights needed
        ref = timm.create_model(name, pretrained=False, num_classes=0)
        ours = greenmim.create_model(name)
    assert {k: tuple(v.shape) for k, v in ref.state_dict().items()} == \
        {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    ours.load_state_dict(ref.state_dict(), strict=True, assign=True)
