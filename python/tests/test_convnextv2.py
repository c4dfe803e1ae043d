"""ConvNeXt V2 on visible tokens (convnextv2.py) and the k x k depthwise op under it: the op equals
a dense depthwise conv2d over the zero-filled grid at the visible cells for k = 5 and 7, its
gradients by gradcheck, its fakes by opcheck, torch.compile, the emulated CUDA kernels against the
CPU; the encoder with every unit visible equals timm's forward_features (float64), under
per-sample masks a dense, explicitly masked plain-torch oracle (outputs and gradients), a batch
equals each sample alone, grn="batch" the released MinkowskiGRN's norm over the batch; timm's
convnextv2_atto ... _huge state dicts load strictly."""
import pytest
import torch
import torch.nn.functional as F

import greenmim
from greenmim import GreenmimError, VisibleConvNeXtV2, conv_tables

D = torch.float64


def dense_depthwise_at(x, mask, weight, bias):
    """Per-sample packed tokens x [1, N, C] of mask [B, H, W]: conv2d (groups = C, padding k/2)
    over the zero-filled grid, read back at the visible cells (row-major per sample)."""
    B, H, W = mask.shape
    C, k = x.shape[-1], weight.shape[-1]
    pos = mask.reshape(-1).nonzero().flatten()
    img = x.new_zeros(B * H * W, C)
    img[pos] = x[0]
    img = img.view(B, H, W, C).permute(0, 3, 1, 2)
    y = F.conv2d(img, weight, bias, padding=k // 2, groups=C)
    return y.permute(0, 2, 3, 1).reshape(1, -1, C)[:, pos]


@pytest.mark.parametrize("k", [5, 7])
def test_depthwise_kxk_equals_dense_conv_at_visible_cells(k):
    g = torch.Generator().manual_seed(k)
    mask = torch.rand(3, 9, 11, generator=g) < 0.45
    mask[1] = False                                          # a sample with no visible token
    nt = conv_tables.neighbor_table(mask, kernel=k, cache=False)
    assert nt.nbr.shape == (int(mask.sum()), k * k) and nt.kernel == k
    C = 5
    x = torch.randn(1, nt.num_tokens, C, dtype=D, generator=g)
    w, b = torch.randn(C, 1, k, k, dtype=D, generator=g), torch.randn(C, dtype=D, generator=g)
    for residual in (False, True):
        got = greenmim.ops.submanifold_depthwise_conv(x, nt, w, b, residual=residual)
        want = dense_depthwise_at(x, mask, w, b) + (x if residual else 0)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    xs, ws, bs = (t.clone().requires_grad_() for t in (x[:, :40], w, b))
    nt_small = conv_tables.neighbor_table(torch.rand(1, 8, 8, generator=g) < 0.6, kernel=k, cache=False)
    xs = torch.randn(1, nt_small.num_tokens, 3, dtype=D, generator=g, requires_grad=True)
    ws = torch.randn(3, 1, k, k, dtype=D, generator=g, requires_grad=True)
    bs = torch.randn(3, dtype=D, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: greenmim.ops.submanifold_depthwise_conv(x, nt_small, w, b), (xs, ws, bs))


def test_depthwise_kxk_opcheck_and_compile():
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck needs a newer torch")
    g = torch.Generator().manual_seed(3)
    mask = torch.rand(2, 8, 8, generator=g) < 0.5
    nt = conv_tables.neighbor_table(mask, kernel=7, cache=False)
    x = torch.randn(1, nt.num_tokens, 4, dtype=D, generator=g, requires_grad=True)
    w = torch.randn(4, 1, 7, 7, dtype=D, generator=g, requires_grad=True)
    b = torch.randn(4, dtype=D, generator=g, requires_grad=True)
    ops = torch.ops.greenmim
    torch.library.opcheck(ops.depthwise_conv3x3_fwd.default, (x, nt.nbr, w, b, False))
    dy = torch.randn(1, nt.num_tokens, 4, dtype=D, generator=g)
    torch.library.opcheck(ops.depthwise_conv3x3_bwd.default, (dy, x.detach(), nt.nbr, w.detach(), False, True, True))
    f = lambda x, w, b: greenmim.ops.submanifold_depthwise_conv(x, nt, w, b)
    want = f(x, w, b)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(x, w, b)
    torch.testing.assert_close(got, want)
    ga = torch.autograd.grad(got.sum(), (x, w, b))
    gw = torch.autograd.grad(want.sum(), (x, w, b))
    for a, e in zip(ga, gw):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_depthwise_7x7_emulated_cuda_equals_cpu(dtype, tol):
    g = torch.Generator().manual_seed(5)
    mask = torch.rand(2, 8, 8, generator=g) < 0.6
    nt = conv_tables.neighbor_table(mask, kernel=7, cache=False)
    C = 16
    x = torch.randn(1, nt.num_tokens, C, generator=g)
    w, b = torch.randn(C, 1, 7, 7, generator=g), torch.randn(C, generator=g)
    ins = [t.clone().requires_grad_() for t in (x, w, b)]
    want = greenmim.ops.submanifold_depthwise_conv(*ins[:1], nt, *ins[1:])
    gy = torch.randn_like(want)
    want_g = torch.autograd.grad(want, ins, gy)
    emu = [ins[0].detach().to(dtype).requires_grad_(), *(t.detach().clone().requires_grad_() for t in ins[1:])]
    with greenmim.emulate_cuda():
        got = greenmim.ops.submanifold_depthwise_conv(emu[0], nt, emu[1], emu[2])
        got_g = torch.autograd.grad(got, emu, gy.to(dtype))
    scale = float(want.detach().abs().max())
    torch.testing.assert_close(got.detach().float(), want.detach(), rtol=tol, atol=tol * scale)
    for a, e in zip(got_g, want_g):
        torch.testing.assert_close(a.float(), e, rtol=tol, atol=tol * float(e.abs().max()))


def test_depthwise_kxk_refusals():
    g = torch.Generator().manual_seed(9)
    mask = torch.rand(1, 8, 8, generator=g) < 0.5
    n3 = conv_tables.neighbor_table(mask, cache=False)
    n7 = conv_tables.neighbor_table(mask, kernel=7, cache=False)
    x = torch.randn(1, n7.num_tokens, 4, dtype=D)
    conv = greenmim.ops.submanifold_depthwise_conv
    with pytest.raises(GreenmimError, match="7x7 weight with a 3x3 neighbour table"):
        conv(x, n3, torch.randn(4, 1, 7, 7, dtype=D))
    with pytest.raises(GreenmimError, match="another stage or mask"):
        conv(x[:, 1:], n7, torch.randn(4, 1, 7, 7, dtype=D))
    with pytest.raises(GreenmimError, match="odd"):
        conv(x, n7, torch.randn(4, 1, 6, 6, dtype=D))
    with pytest.raises(GreenmimError, match="odd"):
        conv_tables.neighbor_table(mask, kernel=4, cache=False)
    with pytest.raises(GreenmimError, match=r"\[C, 1, 3, 3\]"):
        greenmim.ops.submanifold_depthwise_conv3x3(x, n7, torch.randn(4, 1, 7, 7, dtype=D))


# ---- the encoder ---------------------------------------------------------------------------------

def _encoder(grn="sample"):
    torch.manual_seed(0)
    enc = VisibleConvNeXtV2("convnextv2_atto", grn=grn, num_classes=0).double().eval()
    with torch.no_grad():
        for n, p in enc.named_parameters():
            if "grn" in n:                                    # timm inits GRN to zero: make it count
                p.normal_(0, 0.5)
    return enc


def masked_oracle(model, img, vis, grn="sample"):
    """Dense ConvNeXt V2 in plain torch over the masked image, zeroing masked sites after every op
    that could fill them (the JAX / SparK formulation), on the model's own parameters."""
    def mask(s):
        r = 8 >> s
        return vis.repeat_interleave(r, 1).repeat_interleave(r, 2).unsqueeze(1).to(img.dtype)

    def ln2d(x, norm):
        return F.layer_norm(x.permute(0, 2, 3, 1), (x.shape[1],), norm.weight, norm.bias, norm.eps).permute(0, 3, 1, 2)

    def lin(x, layer):
        w = layer.weight
        return torch.einsum("bchw,oc->bohw", x, w.reshape(w.shape[0], -1)) + layer.bias.view(1, -1, 1, 1)

    x = ln2d(F.conv2d(img, model.stem[0].weight, model.stem[0].bias, stride=4), model.stem[1]) * mask(0)
    for s, stage in enumerate(model.stages):
        m = mask(s)
        if s > 0:
            ds = stage.downsample
            x = F.conv2d(ln2d(x, ds[0]) * mask(s - 1), ds[1].weight, ds[1].bias, stride=2) * m
        for blk in stage.blocks:
            k = blk.conv_dw.weight.shape[-1]
            y = F.conv2d(x, blk.conv_dw.weight, blk.conv_dw.bias, padding=k // 2, groups=x.shape[1]) * m
            y = F.gelu(lin(ln2d(y, blk.norm), blk.mlp.fc1)) * m
            if grn == "sample":
                gn = y.norm(p=2, dim=(2, 3), keepdim=True)
            else:
                gn = y.pow(2).sum(dim=(0, 2, 3), keepdim=True).sqrt()
            n = gn / (gn.mean(dim=1, keepdim=True) + blk.mlp.grn.eps)
            y = (y + blk.mlp.grn.bias.view(1, -1, 1, 1) + blk.mlp.grn.weight.view(1, -1, 1, 1) * y * n) * m
            x = x + lin(y, blk.mlp.fc2) * m
    return x


def test_every_unit_visible_equals_timm_forward_features():
    import timm
    enc = _encoder()
    ref = timm.create_model("convnextv2_atto", pretrained=False, num_classes=0).double().eval()
    ref.load_state_dict(enc.state_dict(), strict=True)
    img = torch.randn(2, 3, 64, 96, dtype=D)
    tokens, plan = enc(img, torch.ones(2, 2, 3, dtype=torch.bool))
    torch.testing.assert_close(enc.to_dense(tokens, plan), ref.forward_features(img), rtol=1e-10, atol=1e-10)


def test_per_sample_masks_equal_the_masked_dense_oracle_and_each_sample_alone():
    enc = _encoder()
    g = torch.Generator().manual_seed(1)
    vis = torch.rand(3, 2, 3, generator=g) < 0.5
    vis[:, 0, 0] = True
    vis[2] = False
    vis[2, 1, 2] = True                                       # a sample with one visible unit
    img = torch.randn(3, 3, 64, 96, dtype=D, generator=g, requires_grad=True)
    tokens, plan = enc(img, vis)
    dense = enc.to_dense(tokens, plan)
    want = masked_oracle(enc, img, vis)
    torch.testing.assert_close(dense, want, rtol=1e-10, atol=1e-10)
    alone = torch.cat([enc.to_dense(*enc(img[b:b + 1], vis[b:b + 1])) for b in range(3)])
    torch.testing.assert_close(alone, dense, rtol=1e-12, atol=1e-12)
    # gradients: the image's and every parameter's, against the oracle's
    gy = torch.randn_like(dense)
    params = [p for p in enc.parameters() if p.requires_grad]
    got = torch.autograd.grad((dense * gy).sum(), [img, *params], allow_unused=True)
    exp = torch.autograd.grad((want * gy).sum(), [img, *params], allow_unused=True)
    for (name, _), a, e in zip([("img", None), *enc.named_parameters()], got, exp):
        if e is None:
            assert a is None or float(a.abs().max()) == 0, name
            continue
        torch.testing.assert_close(a, e, rtol=1e-9, atol=1e-9, msg=lambda m: f"{name}: {m}")


def test_grn_batch_is_the_released_norm_over_the_batch():
    enc = _encoder(grn="batch")
    g = torch.Generator().manual_seed(2)
    vis = torch.rand(2, 2, 3, generator=g) < 0.5
    vis[:, 0, 0] = True
    img = torch.randn(2, 3, 64, 96, dtype=D, generator=g)
    tokens, plan = enc(img, vis)
    dense = enc.to_dense(tokens, plan)
    torch.testing.assert_close(dense, masked_oracle(enc, img, vis, "batch"), rtol=1e-10, atol=1e-10)
    enc.grn = "sample"
    per_sample = enc.to_dense(*enc(img, vis))
    assert float((per_sample - dense).detach().abs().max()) > 1e-3       # the batch's norm moves a sample


@pytest.mark.parametrize("name", ["convnextv2_atto", "convnextv2_femto", "convnextv2_pico", "convnextv2_nano",
                                  "convnextv2_tiny", "convnextv2_base", "convnextv2_large", "convnextv2_huge"])
def test_timm_state_dicts_load_strictly(name):
    import timm
    with torch.device("meta"):
        enc = VisibleConvNeXtV2(name)
        ref = timm.create_model(name, pretrained=False)
    sd = ref.state_dict()
    assert {k: tuple(v.shape) for k, v in enc.state_dict().items()} == {k: tuple(v.shape) for k, v in sd.items()}
    enc.load_state_dict(sd, strict=True, assign=True)


def test_bad_masks_are_refused():
    enc = _encoder()
    img = torch.randn(1, 3, 64, 64, dtype=D)
    with pytest.raises(GreenmimError, match=r"bool \[B, H/32, W/32\]"):
        enc(img, torch.ones(1, 3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="convnextv2_"):
        VisibleConvNeXtV2("convnext_atto")
    with pytest.raises(ValueError, match="grn"):
        VisibleConvNeXtV2("convnextv2_atto", grn="global")


# ---- FCMAE ---------------------------------------------------------------------------------------

def _fcmae():
    from greenmim.fcmae import FCMAE
    torch.manual_seed(0)
    model = FCMAE("convnextv2_atto", img_size=64, decoder_embed_dim=32).double()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "grn" in n:
                p.normal_(0, 0.5)
    return model


def test_fcmae_equals_a_dense_masked_fcmae():
    """The released FCMAE's forward written densely: the masked oracle's last stage, proj, mask
    tokens at the masked units, the dense decoder, pred; norm-pix MSE on the masked units."""
    model = _fcmae()
    g = torch.Generator().manual_seed(4)
    vis = model.random_masks(3, generator=g)
    assert tuple(vis.shape) == (3, 2, 2) and bool((vis.sum((1, 2)) == 1).all())    # int(4 * 0.4) visible
    img = torch.randn(3, 3, 64, 64, dtype=D, generator=g)
    loss, pred, mask = model(img, vis)
    x = model.proj(masked_oracle(model.encoder, img, vis))
    m = (~vis).unsqueeze(1).to(D)
    x = model.pred(model.decoder(x * (1 - m) + model.mask_token * m))
    want_pred = x.flatten(2).transpose(1, 2)
    target = img.reshape(3, 3, 2, 32, 2, 32).permute(0, 2, 4, 3, 5, 1).reshape(3, 4, 3072)
    target = (target - target.mean(-1, keepdim=True)) / (target.var(-1, keepdim=True) + 1e-6) ** 0.5
    want_mask = (~vis).reshape(3, 4).to(D)
    want = (((want_pred - target) ** 2).mean(-1) * want_mask).sum() / want_mask.sum()
    torch.testing.assert_close(pred, want_pred, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(mask, want_mask.float())
    torch.testing.assert_close(loss, want, rtol=1e-10, atol=1e-12)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]   # not the frozen encoder.head
    params = [p for _, p in named]
    got = torch.autograd.grad(loss, params, allow_unused=True)
    exp = torch.autograd.grad(want, params, allow_unused=True)
    for (name, _), a, e in zip(named, got, exp):
        if e is None:
            assert a is None or float(a.abs().max()) == 0, name
        else:
            torch.testing.assert_close(a, e, rtol=1e-9, atol=1e-10, msg=lambda s: f"{name}: {s}")


def test_fcmae_export_loads_in_timm_and_bad_input_is_refused():
    import timm
    from greenmim.fcmae import export_encoder
    model = _fcmae()
    ref = timm.create_model("convnextv2_atto", pretrained=False, num_classes=0).double().eval()
    ref.load_state_dict(export_encoder(model), strict=True)
    img = torch.randn(2, 3, 64, 64, dtype=D)
    tokens, plan = model.encoder.eval()(img, torch.ones(2, 2, 2, dtype=torch.bool))
    torch.testing.assert_close(model.encoder.to_dense(tokens, plan), ref.forward_features(img), rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="nothing to reconstruct"):
        model(img, torch.ones(2, 2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\[B, 2, 2\] masks"):
        model(img, torch.ones(2, 7, 7, dtype=torch.bool))


def _convnext_flops():
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[2] / "bench" / "convnext_flops.py"
    spec = importlib.util.spec_from_file_location("convnext_flops", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_convnext_flops_bench_visible_against_dense():
    """bench/convnext_flops.py at toy size (atto, 96 px, a 3x3 grid of units): with per-sample masks
    of different sizes each stage's visible count is below the dense one and saves the masked share
    of the units (every counted op is per token, the 7x7 depthwise k*k taps a token as timm's dense
    conv counts them); with every unit visible the counts are equal (LayerNorm, GELU and GRN count
    zero FLOPs in both: FlopCounterMode counts matmuls and convolutions)."""
    bench = _convnext_flops()
    g = torch.Generator().manual_seed(3)
    masks = torch.zeros(3, 3, 3, dtype=torch.bool)
    for b, keep in enumerate((1, 4, 8)):                 # a corner-only sample, a middle one, nearly all
        masks[b].view(-1)[torch.randperm(9, generator=g)[:keep]] = True
    r = bench.stage_flops("convnextv2_atto", img=96, visible=masks)
    share = int(masks.sum()) / masks.numel()
    assert r["visible_share"] == share
    for s in r["stages"]:
        assert 0 < s["visible_gflops"] < s["dense_gflops"]
        assert abs(s["saved"] - (1 - share)) < 1e-9, (s, share)
    full = bench.stage_flops("convnextv2_atto", img=96, visible=torch.ones(2, 3, 3, dtype=torch.bool))
    for s in full["stages"]:
        assert s["dense_gflops"] > 0 and s["visible_gflops"] == s["dense_gflops"]
    assert bench.main(["--model", "convnextv2_atto", "--img", "64", "--batch", "1", "--json"]) == 0
    with pytest.raises(SystemExit):
        bench.main(["--img", "100"])
