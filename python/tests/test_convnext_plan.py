"""ConvNeXt V2's plan in one arena (convnext_plan.py), and what it makes possible: FCMAE's step as a
CUDA graph and under torch.compile.

The plan's tables equal the standalone builders' (neighbour tables against brute force are in
test_convnextv2.py) on random and adversarial per-sample masks; it pickles, moves and copies as one
buffer; plans of one mask ratio share their shapes (``shape_key``), others are refused by ``copy_``.
FCMAE on a plan equals FCMAE on the masks. The trainer's graphed step (GraphedStep, with the CPU
stand-in that replays by running the captured function again) equals eager steps over fresh masks;
``torch.compile(fullgraph=True)`` traces FCMAE's step once for every fresh mask and equals eager."""
import pickle

import pytest
import torch

import greenmim
from greenmim import GreenmimError, conv_tables
from greenmim.convnext_plan import ConvNeXtPlan, ConvNeXtPlanSpec, plan_convnext

pytest.importorskip("timm")
D = torch.float64


def _masks(B, g, keep, gen):
    m = torch.zeros(B, g * g, dtype=torch.bool)
    for b in range(B):
        m[b, torch.randperm(g * g, generator=gen)[:keep]] = True
    return m.view(B, g, g)


def _adversarial(gen):
    """Uneven samples: one unit, a corner, all, none; and a random one."""
    m = torch.zeros(5, 3, 3, dtype=torch.bool)
    m[0, 1, 1] = True
    m[1, 0, 0] = m[1, 2, 2] = True
    m[2] = True
    m[4] = torch.rand(3, 3, generator=gen) < 0.5
    return m


@pytest.mark.parametrize("kernel", [3, 7])
def test_the_arena_holds_the_builders_tables(kernel):
    gen = torch.Generator().manual_seed(kernel)
    for masks in (_adversarial(gen), _masks(4, 3, 4, gen)):
        plan = plan_convnext(masks, 96, kernel=kernel, cache=False)
        assert isinstance(plan, ConvNeXtPlan) and plan.num_masks == len(masks) and plan.image_size == (96, 96)
        assert torch.equal(plan.visible, masks) and plan.num_visible == int(masks.sum())
        prev = None
        for s, st in enumerate(plan.stages):
            r = 8 >> s
            vs = masks.repeat_interleave(r, 1).repeat_interleave(r, 2)
            want = conv_tables.neighbor_table(vs, kernel=kernel, cache=False)
            assert st.grid == tuple(vs.shape[1:]) and st.num_tokens == int(vs.sum())
            assert torch.equal(st.nbr.nbr, want.nbr) and torch.equal(st.position, want.position)
            assert torch.equal(st.cu_seqlens, want.cu_seqlens)
            counts = torch.bincount(st.sample_of_token.long(), minlength=len(masks))
            assert torch.equal(counts, st.cu_seqlens.diff().long())
            assert bool((st.sample_of_token.diff() >= 0).all())              # sample-major
            if prev is None:
                assert st.down is None
            else:
                bt = conv_tables.block_table(prev, 2, cache=False)
                assert torch.equal(st.down.gather, bt.gather) and st.down.num_inputs == bt.num_inputs
                assert not st.down.holes
            prev = vs
        assert torch.equal(plan.patch_position, plan.stages[0].position)
        # one buffer: pickled, pinned or moved, the copy's views equal the original's
        back = pickle.loads(pickle.dumps(plan))
        assert back.shape_key() == plan.shape_key() and torch.equal(back.arena, plan.arena)
        for a, b in zip(back.stages, plan.stages):
            assert torch.equal(a.nbr.nbr, b.nbr.nbr) and torch.equal(a.sample_of_token, b.sample_of_token)
        assert plan.to("cpu") is plan


def test_plans_of_one_ratio_share_their_shapes_and_copy_in_place():
    gen = torch.Generator().manual_seed(1)
    a = plan_convnext(_masks(3, 4, 6, gen), 128, cache=False)
    b = plan_convnext(_masks(3, 4, 6, gen), 128, cache=False)
    c = plan_convnext(_masks(3, 4, 7, gen), 128, cache=False)
    assert a.shape_key() == b.shape_key() != c.shape_key()
    assert a.group_counts() == ((), (), (), ()) and a.padded(a.group_counts()) is a and a.mark_dynamic() is a
    held = [st.nbr for st in a.stages]
    a.copy_(b)
    for st, nbr, want in zip(a.stages, held, b.stages):                  # the same views, b's values
        assert st.nbr is nbr and torch.equal(st.nbr.nbr, want.nbr.nbr) and torch.equal(st.position, want.position)
    assert torch.equal(a.visible, b.visible)
    with pytest.raises(GreenmimError, match="differ in shape"):
        a.copy_(c)


