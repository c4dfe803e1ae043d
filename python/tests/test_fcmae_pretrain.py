"""FCMAE (ConvNeXt V2) in ``python -m greenmim.pretrain``: its recipe defaults, training on the CPU,
bitwise resume, two DDP processes, --compile (one graph over fresh masks), the refusals, and the
export to timm's convnextv2_*."""
import json

import pytest
import torch

import greenmim
from greenmim import export as gexport
from greenmim.pretrain import args as pargs
from greenmim.pretrain import cli, dist, engine, graphs
from conftest import torchrun_ranks

ATTO = "fcmae_convnextv2_atto_dec512b1"
pytest.importorskip("skimage")
pytest.importorskip("torchvision")
pytest.importorskip("timm")


def _quick(out, *extra):
    return ["--model", ATTO, "--input_size", "64", "--batch_size", "2", "--epochs", "2", "--warmup_epochs", "1",
            "--lr", "1e-3", "--output_dir", str(out), "--num_workers", "0", "--vis_freq", "100", "--save_freq", "100",
            "--device", "cpu", *extra]


def _losses(path):
    return [r for r in map(json.loads, open(path)) if "step" in r]


def test_the_recipe_fills_unset_flags_and_an_explicit_value_wins():
    a = pargs.parser().parse_args(["--model", ATTO])
    pargs.validate(a)
    assert (a.mask_ratio, a.per_sample_masks) == (0.6, True)
    assert any("recipe: mask ratio 0.6, one mask per image" in n for n in a.notes), a.notes
    a = pargs.parser().parse_args(["--model", ATTO, "--mask_ratio", "0.5", "--shared_masks"])
    pargs.validate(a)
    assert (a.mask_ratio, a.per_sample_masks) == (0.5, False) and not a.notes
    a = pargs.parser().parse_args(["--model", "green_mim_swin_nano_patch4_dec128b1"])     # GreenMIM's as before
    pargs.validate(a)
    assert (a.mask_ratio, a.per_sample_masks, a.notes) == (0.75, False, [])
    a = pargs.parser().parse_args(["--model", ATTO])
    pargs.validate(a)
    use, line = graphs.choose(a, torch.device("cuda", 0))    # choose reads the device's type only
    assert use and line is None                              # its plans come from the loader: capturable
    assert set(greenmim.mim.FCMAE_ARCHS) <= set(greenmim.mim.model_names())


@pytest.mark.parametrize("flags, why", [(["--window_size", "7"], "--window_size"),
                                        (["--decoder_order", "released"], "--decoder_order released"),
                                        (["--input_size", "80"], "multiple of 32")])
def test_what_does_not_apply_to_fcmae_is_one_line_and_exit_2(tmp_path, capfd, flags, why):
    assert cli.main(_quick(tmp_path / "o", "--max_steps", "1", *flags)) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("greenmim.pretrain: error: ") and why in err[0], err


