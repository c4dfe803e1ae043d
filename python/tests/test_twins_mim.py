"""GreenMIM on Twins (green_mim_twins_*): the released Twins-L configuration, the toy model's
loss and gradients (shared and per-sample masks, one sample at a time), the pretraining
recipe's planning, and the encoder's FLOPs as torch counts them against the simulation's
accounting (greenmim.flops; ``greenmim simulate --model twins-l`` where the CLI is built)."""
import os
import json
import subprocess

import pytest
import torch

import greenmim
from greenmim import GreenmimError, flops

timm = pytest.importorskip("timm")

NANO = "green_mim_twins_nano_patch4_dec128b1"
LARGE = "green_mim_twins_large_patch4_dec512b1"


def _model(dtype=torch.float64, **kw):
    torch.manual_seed(0)
    return greenmim.create_model(NANO, **kw).to(dtype)


def _mae_loss(imgs, pred, masked):
    """MAE's norm-pix loss on 32-px units, written out."""
    B = imgs.shape[0]
    t = imgs.reshape(B, 3, 7, 32, 7, 32).permute(0, 2, 4, 3, 5, 1).reshape(B, 49, -1)
    t = (t - t.mean(-1, keepdim=True)) / (t.var(-1, keepdim=True) + 1e-6) ** 0.5
    loss = ((pred - t) ** 2).mean(-1)
    return (loss * masked).sum() / masked.sum()


def test_twins_large_is_the_released_configuration():
    with torch.device("meta"):
        m = greenmim.mim.green_mim_twins_large_patch4_dec512b1()
    enc = m.encoder
    assert isinstance(enc, greenmim.VisibleTwins)
    assert enc.embed_dims == (128, 256, 512, 1024) and enc.depths == (2, 2, 18, 2)
    assert enc.sr_ratios == (8, 4, 2, 1) and enc.wss == (7, 7, 7, 7) and enc.patch_size == 4
    assert [b[0].attn.num_heads for b in enc.blocks] == [4, 8, 16, 32]
    assert m.unit == 32 and m.grid == 7 and m.mask_token.shape[-1] == 512 and len(m.decoder_blocks) == 1
    assert m.decoder_pred.out_features == 32 * 32 * 3
    assert greenmim.mim.model_names()[LARGE].startswith("released: Twins-SVT-L")
    with torch.device("meta"):          # the encoder's names are timm's: its state dict loads strictly
        ref = timm.create_model("twins_svt_large", pretrained=False, num_classes=0)
    enc.load_state_dict(ref.state_dict(), strict=True, assign=True)


@pytest.mark.parametrize("per_sample", [False, True])
def test_nano_loss_and_gradients(per_sample):
    model = _model()
    imgs = torch.randn(3, 3, 224, 224, dtype=torch.float64)
    vis = greenmim.random_masks(3 if per_sample else None)
    plan = model.plan(vis)
    assert isinstance(plan, greenmim.TwinsPlan)
    loss, pred, mask = model(imgs, plan)
    units = vis if per_sample else vis.expand(3, 7, 7)
    torch.testing.assert_close(mask, (~units).reshape(3, 49).float())
    torch.testing.assert_close(loss, _mae_loss(imgs, pred, mask.double()), rtol=1e-12, atol=1e-12)
    loss.backward()
    assert torch.isfinite(loss)
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, n


def test_nano_per_sample_batch_equals_one_image_at_a_time():
    model = _model()
    imgs = torch.randn(3, 3, 224, 224, dtype=torch.float64)
    vis = greenmim.random_masks(3)
    with torch.no_grad():
        _, pred, _ = model(imgs, model.plan(vis))
        for b in range(3):
            _, alone, _ = model(imgs[b:b + 1], model.plan(vis[b]))
            torch.testing.assert_close(pred[b:b + 1], alone, rtol=1e-10, atol=1e-10)


def test_nano_refuses_a_swin_plan_and_an_all_visible_mask():
    model = _model()
    imgs = torch.randn(2, 3, 224, 224, dtype=torch.float64)
    with pytest.raises(GreenmimError, match="TwinsPlan"):
        model(imgs, greenmim.plan_masks(greenmim.random_masks()))
    with pytest.raises(GreenmimError, match="every unit is visible"):
        model(imgs, model.plan(torch.ones(7, 7, dtype=torch.bool)))


