"""The whole GreenMIM model: its loss against a from-scratch computation, the released attention
path, per-sample batches against one image at a time, the decoder against timm's ViT block, the
decoder order (each latent at its own unit; the released order as a uniform permutation), and
released checkpoints loaded tensor by tensor in both patch-merging layouts."""
import math
from functools import partial

import numpy as np
import pytest
import torch

import greenmim
from greenmim import GreenmimError
from greenmim.checkpoint import from_released, load_pretrained
from greenmim.mim import patchify, sincos_pos_embed
from conftest import released_tree, row_first_merge

timm = pytest.importorskip("timm")

NANO = "green_mim_swin_nano_patch4_dec128b1"


def _model(dtype=torch.float64, **kw):
    torch.manual_seed(0)
    return greenmim.create_model(NANO, **kw).to(dtype)


def _mae_loss(imgs, pred, unit_mask, norm_pix):
    """MAE's forward_loss, written out with its own patchify (einsum 'nchpwq->nhwpqc')."""
    B, p = imgs.shape[0], 32
    h = imgs.shape[2] // p
    x = imgs.reshape(B, 3, h, p, h, p)
    target = torch.einsum("nchpwq->nhwpqc", x).reshape(B, h * h, p * p * 3)
    if norm_pix:
        mean = target.mean(dim=-1, keepdim=True)
        var = target.var(dim=-1, keepdim=True)
        target = (target - mean) / (var + 1.e-6) ** .5
    loss = ((pred - target) ** 2).mean(dim=-1)
    mask = (~unit_mask).reshape(B, -1).to(pred.dtype)     # 1 = removed
    return (loss * mask).sum() / mask.sum()


@pytest.mark.parametrize("per_sample", [False, True])
@pytest.mark.parametrize("norm_pix", [True, False])
def test_loss_equals_from_scratch(per_sample, norm_pix):
    model = _model(norm_pix_loss=norm_pix)
    imgs = torch.randn(3, 3, 224, 224, dtype=torch.float64)
    vis = greenmim.random_masks(3 if per_sample else None)
    loss, pred, mask = model(imgs, model.plan(vis))
    assert pred.shape == (3, 49, 32 * 32 * 3) and mask.shape == (3, 49)
    units = vis if per_sample else vis.expand(3, 7, 7)
    torch.testing.assert_close(mask, (~units).reshape(3, 49).float())
    torch.testing.assert_close(loss, _mae_loss(imgs, pred, units, norm_pix), rtol=1e-12, atol=1e-12)


def test_released_attention_gives_same_loss_and_gradients():
    ours = _model()
    rel = _model(attn_impl="released")
    rel.load_state_dict(ours.state_dict())
    imgs = torch.randn(2, 3, 224, 224, dtype=torch.float64)
    for vis in (greenmim.random_masks(), greenmim.random_masks(2)):
        ours.zero_grad()
        rel.zero_grad()
        a = ours(imgs, ours.plan(vis))[0]
        b = rel(imgs, rel.plan(vis))[0]
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
        a.backward()
        b.backward()
        for (n, p), (_, q) in zip(ours.named_parameters(), rel.named_parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-7, atol=1e-12, msg=n)


@pytest.mark.parametrize("per_sample", [False, True])
def test_batches_agree_with_one_sample_at_a_time(per_sample):
    model = _model().eval()
    imgs = torch.randn(3, 3, 224, 224, dtype=torch.float64)
    vis = greenmim.random_masks(3 if per_sample else None)
    with torch.no_grad():
        loss, pred, mask = model(imgs, model.plan(vis))
        alone = [model(imgs[b:b + 1], model.plan(vis[b:b + 1] if per_sample else vis)) for b in range(3)]
    for b, (l_b, p_b, m_b) in enumerate(alone):
        torch.testing.assert_close(pred[b:b + 1], p_b, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(mask[b:b + 1], m_b)
    # every sample masks the same number of units: the batch loss is the mean of the samples'
    torch.testing.assert_close(loss, torch.stack([a[0] for a in alone]).mean(), rtol=1e-9, atol=1e-12)


def test_decoder_block_is_timms_vit_block():
    from greenmim.mim import DecoderBlock
    ours = DecoderBlock(128, 4, 4.0, partial(torch.nn.LayerNorm, eps=1e-6)).double()
    ref = timm.models.vision_transformer.Block(128, 4, 4.0, qkv_bias=True,
                                               norm_layer=partial(torch.nn.LayerNorm, eps=1e-6)).double()
    ref.load_state_dict(ours.state_dict(), strict=True)
    x = torch.randn(2, 49, 128, dtype=torch.float64)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-12, atol=1e-12)


