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
    part = greenmim.testing.stage_partition(random_stage_mask(14, 2), 7, 3, 64, cache=False)
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


def test_fresh_plans_straight_into_a_fullgraph_model():
    """``compiled(x, model.plan(mask))`` with a new plan each call, made on the CPU and passed
    straight in: its views of the arena are first made inside the compiled region, where dynamo
    makes the layout's sizes symbolic from the second plan on (the stages' views once sorted
    tuples of them: "sort with non-constant keys"). Swin and Twins, shared and per-sample masks.
    (Without ``group_size=-1`` and ``mark_dynamic`` a new mask may recompile: correct, not fast.)"""
    small = dict(img_size=112, depths=(1, 1, 1), num_heads=(1, 1, 2))
    models = ((greenmim.VisibleSwinTransformer(embed_dim=16, window_size=7, **small), (None, None, 2)),
              (greenmim.VisibleTwins(embed_dims=(16, 32, 64), mlp_ratios=(2, 2, 2), sr_ratios=(4, 2, 1),
                                     wss=(7, 7, 7), **small), (None, 2)))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 112, 112)
    for model, batches in models:
        torch._dynamo.reset()
        model.eval()
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        for batch in batches:
            mask = greenmim.random_masks(batch, generator=gen)
            got = compiled(x, model.plan(mask, cache=False))
            torch.testing.assert_close(got, model(x, model.plan(mask, cache=False)), rtol=1e-5, atol=1e-6)