def test_the_loss_falls_on_a_fixed_batch():
    torch.manual_seed(0)
    model = greenmim.create_model(ATTO, img_size=64)
    imgs = torch.randn(2, 3, 64, 64)
    visible = model.random_masks(2, generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(8):
        loss = model(imgs, model.plan(visible))[0]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(map(torch.isfinite, torch.tensor(losses)))
    assert losses[-1] < 0.8 * losses[0], losses


def test_compile_is_one_graph_over_fresh_masks_and_equals_eager(tmp_path):
    """8 steps, fresh per-sample masks each: the plans, made in the loader, keep their shapes at
    the recipe's ratio, so one graph serves them all; the losses equal an eager run's."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    assert cli.main(_quick(tmp_path / "c", "--max_steps", "8", "--compile", "--compile_backend", "aot_eager")) == 0
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["recompiles"])
    assert cli.main(_quick(tmp_path / "e", "--max_steps", "3")) == 0
    compiled, eager = _losses(tmp_path / "c" / "log.jsonl")[:3], _losses(tmp_path / "e" / "log.jsonl")
    torch.testing.assert_close(torch.tensor([r["loss"] for r in compiled]), torch.tensor([r["loss"] for r in eager]),
                               rtol=1e-4, atol=1e-5)


def test_it_trains_and_resumes_bitwise_and_exports_to_timm(tmp_path, capfd):
    a, b = tmp_path / "a", tmp_path / "b"
    assert cli.main(_quick(a, "--max_steps", "4")) == 0
    out = capfd.readouterr().out
    assert f"{ATTO} (" in out and "masks: one per image, ratio 0.6" in out and "recipe: mask ratio 0.6" in out
    assert (a / "vis" / "epoch_0000.png").is_file()
    assert cli.main(_quick(b, "--max_steps", "2")) == 0
    assert cli.main(_quick(b, "--max_steps", "4", "--resume", "auto")) == 0
    la, lb = _losses(a / "log.jsonl"), _losses(b / "log.jsonl")
    assert [r["step"] for r in lb] == [1, 2, 3, 4]
    assert all(r["loss"] is not None for r in la)
    assert [r["loss"] for r in la] == [r["loss"] for r in lb]            # bitwise
    ca = torch.load(a / "checkpoint-0-step4.pth", weights_only=False)
    cb = torch.load(b / "checkpoint-0-step4.pth", weights_only=False)
    for k, v in ca["model"].items():
        assert torch.equal(v, cb["model"][k]), k
    capfd.readouterr()
    # a Swin's run cannot resume an FCMAE checkpoint
    assert cli.main(["--model", "green_mim_swin_nano_patch4_dec128b1", "--device", "cpu", "--output_dir",
                     str(tmp_path / "c"), "--resume", str(a / "checkpoint-0-step4.pth"), "--max_steps", "5"]) == 2
    assert "another model" in capfd.readouterr().err

    # the export: timm's convnextv2_atto loads it strictly and equals the encoder (float64, all visible)
    timm = pytest.importorskip("timm")
    path = str(tmp_path / "atto.pth")
    assert gexport.main([str(a / "checkpoint-0-step4.pth"), path, "--num_classes", "0"]) == 0
    line = capfd.readouterr().out
    assert "timm.create_model('convnextv2_atto', pretrained=True" in line and "num_classes=0" in line
    ref = timm.create_model("convnextv2_atto", num_classes=0)
    ref.load_state_dict(torch.load(path), strict=True)
    model = greenmim.create_model(ATTO, img_size=64)
    model.load_state_dict(ca["model"])
    model, ref = model.double().eval(), ref.double().eval()
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    tokens, plan = model.encoder(x, torch.ones(2, 2, 2, dtype=torch.bool))
    got = model.encoder.to_dense(tokens, plan)
    torch.testing.assert_close(got, ref.forward_features(x), rtol=1e-10, atol=1e-10)
    assert gexport.main([str(a / "checkpoint-0-step4.pth"), path]) == 0              # with a fresh head
    head = timm.create_model("convnextv2_atto")
    head.load_state_dict(torch.load(path), strict=True)


_TWO_RANKS = ["--model", ATTO, "--input_size", "64", "--batch_size", "2", "--epochs", "1", "--warmup_epochs", "0",
              "--lr", "1e-3", "--max_steps", "2", "--output_dir", "", "--num_workers", "0", "--device", "cpu"]


@pytest.fixture(scope="module")
def one_process_accumulating():
    a = pargs.parser().parse_args(_TWO_RANKS + ["--accum_iter", "2"])
    pargs.validate(a)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                    # as the ranks run (OMP_NUM_THREADS=1)
    try:
        s = engine.run(a, dist.setup(a.device, a.fsdp))
    finally:
        torch.set_num_threads(threads)
    return {"params": {k: v.detach().clone() for k, v in s["model"].state_dict().items()}, "losses": s["losses"]}


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_processes_equal_one_with_accumulation(tmp_path, mode, one_process_accumulating):
    """DDP, and FSDP2 (its units: the decoder blocks; a rank's shard of the mask token is empty)."""
    out, ranks = torchrun_ranks(tmp_path, mode, 2, *_TWO_RANKS, *(["--fsdp"] if mode == "fsdp" else []))
    assert out.returncode == 0, out.stderr[-4000:]
    single = one_process_accumulating
    assert len(single["losses"]) == 2
    for k, v in ranks[0]["params"].items():
        assert torch.equal(v, ranks[1]["params"][k]), k
        torch.testing.assert_close(v, single["params"][k], rtol=1e-5, atol=1e-5, msg=k)
    torch.testing.assert_close(torch.tensor(ranks[0]["losses"]), torch.tensor(single["losses"]), rtol=1e-5, atol=1e-6)