def test_sincos_positions_equal_maes():
    def mae(embed_dim, grid_size):        # util/pos_embed.py of MAE, in numpy
        def one(d, pos):
            omega = np.arange(d // 2, dtype=np.float64) / (d / 2.)
            omega = 1. / 10000 ** omega
            out = np.einsum('m,d->md', pos.reshape(-1), omega)
            return np.concatenate([np.sin(out), np.cos(out)], axis=1)
        g = np.stack(np.meshgrid(np.arange(grid_size, dtype=np.float32), np.arange(grid_size, dtype=np.float32)), 0)
        g = g.reshape([2, 1, grid_size, grid_size])
        return np.concatenate([one(embed_dim // 2, g[0]), one(embed_dim // 2, g[1])], axis=1)
    for dim, grid in ((512, 7), (128, 6), (64, 8)):
        torch.testing.assert_close(sincos_pos_embed(dim, grid), torch.from_numpy(mae(dim, grid)).float())


def _tag_hook(model, plan, batch):
    """Replaces decoder_embed's output: latent i becomes the one-hot vector of its own unit (the
    plan's last-stage positions), scaled so that it dominates the positions. Returns a list that
    receives the decoder's input (before its blocks, positions subtracted)."""
    L = model.grid * model.grid
    pos = plan.stages[-1].position.long() % L
    seen = []

    def embed_out(mod, args, out):
        tags = torch.zeros_like(out.reshape(-1, out.shape[-1]))
        n = tags.shape[0]
        per = pos if plan.per_sample else pos.repeat(batch)
        tags[torch.arange(n), per[:n]] = 1000.0
        return tags.view_as(out)

    def block_in(mod, args):
        seen.append(args[0].detach() - model.decoder_pos_embed)

    return seen, [model.decoder_embed.register_forward_hook(embed_out),
                  model.decoder_blocks[0].register_forward_pre_hook(block_in)]


@pytest.mark.parametrize("per_sample", [False, True])
def test_each_visible_latent_arrives_at_its_own_unit(per_sample):
    model = _model()
    vis = greenmim.random_masks(3 if per_sample else None)
    plan = model.plan(vis)
    seen, hooks = _tag_hook(model, plan, 3)
    model(torch.randn(3, 3, 224, 224, dtype=torch.float64), plan)
    for h in hooks:
        h.remove()
    x = seen[0]                                       # [B, 49, D]
    units = (vis if per_sample else vis.expand(3, 7, 7)).reshape(3, 49)
    for b in range(3):
        for u in range(49):
            if units[b, u]:
                assert int(x[b, u].argmax()) == u and float(x[b, u, u]) == 1000.0
            else:
                torch.testing.assert_close(x[b, u], model.mask_token[0, 0].to(x.dtype))


def test_released_order_is_a_permutation_within_each_sample():
    model = _model(decoder_order="released")
    vis = greenmim.random_masks(4)
    plan = model.plan(vis)
    seen, hooks = _tag_hook(model, plan, 4)
    g = torch.Generator().manual_seed(3)
    model(torch.randn(4, 3, 224, 224, dtype=torch.float64), plan, generator=g)
    for h in hooks:
        h.remove()
    x = seen[0]
    units = vis.reshape(4, 49)
    moved = 0
    for b in range(4):
        got = sorted(int(x[b, u].argmax()) for u in range(49) if units[b, u])
        assert got == [u for u in range(49) if units[b, u]]          # the sample's own latents, each once
        moved += sum(int(x[b, u].argmax()) != u for u in range(49) if units[b, u])
    assert moved > 0


def test_released_order_is_uniform_and_reproducible():
    """Over many draws, each visible unit receives each of its sample's latents equally often
    (chi-square, 12 x 12 table of a shared 12-unit mask), and a generator state replays exactly."""
    model = _model(decoder_order="released")
    plan = model.plan(greenmim.random_masks())
    g = torch.Generator().manual_seed(11)
    draws, B = 400, 8
    counts = torch.zeros(12, 12)
    for _ in range(draws // B):
        idx = model.decoder_index(plan, B, g).view(B, 49)
        rank = plan.stages[-1].unit_rank[0]
        vis_units = torch.nonzero(rank >= 0).flatten()
        src = idx[:, vis_units] - torch.arange(B).unsqueeze(1) * 12    # latent rank within the sample
        for row in src:
            counts[torch.arange(12), row] += 1
    expected = draws / 12
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # 121 degrees of freedom (a Latin-square-like table: rows and columns sum to `draws`);
    # P(chi2 > 180) < 0.0005 under uniformity
    assert chi2 < 180, chi2
    a = model.decoder_index(plan, 4, torch.Generator().manual_seed(5))
    b = model.decoder_index(plan, 4, torch.Generator().manual_seed(5))
    c = model.decoder_index(plan, 4, torch.Generator().manual_seed(6))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_perturbing_one_unit_moves_the_decoder_input_most_there():
    model = _model().eval()
    torch.manual_seed(2)
    vis = greenmim.random_masks()
    plan = model.plan(vis)
    imgs = torch.randn(1, 3, 224, 224, dtype=torch.float64)
    seen = []
    hook = model.decoder_blocks[0].register_forward_pre_hook(lambda m, a: seen.append(a[0].detach()))
    visible = torch.nonzero(vis.flatten()).flatten().tolist()
    with torch.no_grad():
        model(imgs, plan)
        for u in visible[:6]:
            moved = imgs.clone()
            r, c = divmod(u, 7)
            moved[:, :, r * 32:(r + 1) * 32, c * 32:(c + 1) * 32] += 3.0
            model(moved, plan)
            change = (seen[-1] - seen[0])[0].norm(dim=-1)
            assert int(change.argmax()) == u
    hook.remove()


def test_every_unit_visible_is_refused_and_models_are_named():
    model = _model()
    with pytest.raises(GreenmimError, match="nothing to reconstruct"):
        model(torch.randn(1, 3, 224, 224, dtype=torch.float64), model.plan(torch.ones(7, 7, dtype=torch.bool)))
    with pytest.raises(GreenmimError, match="unknown model 'green_mim_swin_base_patch4_dec5121b1'.*dec512b1"):
        greenmim.create_model("green_mim_swin_base_patch4_dec5121b1")
    with pytest.raises(GreenmimError, match="decoder_order"):
        greenmim.create_model(NANO, decoder_order="random")
    other = greenmim.mim.green_mim_swin_base_patch4_window6_192_dec512b1
    with torch.device("meta"):
        m = other()
    with pytest.raises(GreenmimError, match="another model"):
        model(torch.randn(1, 3, 224, 224, dtype=torch.float64), m.plan(greenmim.random_masks(grid=6), device="cpu"))


def test_constructors_follow_the_released_names_and_shapes():
    with torch.device("meta"):
        base = greenmim.mim.green_mim_swin_base_patch4_dec512b1()
        large14 = greenmim.mim.green_mim_swin_large_patch4_win14_dec512b1()
        v2 = greenmim.mim.green_mim_swinv2_base_window8_256_dec512b1()
    assert base.decoder_pred.out_features == 32 * 32 * 3 and base.decoder_pos_embed.shape == (1, 49, 512)
    assert base.decoder_embed.in_features == 1024 and len(base.decoder_blocks) == 1
    assert base.decoder_blocks[0].attn.num_heads == 16
    assert large14.decoder_embed.in_features == 1536 and large14.encoder.window_size == 14
    assert v2.grid == 8 and v2.decoder_pos_embed.shape == (1, 64, 512)
    for k in base.state_dict():
        assert k.split(".")[0] in ("encoder", "decoder_embed", "mask_token", "decoder_pos_embed", "decoder_blocks",
                                   "decoder_norm", "decoder_pred"), k


def test_released_checkpoint_loads_tensor_by_tensor():
    model = _model()
    src = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    released = released_tree(src)
    assert "encoder.layers.0.downsample.reduction.weight" in released
    with pytest.raises(GreenmimError, match="'2022'.*'2023'"):
        load_pretrained(model, {"model": released})
    load_pretrained(model, {"model": released, "epoch": 199}, layout="2023")
    for k, v in model.state_dict().items():
        assert torch.equal(v, src[k]), k


def test_2022_merge_layout_converts_to_swin_order():
    """A 2022 checkpoint's patch merging concatenates a 2x2 block row-first; merged with its own
    weights it must equal greenmim's merge (Swin's order) with the converted weights."""
    model = _model()
    src = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    released = released_tree(src)                  # read as 2022-layout weights
    load_pretrained(model, released, layout="2022")
    for stage in (1, 2, 3):
        old = {k.split("downsample.")[1]: v for k, v in released.items()
               if k.startswith(f"encoder.layers.{stage - 1}.downsample.")}
        C = old["reduction.weight"].shape[1] // 4
        H = 56 >> (stage - 1)
        x = torch.randn(2, H, H, C, dtype=torch.float64)
        want = row_first_merge(x, old)
        merge = greenmim.testing.merge_indices(torch.ones(H, H, dtype=torch.bool))
        got = model.encoder.layers[stage].downsample(x.reshape(2, H * H, C), merge)
        torch.testing.assert_close(got, want.reshape(2, -1, 2 * C), rtol=1e-10, atol=1e-10)
        assert not torch.allclose(old["norm.weight"], model.encoder.layers[stage].downsample.norm.weight)


def test_another_window_size_resizes_the_tables():
    small = _model()
    big = _model(window_size=14)
    sd = small.state_dict()
    load_pretrained(big, sd)
    from timm.layers import resize_rel_pos_bias_table_simple
    for k, v in big.state_dict().items():
        if k.endswith("relative_position_bias_table") and sd[k].shape != v.shape:
            want = resize_rel_pos_bias_table_simple(sd[k].float(), (14, 14), v.shape)
            torch.testing.assert_close(v.float(), want, rtol=1e-5, atol=1e-6)
        elif not k.endswith("relative_position_bias_table"):
            assert torch.equal(v, sd[k]), k
    with pytest.raises(GreenmimError, match="does not fit"):
        load_pretrained(_model(), greenmim.create_model("green_mim_swin_tiny_patch4_dec512b1").state_dict())


def test_swin_v2_needs_no_resize():
    torch.manual_seed(0)
    a = greenmim.GreenMIM(greenmim.VisibleSwinTransformerV2(img_size=256, window_size=8, embed_dim=32,
                                                              depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8)), 128, 1, 4)
    b = greenmim.GreenMIM(greenmim.VisibleSwinTransformerV2(img_size=256, window_size=16, embed_dim=32,
                                                              depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8)), 128, 1, 4)
    load_pretrained(b, a.state_dict())               # strictly, nothing to interpolate
    attn8 = a.encoder.layers[0].blocks[0].attn
    attn16 = b.encoder.layers[0].blocks[0].attn
    assert attn16.bias_table().shape == (31 * 31, 1) and attn8.bias_table().shape == (15 * 15, 1)
    imgs = torch.randn(2, 3, 256, 256)
    loss = b(imgs, b.plan(greenmim.random_masks(2, grid=8)))[0]
    assert math.isfinite(float(loss))


def test_a_plan_on_another_device_is_refused_by_the_model():
    model = _model()
    imgs = torch.randn(1, 3, 224, 224, dtype=torch.float64)
    with pytest.raises(GreenmimError, match="the plan is on meta, the images on cpu"):
        model(imgs, model.plan(greenmim.random_masks(), device="meta"))
    for enc in (model.encoder, greenmim.VisibleSwinTransformerV2(img_size=256, window_size=8, embed_dim=32,
                                                                   depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8))):
        x = torch.randn(1, 3, enc.img_size, enc.img_size, dtype=torch.float64)
        for method in (enc.forward_features, enc):
            with pytest.raises(GreenmimError, match="the plan is on meta, the images on cpu"):
                method(x, enc.plan(greenmim.random_masks(grid=enc.img_size // 32), device="meta"))


def _saved_bytes(fn):
    """fn()'s result and the bytes of the storages autograd saved for its backward (parameters aside)."""
    seen = {}

    def pack(t):
        if not isinstance(t, torch.nn.Parameter):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())


@pytest.mark.parametrize("autocast", [False, True])
def test_mlp_recomputes_its_gelu_and_takes_the_plain_paths_gradients(autocast):
    """The MLP keeps fc1's output only (its GELU is recomputed in the backward): the same output and
    gradients as fc1 -> GELU -> fc2 through autograd, in float32 and under bf16 autocast, and a
    quarter-ish less saved for the backward (bench/activation_memory.py)."""
    from greenmim.layers import Mlp
    torch.manual_seed(0)
    m = Mlp(24, 96)
    x0 = torch.randn(3, 10, 24)
    g = torch.randn(3, 10, 24)
    got, saved = {}, {}
    for rec in (True, False):
        m.recompute = rec
        m.zero_grad()
        x = x0.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y, saved[rec] = _saved_bytes(lambda: m(x))
        (y.float() * g).sum().backward()
        got[rec] = [y.detach().float(), x.grad, m.fc1.weight.grad, m.fc1.bias.grad, m.fc2.weight.grad, m.fc2.bias.grad]
        assert all(t.dtype == torch.float32 for t in got[rec][2:])
    for a, b in zip(got[True], got[False]):
        scale = float(b.abs().max())
        assert float((a - b).abs().max()) <= (2e-2 if autocast else 1e-6) * scale
    hidden_bytes = 3 * 10 * 96 * (2 if autocast else 4)
    assert saved[False] - saved[True] >= hidden_bytes      # the GELU's output is not kept
    m.eval()
    with torch.no_grad():
        assert torch.equal(m(x0), m.fc2(m.act(m.fc1(x0))))


@pytest.mark.parametrize("autocast", [False, True])
def test_norm_linear_recomputes_the_norm_and_takes_the_plain_paths_gradients(autocast):
    """linear(layer_norm(x)) keeping x only: the same output and gradients (x, the norm's and the
    linear's parameters) as the two modules through autograd, and the norm's output not kept."""
    from greenmim.layers import norm_linear
    torch.manual_seed(0)
    norm, lin = torch.nn.LayerNorm(32), torch.nn.Linear(32, 48)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    x0 = torch.randn(2, 7, 32) * 3 + 1
    g = torch.randn(2, 7, 48)
    got, saved = {}, {}
    for fused in (True, False):
        for p in (*norm.parameters(), *lin.parameters()):
            p.grad = None
        x = x0.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y, saved[fused] = _saved_bytes(lambda: norm_linear(x, norm, lin) if fused else lin(norm(x)))
        (y.float() * g).sum().backward()
        got[fused] = [y.detach().float(), x.grad, norm.weight.grad, norm.bias.grad, lin.weight.grad, lin.bias.grad]
    for a, b in zip(got[True], got[False]):
        assert a.dtype == b.dtype
        assert float((a.float() - b.float()).abs().max()) <= (2e-2 if autocast else 1e-5) * float(b.abs().max())
    assert saved[True] < saved[False]


def test_activation_recompute_switches_off_and_on_for_a_whole_model():
    """greenmim.set_activation_recompute(model, False) keeps every activation (the plain path, more
    bytes saved); the loss and gradients do not change; on is the default."""
    torch.manual_seed(0)
    model = greenmim.mim.green_mim_swin_nano_patch4_dec128b1()
    assert all(m.recompute for m in model.modules() if hasattr(m, "recompute"))
    img = torch.randn(2, 3, 224, 224)
    plan = model.plan(greenmim.random_masks(2, generator=torch.Generator().manual_seed(1)))
    got = {}
    for on in (True, False):
        greenmim.set_activation_recompute(model, on)
        model.zero_grad()
        loss, saved = _saved_bytes(lambda: model(img, plan)[0])
        loss.backward()
        got[on] = (saved, loss.detach(), [p.grad.clone() for p in model.parameters()])
    assert got[True][0] < got[False][0]
    torch.testing.assert_close(got[True][1], got[False][1], rtol=0, atol=0)
    for a, b in zip(got[True][2], got[False][2]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
