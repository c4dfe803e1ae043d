"""The visible-token Twins-SVT encoder: equal to timm's Twins when every token is visible, every
layer equal to a dense plain-torch oracle over the visible tokens under masks (twins_oracle.py),
per-sample packing equal to one sample at a time, timm's twins_svt_* state dicts loading
strictly, torch.compile with no graph break, bad input refused."""
import pytest
import torch

import greenmim
from greenmim import twins
import twins_oracle as oracle

timm = pytest.importorskip("timm")

TINY = dict(img_size=224, patch_size=4, embed_dims=(16, 32, 64, 128), num_heads=(1, 2, 4, 8), depths=(2, 2, 2, 2))


def _pair(dtype=torch.float64, ref_name=None, **kw):
    """timm's Twins and ours with the same weights (random LayerNorm and biases too, so that no
    zero-initialised parameter hides a term)."""
    if ref_name is None:
        cfg = {**TINY, **kw}
        ref = timm.models.twins.Twins(wss=(7, 7, 7, 7), **{"num_classes": 0, **cfg})
        ours = greenmim.VisibleTwins(**cfg)
    else:
        ref = timm.create_model(ref_name, pretrained=False, num_classes=0, **kw)
        ours = greenmim.create_model(ref_name, **kw)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    ref, ours = ref.to(dtype).eval(), ours.to(dtype).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ref, ours


def _patch_masks(batch, grid=56, keep=0.3):
    """Per-patch masks (finer than any block: blocks partly visible at every stage)."""
    return torch.rand(batch, grid, grid) < keep


