"""torch.compile(fullgraph=True) traces models using greenmim's ops with no graph break."""
import pytest
import torch

import greenmim
from conftest import random_stage_mask

TINY = dict(img_size=224, patch_size=4, embed_dim=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8), window_size=7)


def test_encoder_fullgraph_forward_backward_matches_eager():
    torch._dynamo.reset()
    model = greenmim.VisibleSwinTransformer(**TINY)
    x = torch.randn(2, 3, 224, 224)
    plan = model.plan(greenmim.random_masks())

    def step(img, p):
        return model(img, p).square().mean()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    want = step(x, plan)
    want_g = torch.autograd.grad(want, list(model.parameters()))
    got = compiled(x, plan)
    got_g = torch.autograd.grad(got, list(model.parameters()))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(got_g, want_g):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    # a per-sample plan traces too
    ps = model.plan(greenmim.random_masks(2))
    torch.testing.assert_close(compiled(x, ps), step(x, ps), rtol=1e-5, atol=1e-6)


def test_attention_op_under_inductor():
    torch._dynamo.reset()
    part = greenmim.stage_partition(random_stage_mask(14, 2), 7, 3, 64, cache=False)
    lin = torch.nn.Linear(8, 3 * 8)
    x = torch.randn(2, part.num_tokens, 8, requires_grad=True)
    bias = torch.randn(169, 2, requires_grad=True)

    def f(x, bias):
        qkv = lin(x).view(2, -1, 3, 2, 4)
        return greenmim.group_window_attention_packed(qkv, bias, part).relu().sum()

    got = torch.compile(f, fullgraph=True)(x, bias)
    gx, gb = torch.autograd.grad(got, (x, bias))
    want = f(x, bias)
    wx, wb = torch.autograd.grad(want, (x, bias))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gx, wx, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gb, wb, rtol=1e-4, atol=1e-5)