def test_pretraining_plans_twins_through_its_spec():
    """greenmim.pretrain's Geometry plans with the encoder's picklable TwinsPlanSpec (DataLoader
    workers), fixed group sizes under --compile."""
    import pickle
    from greenmim.pretrain import data
    model = greenmim.create_model(NANO)
    geo = pickle.loads(pickle.dumps(data.Geometry(model, fixed_groups=True)))
    plan = geo.plan(greenmim.random_masks(2))
    assert isinstance(plan, greenmim.TwinsPlan) and plan.per_sample
    assert geo.spec.group_size == -1 and [s.partition.group_size for s in plan.stages][:3] == [49, 49, 49]
    loss, _, _ = model(torch.randn(2, 3, 224, 224), plan)
    assert torch.isfinite(loss)


# ---- FLOPs ------------------------------------------------------------------------------------

L_WIDE = dict(embed_dims=(128, 256, 512, 1024), num_heads=(4, 8, 16, 32), depths=(2, 2, 2, 2))


def _randomised(model):
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    return model.eval()


@pytest.mark.parametrize("masks", ["unit", "patch"])
def test_torch_counts_what_the_simulation_counts(masks):
    """FlopCounterMode's count of every stage equals the simulation's formula on the same plan
    exactly, once LSA's projections are counted over the tokens (the model) rather than the
    planner's padded slots (simulate's cost model); per-sample batches too (uniform ones, and
    uneven ones whose GSA attends in the padded layout)."""
    model = _randomised(greenmim.VisibleTwins(**L_WIDE))
    x = torch.randn(2, 3, 224, 224)
    vis = greenmim.random_masks() if masks == "unit" else torch.rand(56, 56) < 0.3
    plan = model.plan(vis)
    with torch.no_grad():
        got = flops.stage_macs(model, x, plan)
    want = flops.twins_stage_formula(model, plan, 2, padded_lsa_linear=False)
    padded = flops.twins_stage_formula(model, plan, 2)
    for i in range(4):
        assert got[i] == pytest.approx(want[i], rel=1e-12), i
        assert got[i] <= padded[i]
    assert got[0] < padded[0]                           # stage 1's windows are never all full
    per = model.plan(greenmim.random_masks(2) if masks == "unit" else torch.rand(2, 56, 56) < 0.3)
    with torch.no_grad():
        got = flops.stage_macs(model, x, per)
    want = flops.twins_stage_formula(model, per, 1, padded_lsa_linear=False)
    for i in range(4):
        assert got[i] == pytest.approx(want[i], rel=1e-12), i


def _cli():
    lib = os.environ.get("GREENMIM_LIB_DIR")
    path = os.path.join(lib, "..", "bin", "greenmim") if lib else None
    if not path or not os.path.exists(path):
        pytest.skip("the greenmim CLI is not built beside GREENMIM_LIB_DIR (cmake --build build --target greenmim_tool)")
    return path


def test_simulate_twins_l_agrees_with_torch_stage_by_stage():
    """`greenmim simulate --model twins-l`: its all-token figures are torch's count of timm's
    twins_svt_large (meta tensors: shapes only) to the printed precision; its visible figures are
    within 0.5% of torch's count of the visible-token Twins-L, stage by stage, on other random
    masks (simulate's 100 against our 4; the padded LSA projections are 0.3% at most)."""
    sim = json.loads(subprocess.run([_cli(), "simulate", "--model", "twins-l", "--json"], check=True,
                                    capture_output=True, text=True).stdout)
    with torch.device("meta"):
        dense = flops.stage_macs(timm.create_model("twins_svt_large", pretrained=False).eval(),
                                 torch.empty(1, 3, 224, 224))
        ours = greenmim.twins.twins_svt_large()
    ours = _randomised(ours.to_empty(device="cpu"))
    x = torch.randn(1, 3, 224, 224)
    g = torch.Generator().manual_seed(0)
    vis = [0.0] * 4
    with torch.no_grad():
        for _ in range(4):
            for i, v in enumerate(flops.stage_macs(ours, x, ours.plan(greenmim.random_masks(generator=g)))):
                vis[i] += v / 4
    for i, s in enumerate(sim["stages"]):
        assert dense[i] / 1e6 == pytest.approx(s["all"]["total"], abs=0.01), i
        assert vis[i] / 1e6 == pytest.approx(s["visible"]["total"], rel=5e-3), i
    assert sum(dense) / sum(vis) == pytest.approx(sim["total"]["flops_ratio"], rel=5e-3)