@pytest.mark.parametrize("name", ["twins_svt_small", "tiny_large_dims"])
def test_all_visible_equals_timm(name):
    """twins_svt_small as is; Twins-L's widths and heads with two blocks a stage (the full depth
    is the state-dict test below)."""
    if name == "twins_svt_small":
        ref, ours = _pair(ref_name=name)
    else:
        ref, ours = _pair(embed_dims=(128, 256, 512, 1024), num_heads=(4, 8, 16, 32))
    B = 2 if name == "twins_svt_small" else 1
    x = torch.randn(B, 3, 224, 224, dtype=torch.float64)
    with torch.no_grad():
        want = ref.forward_features(x)                          # [B, 49, C]
        got = ours.forward_features(x, ours.plan(torch.ones(56, 56, dtype=torch.bool)))
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
        per = ours.plan(torch.ones(B, 7, 7, dtype=torch.bool))
        torch.testing.assert_close(ours.forward_features(x, per), want.reshape(1, B * 49, -1), rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(ours.forward_head(ours.forward_features(x, per), per), ref.forward_head(want),
                                   rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", ["twins_svt_small", "twins_svt_base", "twins_svt_large"])
def test_timm_state_dict_loads_strictly(name):
    """The real configurations, names and shapes (meta tensors: no memory, no init)."""
    with torch.device("meta"):
        ref = timm.create_model(name, pretrained=False, num_classes=1000)
        ours = greenmim.create_model(name, num_classes=1000)
    sd = ref.state_dict()
    assert {k: tuple(v.shape) for k, v in sd.items()} == {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    ours.load_state_dict(sd, strict=True, assign=True)
    assert ours.depths == tuple(len(b) for b in ref.blocks)


def _layer_hooks(model, log):
    kinds = (twins.LocallyGroupedAttn, twins.GlobalSubSampleAttn, twins.PosConv, twins.SparsePatchEmbed)

    def hook(mod, args, out):
        log.append((mod, args[0].detach(), args[1], out.detach()))
    return [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, kinds)]


@pytest.mark.parametrize("masks", ["unit_shared", "unit_per_sample", "patch_shared", "patch_per_sample"])
def test_every_layer_equals_dense_oracle(masks):
    """Each LSA, GSA, PEG and patch embedding of a masked forward against its dense zero-filled
    oracle. Unit masks (32 px) make every block whole; per-patch masks leave blocks partly
    visible at every stage, samples of different sizes (the padded GSA path) and one sample with
    a single visible patch."""
    _, ours = _pair()
    B = 3
    if masks.startswith("unit"):
        vis = greenmim.random_masks(B if masks.endswith("sample") else None)
    else:
        vis = _patch_masks(B)
        vis[1] = False
        vis[1, 55, 0] = True
        if masks.endswith("shared"):
            vis = vis[0]
    plan = ours.plan(vis)
    if masks == "patch_per_sample":
        assert not plan.stages[0].uniform and plan.stages[0].embed.holes
    log = []
    hooks = _layer_hooks(ours, log)
    with torch.no_grad():
        ours(torch.randn(B, 3, 224, 224, dtype=torch.float64), plan)
    for h in hooks:
        h.remove()
    seen = set()
    for mod, x, stage, out in log:
        if isinstance(mod, twins.SparsePatchEmbed):
            want, nxt = oracle.embed(mod, x, stage)
            i = [s.embed for s in plan.stages].index(stage.embed)
            _, got_vis = oracle.to_dense(out.new_zeros(out.shape[:-1] + (1,)), plan.stages[i + 1])
            assert torch.equal(got_vis.expand_as(nxt), nxt), "the next stage's tokens are not the any-rule blocks"
        else:
            want = {twins.LocallyGroupedAttn: oracle.lsa, twins.GlobalSubSampleAttn: oracle.gsa,
                    twins.PosConv: oracle.peg}[type(mod)](mod, x, stage)
        seen.add((type(mod).__name__, stage.grid))
        torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10, msg=f"{type(mod).__name__} at {stage.grid}")
    assert len(seen) == 4 * 3 + 3       # LSA, GSA, PEG at every stage, the embedding into stages 2-4


def test_per_sample_equals_one_sample_at_a_time():
    _, ours = _pair(num_classes=3)
    vis = _patch_masks(3)
    x = torch.randn(3, 3, 224, 224, dtype=torch.float64)
    with torch.no_grad():
        plan = ours.plan(vis)
        packed = ours.forward_features(x, plan)
        cu = plan.stages[-1].cu_seqlens
        logits = ours.forward_head(packed, plan)
        for b in range(3):
            p = ours.plan(vis[b])
            alone = ours.forward_features(x[b:b + 1], p)
            torch.testing.assert_close(packed[:, int(cu[b]):int(cu[b + 1])], alone, rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(logits[b:b + 1], ours.forward_head(alone, p), rtol=1e-10, atol=1e-10)


def test_gsa_paths_agree():
    """subsampled_attention's three layouts give the same attention: the padded path (uneven
    samples) against the shared one, sample by sample, with gradients."""
    _, ours = _pair()
    vis = _patch_masks(2, keep=0.2)
    plan = ours.plan(vis)
    st = plan.stages[1]
    assert not st.uniform
    H, D = 2, 8
    q = torch.randn(1, st.num_tokens, H, D, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, st.num_keys, H, D, dtype=torch.float64, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    o = twins.subsampled_attention(q, k, v, st)
    g = torch.autograd.grad(o.square().sum(), (q, k, v))
    cu, kcu = st.cu_seqlens.tolist(), st.key_cu_seqlens.tolist()
    for b in range(2):
        alone = ours.plan(vis[b]).stages[1]
        qs, ks, vs = (t[:, a:e].detach().requires_grad_() for t, (a, e) in
                      ((q, cu[b:b + 2]), (k, kcu[b:b + 2]), (v, kcu[b:b + 2])))
        ob = twins.subsampled_attention(qs, ks, vs, alone)
        torch.testing.assert_close(o[:, cu[b]:cu[b + 1]], ob, rtol=1e-12, atol=1e-12)
        gb = torch.autograd.grad(ob.square().sum(), (qs, ks, vs))
        for full, part, (a, e) in zip(g, gb, (cu[b:b + 2], kcu[b:b + 2], kcu[b:b + 2])):
            torch.testing.assert_close(full[:, a:e], part, rtol=1e-10, atol=1e-12)


def test_training_step_reduces_loss_and_reaches_every_parameter():
    torch.manual_seed(0)
    model = greenmim.VisibleTwins(**TINY, drop_path_rate=0.1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(2, 3, 224, 224)
    plan = model.plan(_patch_masks(2))
    target = torch.randn(1, plan.stages[-1].num_tokens, model.num_features)
    losses = []
    for _ in range(4):
        loss = (model.forward_features(x, plan) - target).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]
    for n, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, n


def test_channels_last_model_matches():
    """``model.to(memory_format=torch.channels_last)`` (a timm habit; W' of the block convs then
    copies with C_in innermost, test_conv_ops) gives the contiguous model's features and
    gradients: no path assumes a contiguous weight."""
    torch.manual_seed(1)
    a = greenmim.VisibleTwins(**TINY).double()
    b = greenmim.VisibleTwins(**TINY).double()
    b.load_state_dict(a.state_dict())
    b = b.to(memory_format=torch.channels_last)
    assert any(p.dim() == 4 and not p.is_contiguous() for p in b.parameters())
    x = torch.randn(2, 3, 224, 224, dtype=torch.float64)
    plan = a.plan(_patch_masks(2))
    fa, fb = (m.forward_features(x, plan) for m in (a, b))
    torch.testing.assert_close(fb, fa)
    for f in (fa, fb):
        f.square().mean().backward()
    for (n, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        torch.testing.assert_close(pb.grad, pa.grad, msg=n)


def test_compile_fullgraph_matches_eager():
    """Two stages (every kind of layer: LSA, GSA with sub-sampling, PEG, a patch embedding
    between stages) keep the compile time down."""
    torch._dynamo.reset()
    model = greenmim.VisibleTwins(embed_dims=(16, 32), num_heads=(1, 2), depths=(2, 2), mlp_ratios=(4, 4),
                                  sr_ratios=(8, 4), wss=(7, 7))
    x = torch.randn(2, 3, 224, 224)

    def step(img, p):
        return model(img, p).square().mean()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for vis in (greenmim.random_masks(), _patch_masks(2)):      # shared; per-sample, uneven (padded GSA)
        plan = model.plan(vis)
        want = step(x, plan)
        want_g = torch.autograd.grad(want, list(model.parameters()))
        got = compiled(x, plan)
        got_g = torch.autograd.grad(got, list(model.parameters()))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        for a, b in zip(got_g, want_g):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_plan_moves_and_pickles():
    import pickle
    model = greenmim.VisibleTwins(**TINY)
    plan = model.plan(_patch_masks(2), cache=False)
    again = pickle.loads(pickle.dumps(plan))
    assert type(again) is greenmim.TwinsPlan and again.per_sample and again.num_masks == 2
    assert torch.equal(again.arena, plan.arena)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(model(x, again), model(x, plan), rtol=0, atol=0)
    assert plan.to("cpu") is plan and plan.to("meta").device.type == "meta"
    assert plan.mark_dynamic() is plan


def test_bad_input_is_refused():
    model = greenmim.VisibleTwins(**TINY)
    x = torch.randn(2, 3, 224, 224)
    Err = greenmim.GreenmimError
    with pytest.raises(Err, match="TwinsPlan"):
        model(x, greenmim.plan_masks(greenmim.random_masks()))                  # a Swin plan
    other = greenmim.VisibleTwins(**{**TINY, "sr_ratios": (4, 2, 1, 1)})
    with pytest.raises(Err, match="sub-sampling 4, the layer has sr_ratio 8"):
        model(x, other.plan(greenmim.random_masks()))                          # another geometry
    small = greenmim.VisibleTwins(**{**TINY, "img_size": 112, "patch_size": 2})
    with pytest.raises(Err, match="patch grid"):
        small(torch.randn(2, 3, 224, 224), small.plan(greenmim.random_masks()))  # images of another size
    with pytest.raises(Err, match="3 images, 2 per-sample masks"):
        model(torch.randn(3, 3, 224, 224), model.plan(greenmim.random_masks(2)))
    with pytest.raises(Err, match="plan is on meta"):
        model(x, model.plan(greenmim.random_masks()).to("meta"))
    three = greenmim.VisibleTwins(**{k: v[:3] if isinstance(v, tuple) else v for k, v in TINY.items()},
                                  mlp_ratios=(4, 4, 4), sr_ratios=(8, 4, 2), wss=(7, 7, 7))
    with pytest.raises(Err, match="plan has 3 stages, the model 4"):
        model(x, three.plan(greenmim.random_masks()))
    with pytest.raises(Err, match="bool tensor"):
        model.plan(torch.ones(7, 7))
    with pytest.raises(Err, match="window 7 and sr 8 must divide"):
        greenmim.VisibleTwins(**{**TINY, "img_size": 112})                     # timm would pad: refused
    with pytest.raises(Err, match="one entry per stage"):
        greenmim.VisibleTwins(**{**TINY, "depths": (2, 2, 2)})
    with pytest.raises(Err, match="window 5 does not divide"):
        greenmim.plan_twins(torch.ones(7, 7, dtype=torch.bool), windows=(5, 7, 7, 7))