def test_bad_masks_are_refused_with_the_reason():
    ok = torch.ones(2, 2, 2, dtype=torch.bool)
    for bad, why in ((ok.float(), "bool"), (torch.ones(2, 3, 3, dtype=torch.bool), "bool"),
                     (ok[0], "batch=")):
        with pytest.raises(GreenmimError, match=why):
            plan_convnext(bad, 64, cache=False)
    with pytest.raises(GreenmimError, match="multiples of 32"):
        plan_convnext(ok, 80, cache=False)
    for k in (4, 0, 17, 3.0):
        with pytest.raises(GreenmimError, match="odd"):
            plan_convnext(ok, 64, kernel=k, cache=False)
    shared = plan_convnext(ok[0], 64, batch=3, cache=False)
    assert shared.num_masks == 3 and torch.equal(shared.visible, ok[0].expand(3, -1, -1))
    # the library's table is copied only into buffers of its sizes
    host = torch.rand(2, 8, 8) < 0.5
    with conv_tables.BuiltTable(host.to(torch.uint8), True, greenmim._lib.GMH_NEIGHBOR_TABLE, 3) as t:
        n = t.rows[0]
        assert n == int(host.sum()) and t.rows[1] == 9
        for bad in (torch.empty(n * 9 + 1, dtype=torch.int32), torch.empty(n * 9, dtype=torch.int64),
                    torch.empty(n * 18, dtype=torch.int32)[::2]):
            with pytest.raises(GreenmimError, match="copy_into takes contiguous int32 CPU tensors"):
                t.copy_into(bad, None, None)
        got = torch.empty(n, 9, dtype=torch.int32)
        t.copy_into(got, None, None)
        assert torch.equal(got, conv_tables.neighbor_table(host, cache=False).nbr)


def _fcmae(img=64):
    from greenmim.fcmae import FCMAE
    torch.manual_seed(0)
    return FCMAE("convnextv2_atto", img_size=img, decoder_embed_dim=32).double()


def test_fcmae_on_a_plan_equals_fcmae_on_its_masks():
    model = _fcmae(96)
    gen = torch.Generator().manual_seed(2)
    imgs = torch.randn(3, 3, 96, 96, dtype=D, generator=gen)
    masks = _masks(3, 3, 4, gen)
    want = model(imgs, masks)
    got = model(imgs, model.plan(masks, cache=False))
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    # a shared mask: its plan of one sample is planned again for the batch, as the mask itself is
    one = masks[0]
    for a, b in zip(model(imgs, model.plan(one)), model(imgs, one.expand(3, -1, -1))):
        assert torch.equal(a, b)
    with pytest.raises(GreenmimError, match="does not fit"):
        model(imgs[:2], model.plan(masks, cache=False))
    with pytest.raises(ValueError, match="nothing to reconstruct"):
        model(imgs, model.plan(torch.ones(3, 3, 3, dtype=torch.bool), cache=False))
    # the trainer's loader plans through the encoder's picklable spec
    from greenmim.pretrain import data
    geo = pickle.loads(pickle.dumps(data.Geometry(model, fixed_groups=True)))
    assert geo.spec == ConvNeXtPlanSpec(96, 7) and geo.capacity_for(3, True, 0.6, seed=0) is None
    plan = geo.plan(one, 3)
    assert isinstance(plan, ConvNeXtPlan) and plan.num_masks == 3


def test_graphed_fcmae_steps_equal_eager_steps():
    """GraphedStep (the trainer's --cuda_graphs, on by default on CUDA) with the CPU stand-in: a
    capture on the first plan, replays on fresh masks copied into the captured plan, equal to eager
    steps in losses, parameters and optimizer state."""
    from greenmim.pretrain import graphs, optim
    from test_graphed_step import _StandIn
    models = [_fcmae(), _fcmae()]
    ref, model = models
    ref_opt, opt = (torch.optim.AdamW(optim.param_groups(m, 0.05), lr=1e-3, betas=(0.9, 0.95), foreach=False)
                    for m in models)
    graphs.tensor_lr(opt, torch.device("cpu"), torch.float64)
    stand_in = _StandIn(opt)
    step = graphs.GraphedStep(model, lambda x, p: model(x, p)[0], opt, None, torch.device("cpu"), None, warmup=2,
                              graph_api=stand_in)
    gen = torch.Generator().manual_seed(3)
    B = 2
    for k in range(4):
        lr = 1e-3 * (1 + 0.2 * k)
        optim.set_lr(ref_opt, lr)
        optim.set_lr(opt, lr)
        img = torch.randn(B, 3, 64, 64, dtype=D, generator=gen)
        plan = model.plan(_masks(B, 2, 2, gen), cache=False)
        ref_opt.zero_grad(set_to_none=True)
        want = ref(img, plan)[0]
        want.backward()
        ref_opt.step()
        torch.testing.assert_close(step.step(img, plan), want.detach(), rtol=1e-10, atol=0)
    assert stand_in.captures == 1 and step.replays == 4 and step.overflows == 0
    for (n, p), q in zip(ref.named_parameters(), model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-9, atol=1e-12, msg=n)


def test_compiled_fcmae_is_one_graph_over_fresh_masks():
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    model = _fcmae()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    gen = torch.Generator().manual_seed(4)
    for _ in range(3):
        img = torch.randn(2, 3, 64, 64, dtype=D, generator=gen)
        plan = model.plan(_masks(2, 2, 2, gen), cache=False)
        got = compiled(img, plan)[0]
        g_got = torch.autograd.grad(got, [p for p in model.parameters() if p.requires_grad])
        want = model(img, plan)[0]
        g_want = torch.autograd.grad(want, [p for p in model.parameters() if p.requires_grad])
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
        for a, b in zip(g_got, g_want):
            torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-12)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["recompiles"])