def test_custom_op_formulas_count_what_torchs_path_computes():
    """The FLOP formulas of greenmim's custom ops (reached with algo="reference" on the CPU)
    equal torch's count of the same computation in torch's kernels (algo="auto"), forward and
    backward, with and without weight gradients; the depthwise conv (no torch path) counts 9
    multiply-adds per output, as many for dx, and for dweight when asked."""
    from torch.utils.flop_counter import FlopCounterMode
    flops.register_flop_formulas()
    model = greenmim.VisibleTwins(embed_dims=(16, 32, 64, 128), num_heads=(1, 2, 4, 8), depths=(2, 2, 2, 2))
    plan = model.plan(torch.rand(2, 56, 56) < 0.3)
    st = plan.stages[0]
    x = torch.randn(1, st.num_tokens, 16, requires_grad=True)
    qkv = torch.randn(1, st.num_tokens, 3, 2, 8, requires_grad=True)

    def count(f):
        c = FlopCounterMode(display=False)
        with c:
            f().square().sum().backward()
        return c.get_total_flops()
    for weights_grad in (False, True):
        w, b = torch.randn(32, 16, 2, 2, requires_grad=weights_grad), torch.randn(32, requires_grad=weights_grad)
        for op in (lambda a: greenmim.group_window_attention_packed(qkv, None, st.partition, algo=a),
                   lambda a: greenmim.conv_ops.block_conv(x, st.embed, w, b, algo=a)):
            ref, auto = count(lambda: op("reference")), count(lambda: op("auto"))
            assert ref == auto > 0
        dw = torch.randn(16, 1, 3, 3, requires_grad=weights_grad)
        got = count(lambda: greenmim.conv_ops.submanifold_depthwise_conv3x3(x, st.neighbors, dw, None))
        assert got == (3 if weights_grad else 2) * 2 * 9 * st.num_tokens * 16     # forward, dx (, dweight)


def test_pretrain_cli_trains_the_twins_toy(tmp_path):
    """`python -m greenmim.pretrain --model green_mim_twins_nano_patch4_dec128b1`: two steps with
    per-sample masks planned in a loader worker, a checkpoint whose encoder is timm's Twins."""
    from greenmim.pretrain import cli
    argv = ["--model", NANO, "--batch_size", "2", "--epochs", "1", "--warmup_epochs", "0", "--lr", "1e-3",
            "--max_steps", "2", "--output_dir", str(tmp_path), "--num_workers", "1", "--device", "cpu",
            "--per_sample_masks"]
    assert cli.main(argv) == 0
    ckpt = torch.load(next(tmp_path.glob("checkpoint-*.pth")), map_location="cpu", weights_only=False)
    enc = {k[len("encoder."):]: v for k, v in ckpt["model"].items() if k.startswith("encoder.")}
    cfg = {k: v for k, v in greenmim.mim._ARCHS[NANO][1].items() if k != "img_size"}
    ref = timm.models.twins.Twins(num_classes=0, **cfg)
    ref.load_state_dict(enc, strict=True)


@pytest.mark.parametrize("which", ["nano", "large"])
def test_export_loads_in_timms_twins(tmp_path, which):
    """greenmim.export on a Twins checkpoint: timm's preset for Twins-L (no kwargs), the
    checkpoint's config for the toy; timm's Twins then equals ours with every token visible."""
    from greenmim import export
    name = NANO if which == "nano" else LARGE
    if which == "nano":
        model = _model()
    else:
        with torch.device("meta"):
            model = greenmim.create_model(name)
        model = _randomised(model.to_empty(device="cpu")).double()
    src = {"model": model.state_dict(), "config": model.config}
    timm_name, kw = export.export(src, str(tmp_path / "t.pth"), num_classes=0 if which == "large" else 1000)
    assert (timm_name, kw) == ("twins_svt_large", {"num_classes": 0}) if which == "large" else \
        (timm_name == "twins_svt_small" and kw["embed_dims"] == (32, 64, 128, 256) and kw["num_heads"] == (1, 2, 4, 8))
    if which == "large":                         # a forward of Twins-L in float64 is slow: the weights suffice
        ref = timm.create_model(timm_name, pretrained=True, pretrained_cfg_overlay=dict(file=str(tmp_path / "t.pth")),
                                **kw)
        for k, v in ref.state_dict().items():
            assert torch.equal(v.double(), model.state_dict()["encoder." + k]), k
        return
    ref = timm.create_model(timm_name, pretrained=True, pretrained_cfg_overlay=dict(file=str(tmp_path / "t.pth")),
                            **kw).double().eval()
    x = torch.randn(2, 3, 224, 224, dtype=torch.float64)
    with torch.no_grad():
        got = model.encoder.forward_features(x, model.plan(torch.ones(7, 7, dtype=torch.bool)))
        torch.testing.assert_close(got, ref.forward_features(x), rtol=1e-9, atol=1e-9)
    assert ref.head.weight.shape == (1000, 256)
