"""python -m greenmim.pretrain: flags, bad input, exact resume, DDP and FSDP2 under torchrun, the
data pipeline under the common open-file limit, export to timm, and that it learns."""
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import greenmim
from greenmim.pretrain import args as pargs
from greenmim.pretrain import cli, data, dist, engine
from conftest import child_env, torchrun_ranks

ROOT = pathlib.Path(__file__).resolve().parents[2]
NANO = "green_mim_swin_nano_patch4_dec128b1"
pytest.importorskip("skimage")
pytest.importorskip("torchvision")


_env = child_env


def _run(*argv, timeout=600):
    return subprocess.run([sys.executable, "-m", "greenmim.pretrain", *argv], capture_output=True, text=True,
                          env=_env(), timeout=timeout)


def _quick(out, *extra):
    return ["--model", NANO, "--batch_size", "4", "--epochs", "2", "--warmup_epochs", "1", "--lr", "1e-3",
            "--output_dir", str(out), "--num_workers", "0", "--vis_freq", "100", "--save_freq", "100",
            "--device", "cpu", *extra]


def test_help_prints_every_flag_with_its_default():
    out = _run("--help")
    assert out.returncode == 0
    released = ["--model", "--batch_size", "--epochs", "--accum_iter", "--input_size", "--mask_ratio",
                "--norm_pix_loss", "--weight_decay", "--lr", "--blr", "--min_lr", "--warmup_epochs", "--data_path",
                "--output_dir", "--log_dir", "--resume", "--seed", "--num_workers", "--save_freq"]
    ours = ["--per_sample_masks", "--max_steps", "--amp", "--compile", "--fsdp", "--vis_freq", "--decoder_order"]
    text = " ".join(out.stdout.split())
    for flag in released + ours:
        assert f" {flag} " in text, flag
    for default in ("green_mim_swin_base_patch4_dec512b1", "0.75", "64", "400", "0.05", "0.00015",
                    "./output_dir", "20", "10.0", "2"):
        assert f"(default: {default})" in text, default
    assert "(default: 40; a tenth of --epochs" in text and "(default: none, the whole schedule)" in text
    assert "(default: None)" not in text


def _bad(tmp_path, expect, *argv, capfd=None):
    """Exit code 2, one line on stderr, no checkpoint. In a fresh interpreter (python -m) by
    default; in this one through cli.main with capfd (the same code without the 4 s start, and no
    warning allowed: pytest records warnings instead of printing them)."""
    if capfd is None:
        out = _run(*argv)
        code, err = out.returncode, out.stderr
    else:
        import warnings
        capfd.readouterr()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            code = cli.main(list(argv))
        err = capfd.readouterr().err
        assert not caught, [str(w.message) for w in caught]
    assert code == 2, err[-2000:]
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("greenmim.pretrain: error:"), err
    assert expect in lines[0], lines[0]
    leftovers = [p.name for p in tmp_path.rglob("checkpoint*")]
    assert not leftovers, leftovers


def test_bad_input_is_one_line_and_exit_code_2(tmp_path, capfd):
    """One case through `python -m greenmim.pretrain`: one that builds the model and reads the
    images before it fails, so that nothing else on stderr goes unseen. The rest in this
    interpreter."""
    o = tmp_path / "o"
    _bad(tmp_path, "fewer images than one optimizer step", *_quick(o, "--batch_size", "2000"))
    _bad(tmp_path, "no such folder", *_quick(o, "--data_path", str(tmp_path / "missing")), capfd=capfd)
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    _bad(tmp_path, "no image found", *_quick(o, "--data_path", str(tmp_path / "empty")), capfd=capfd)
    _bad(tmp_path, "--decode gpu: the step runs on cpu", *_quick(o, "--decode", "gpu"), capfd=capfd)
    _bad(tmp_path, "strictly between 0 and 1", *_quick(o, "--mask_ratio", "0"), capfd=capfd)
    _bad(tmp_path, "strictly between 0 and 1", *_quick(o, "--mask_ratio", "1"), capfd=capfd)
    _bad(tmp_path, "closest: green_mim_swin_base_patch4_dec512b1", *_quick(o, "--model",
                                                                           "green_mim_swin_base_patch4_dec5121b1"),
         capfd=capfd)
    bad = tmp_path / "broken"
    bad.mkdir()
    for i in range(6):
        (bad / f"{i}.jpg").write_bytes(b"not an image")
    _bad(tmp_path, "none of 6 images tried could be read", *_quick(o, "--data_path", str(bad)), capfd=capfd)


def test_unreadable_image_is_skipped_with_a_warning(tmp_path):
    from PIL import Image
    folder = tmp_path / "imgs" / "train" / "a"
    folder.mkdir(parents=True)
    for i in range(7):
        Image.new("RGB", (64, 80), (i * 30, 100, 200 - i * 20)).save(folder / f"{i}.png")
    (folder / "7.png").write_bytes(b"\x89PNG broken")
    out = _run(*_quick(tmp_path / "o", "--data_path", str(tmp_path / "imgs"), "--max_steps", "2"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "skipping unreadable image" in out.stderr and "7.png" in out.stderr
    assert "8 images under" in out.stdout


def _losses(path):
    return [json.loads(l) for l in open(path) if '"step"' in l]


def test_resume_continues_bitwise(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    common = ["--per_sample_masks", "--decoder_order", "released"]
    assert cli.main(_quick(a, "--max_steps", "6", "--num_workers", "2", *common)) == 0
    assert cli.main(_quick(b, "--max_steps", "3", *common)) == 0
    assert cli.main(_quick(b, "--max_steps", "6", "--resume", "auto", *common)) == 0
    la, lb = _losses(a / "log.jsonl"), _losses(b / "log.jsonl")
    assert [r["step"] for r in lb] == list(range(1, 7))
    assert [r["loss"] for r in la] == [r["loss"] for r in lb]          # bitwise, workers or not
    ca = torch.load(a / "checkpoint-0-step6.pth", weights_only=False)
    cb = torch.load(b / "checkpoint-0-step6.pth", weights_only=False)
    for k, v in ca["model"].items():
        assert torch.equal(v, cb["model"][k]), k
    assert not list(b.glob("*.tmp-*"))
    # a checkpoint of another model is refused, naming what differs
    out = _run(*_quick(tmp_path / "c", "--resume", str(b / "checkpoint-0-step6.pth"), "--model",
                       "green_mim_swin_tiny_patch4_dec512b1"))
    assert out.returncode == 2 and "another model" in out.stderr and "embed_dim: 32 in the checkpoint, 96 here" \
        in out.stderr, out.stderr


_TWO_RANKS = ["--model", NANO, "--batch_size", "2", "--epochs", "1", "--warmup_epochs", "0", "--lr", "1e-3",
              "--max_steps", "3", "--output_dir", "", "--num_workers", "0", "--per_sample_masks", "--device", "cpu"]


@pytest.fixture(scope="module")
def one_process_accumulating():
    """The reference of the two-rank runs: one process (world size 1, as torchrun with one process
    would give it) accumulating 2 micro-batches a step. Run once, in this interpreter, for both."""
    a = pargs.parser().parse_args(_TWO_RANKS + ["--accum_iter", "2"])
    pargs.validate(a)
    ctx = dist.setup(a.device, a.fsdp)
    assert not ctx.distributed
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                    # as the ranks run (_env: OMP_NUM_THREADS=1)
    try:
        s = engine.run(a, ctx)
    finally:
        torch.set_num_threads(threads)
    return {"params": {k: v.detach().cpu().clone() for k, v in s["model"].state_dict().items()},
            "losses": s["losses"]}


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_processes_equal_one_with_accumulation(tmp_path, mode, one_process_accumulating):
    extra = ["--fsdp"] if mode == "fsdp" else []
    out, ranks = torchrun_ranks(tmp_path, mode, 2, *_TWO_RANKS, *extra)
    if ranks is None and mode == "fsdp":
        pytest.skip("FSDP2 on CPU refused by this torch: " + out.stderr.strip().splitlines()[-1][:300])
    assert ranks is not None, out.stderr[-4000:]
    single = one_process_accumulating
    assert len(single["losses"]) == 3
    for k, v in ranks[0]["params"].items():
        assert torch.equal(v, ranks[1]["params"][k]), k                    # identical across ranks
        torch.testing.assert_close(v, single["params"][k], rtol=1e-5, atol=1e-5, msg=k)
    assert ranks[0]["losses"] == ranks[1]["losses"]                          # the all-reduced mean
    torch.testing.assert_close(torch.tensor(ranks[0]["losses"]), torch.tensor(single["losses"]), rtol=1e-5, atol=1e-6)


_FD_SCRIPT = """
import resource, sys, torch, greenmim
from greenmim.pretrain import data
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

class CachedPlans(torch.utils.data.Dataset):   # the failing pattern: plans made in workers, cache on
    def __len__(self): return 300
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i % 200)
        return greenmim.plan_masks(greenmim.random_masks(4, generator=g), cache=True)

n = sum(1 for _ in torch.utils.data.DataLoader(CachedPlans(), batch_size=None, num_workers=2))
model = greenmim.create_model("green_mim_swin_nano_patch4_dec128b1")
ds = data.MicroBatches(data.SamplePhotographs(), 224, data.Geometry(model), 0.75, True, 0)
sampler = data.StepSampler(len(ds.images), 2, 1, 1, 0, 0)
m = 0
for epoch in range(2):
    sampler.epoch = epoch
    m += sum(1 for _ in data.make_loader(ds, sampler, 2, False))
print("items", n, m)
"""


def test_loader_with_plans_runs_under_1024_open_files(tmp_path):
    script = tmp_path / "fd.py"
    script.write_text(_FD_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=_env(), timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "items 300 960" in out.stdout


def test_uint8_crops_normalized_on_the_device_equal_the_released_transform():
    """The workers send uint8 crops (train_crops) and the step normalises them (normalize): the
    result is bitwise the released float transform under the same random draws, on photographs
    of several sizes and on grey and RGBA images converted as the loader converts them."""
    from PIL import Image
    photos = data.SamplePhotographs(repeats=1)
    g = torch.Generator().manual_seed(5)
    extra = [Image.fromarray((torch.rand(97, 301, generator=g) * 255).to(torch.uint8).numpy()).convert("RGB"),
             Image.fromarray((torch.rand(400, 180, 4, generator=g) * 255).to(torch.uint8).numpy()).convert("RGB")]
    images = [photos.load(i) for i in range(len(photos.names))] + extra
    for size in (224, 192):
        ref_tf, crop_tf = data.train_transform(size), data.train_crops(size)
        for k, im in enumerate(images):
            torch.manual_seed(1000 * size + k)
            ref = ref_tf(im)
            torch.manual_seed(1000 * size + k)
            crop = crop_tf(im)
            assert crop.dtype == torch.uint8 and crop.shape == (3, size, size)
            got = data.normalize(crop[None])[0]
            assert torch.equal(got, ref), (size, k, float((got - ref).abs().max()))
    with pytest.raises(TypeError, match="uint8"):
        data.normalize(torch.zeros(1, 3, 8, 8))


def test_default_workers_share_the_cpus_among_the_node_s_ranks(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert data.worker_count(None) == 15                      # one process: all but its own core
    assert data.worker_count(None, local_world=8) == 1        # 8 ranks on 16 cores: 2 each
    assert data.worker_count(None, local_world=32) == 1       # never 0 by default
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert data.worker_count(None) == 3                       # torchrun's count of this node's ranks
    assert data.worker_count(0) == 0 and data.worker_count(5) == 5   # --num_workers as given
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(256)))
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert data.worker_count(None) == 32                      # capped


def test_sampler_across_epochs_equals_one_sampler_per_epoch():
    """With ``end`` one sampler runs on through the epochs (the trainer's single loader): the same
    items as a sampler per epoch, from a resumed step on, stopping at ``end`` mid-epoch."""
    for accum, world, rank in ((1, 1, 0), (2, 2, 1)):
        per_epoch = [list(data.StepSampler(50, 3, accum, world, rank, seed=7, epoch=e)) for e in range(4)]
        spe = data.StepSampler(50, 3, accum, world, rank, seed=7).steps_per_epoch
        flat = [x for ep in per_epoch for x in ep]
        for start, end in ((0, 4 * spe), (spe + 2, 3 * spe + 1), (2 * spe, 2 * spe), (5, 6)):
            s = data.StepSampler(50, 3, accum, world, rank, seed=7, epoch=start // spe, start_step=start % spe,
                                 end=end)
            got = list(s)
            assert got == flat[start * accum:end * accum], (accum, start, end)
            assert len(s) == len(got)
    assert list(data.StepSampler(2, 3, 1, 1, 0, seed=0, end=10)) == []     # fewer images than a step: no hang


def test_sampler_shards_steps_across_ranks_and_accumulation():
    one = data.StepSampler(40, 2, 2, 1, 0, seed=3, epoch=1)
    two = [data.StepSampler(40, 2, 1, 2, r, seed=3, epoch=1) for r in range(2)]
    a = list(one)
    b0, b1 = list(two[0]), list(two[1])
    assert [x[3] for x in a[0::2]] == [x[3] for x in b0] and [x[3] for x in a[1::2]] == [x[3] for x in b1]
    assert [x[2] for x in a[1::2]] == [x[2] for x in b1] == [1] * 10     # micro-batch ids agree: the same seeds
    seen = sorted(i for x in a for i in x[3])
    assert seen == list(range(40))                                      # one epoch: every image once
    resumed = data.StepSampler(40, 2, 2, 1, 0, seed=3, epoch=1, start_step=4)
    assert list(resumed) == a[8:]


def test_export_loads_strictly_in_timm_and_matches_on_all_tokens(tmp_path):
    timm = pytest.importorskip("timm")
    from greenmim import export
    torch.manual_seed(0)
    model = greenmim.create_model("green_mim_swin_base_patch4_dec512b1")
    ck = tmp_path / "ck.pth"
    torch.save({"model": model.state_dict(), "config": model.config}, ck)
    out = tmp_path / "swin_b.pth"
    assert export.main([str(ck), str(out)]) == 0
    ref = timm.create_model("swin_base_patch4_window7_224", pretrained=True,
                            pretrained_cfg_overlay=dict(file=str(out))).eval()
    x = torch.randn(1, 3, 224, 224)
    enc = model.encoder.eval()
    with torch.no_grad():
        got = enc.forward_features(x, enc.plan(torch.ones(7, 7, dtype=torch.bool)))
        want = ref.forward_features(x).reshape(1, 49, -1)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_export_of_a_trained_nano_and_a_released_checkpoint(tmp_path):
    timm = pytest.importorskip("timm")
    from greenmim import export
    o = tmp_path / "o"
    assert cli.main(_quick(o, "--max_steps", "2")) == 0
    out = tmp_path / "nano.pth"
    name, kw = export.export(str(o / "checkpoint-0-step2.pth"), str(out))
    ref = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=str(out)), **kw).double().eval()
    model = greenmim.create_model(NANO).double().eval()
    greenmim.checkpoint.load_pretrained(model, str(o / "checkpoint-0-step2.pth"))
    x = torch.randn(2, 3, 224, 224, dtype=torch.float64)
    with torch.no_grad():
        got = model.encoder.forward_features(x, model.plan(torch.ones(2, 7, 7, dtype=torch.bool)))
        torch.testing.assert_close(got.reshape(2, 49, -1), ref.forward_features(x).reshape(2, 49, -1), rtol=1e-9,
                                   atol=1e-9)
    with pytest.raises(greenmim.GreenmimError, match="layout"):
        released = {("encoder.layers.0.downsample." + k.split("downsample.")[1] if ".layers.1.downsample." in k else k): v
                    for k, v in model.state_dict().items()}
        export.export({"model": released}, str(tmp_path / "x.pth"))


@pytest.mark.parametrize("model,per_sample", [(NANO, False), (NANO, True),
                                               ("green_mim_twins_nano_patch4_dec128b1", True)])
def test_compile_does_not_recompile_for_fresh_masks(tmp_path, model, per_sample):
    """12 steps, a fresh mask each (every step's plan has another length): G is fixed at each
    stage's window area and the group axis and the plan's buffer are marked dynamic, so one graph
    serves every mask. Twins: its conv tables' check stays out of the graph (it guarded on a weak
    cache and recompiled every step)."""
    from torch._dynamo.utils import counters
    extra = ["--per_sample_masks"] if per_sample else []
    argv = ["--model", model, "--batch_size", "2", "--epochs", "1", "--warmup_epochs", "0", "--lr", "1e-3",
            "--max_steps", "12", "--output_dir", str(tmp_path / "c"), "--num_workers", "0", "--device", "cpu", *extra]
    torch._dynamo.reset()
    counters.clear()
    assert cli.main(argv + ["--compile", "--compile_backend", "aot_eager"]) == 0
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["recompiles"])
    assert cli.main(argv + ["--max_steps", "3", "--output_dir", str(tmp_path / "e")]) == 0   # eager
    compiled, eager = _losses(tmp_path / "c" / "log.jsonl")[:3], _losses(tmp_path / "e" / "log.jsonl")
    torch.testing.assert_close(torch.tensor([r["loss"] for r in compiled]), torch.tensor([r["loss"] for r in eager]),
                               rtol=1e-4, atol=1e-5)


def test_it_learns_on_the_sample_photographs(tmp_path):
    """A nano Swin (embed 32) for 200 steps of 16 images. Predicting each unit's mean scores 1.0
    under norm_pix_loss. Measured (docs/pretraining-speed.md: seeds 0-3, 200-300 steps): the last 50
    steps average 0.763-0.769; the two held-out photographs, 8 masks each, 0.55-0.74."""
    out = tmp_path / "learn"
    argv = ["--model", NANO, "--batch_size", "16", "--epochs", "4", "--warmup_epochs", "1", "--lr", "1e-3",
            "--max_steps", "200", "--output_dir", str(out), "--num_workers", "1", "--vis_freq", "100",
            "--device", "cpu"]
    args = pargs.parser().parse_args(argv)
    pargs.validate(args)
    summary = engine.run(args, dist.setup("cpu", False))
    losses = summary["losses"]
    assert len(losses) == 200
    first, last = sum(losses[:10]) / 10, sum(losses[-50:]) / 50
    assert first > 0.9 and last < 0.85, (first, last)
    assert summary["held_out_loss"] < 0.85, summary["held_out_loss"]
    assert (out / "vis" / "epoch_0003.png").exists()


def test_export_of_a_2022_checkpoint_merges_in_swin_order_in_timm(tmp_path):
    """Weights of a 2022 checkpoint (row-first merge) exported with --layout 2022: timm's own
    PatchMerging (Swin's order) with them equals the row-first merge with the original weights."""
    timm = pytest.importorskip("timm")
    from greenmim import export
    from conftest import released_tree, row_first_merge
    torch.manual_seed(0)
    src = {k: torch.randn_like(v) for k, v in greenmim.create_model(NANO).state_dict().items()}
    released = released_tree(src)
    ck = tmp_path / "released.pth"
    torch.save({"model": released, "epoch": 799}, ck)
    out = tmp_path / "timm.pth"
    assert export.main([str(ck), str(out)]) == 2                   # no layout: refused
    name, kw = export.export(str(ck), str(out), layout="2022")
    ref = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=str(out)), **kw).double()
    for stage in (1, 2, 3):
        old = {k.split("downsample.")[1]: v.double() for k, v in released.items()
               if k.startswith(f"encoder.layers.{stage - 1}.downsample.")}
        C = old["reduction.weight"].shape[1] // 4
        H = 56 >> (stage - 1)
        x = torch.randn(2, H, H, C, dtype=torch.float64)
        with torch.no_grad():
            got = ref.layers[stage].downsample(x)
        torch.testing.assert_close(got, row_first_merge(x, old), rtol=1e-10, atol=1e-10)


def test_schedule_and_weight_decay_groups_follow_the_released_recipe():
    from greenmim.pretrain import optim
    lr, mn = 1e-3, 1e-5
    assert optim.lr_at(0.0, lr, mn, 40, 400) == 0.0
    assert optim.lr_at(20.0, lr, mn, 40, 400) == pytest.approx(lr / 2)           # linear warm-up
    assert optim.lr_at(40.0, lr, mn, 40, 400) == pytest.approx(lr)
    assert optim.lr_at(220.0, lr, mn, 40, 400) == pytest.approx(mn + (lr - mn) / 2)  # half-way down the cosine
    assert optim.lr_at(400.0, lr, mn, 40, 400) == pytest.approx(mn)
    model = greenmim.create_model(NANO)
    decay, no_decay = optim.param_groups(model, 0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    exempt = {names[id(p)] for p in no_decay["params"]}
    decayed = {names[id(p)] for p in decay["params"]}
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    assert "mask_token" in exempt and "encoder.layers.0.blocks.0.attn.relative_position_bias_table" in exempt
    assert "encoder.layers.0.blocks.0.norm1.weight" in exempt and "decoder_pred.bias" in exempt
    assert "encoder.layers.0.blocks.0.attn.qkv.weight" in decayed and "decoder_embed.weight" in decayed
    assert exempt | decayed == set(names.values()) and not exempt & decayed
    assert all(p.ndim >= 2 for p in decay["params"])


def test_fused_adamw_takes_the_same_steps_as_foreach():
    """The trainer asks for the fused AdamW on CUDA: same recipe (groups, betas, decay), same
    update up to rounding. Run here on the CPU, where torch also has a fused kernel."""
    from greenmim.pretrain import optim
    torch.manual_seed(0)
    a = greenmim.create_model(NANO)
    b = greenmim.create_model(NANO)
    b.load_state_dict(a.state_dict())
    oa, ob = optim.adamw(a, 1e-2, 0.05), optim.adamw(b, 1e-2, 0.05, fused=True)
    assert ob.defaults["fused"] and not oa.defaults.get("fused")
    assert [g["weight_decay"] for g in oa.param_groups] == [g["weight_decay"] for g in ob.param_groups]
    start = [p.detach().clone() for p in a.parameters()]
    for _ in range(3):
        grads = [torch.randn_like(p) for p in a.parameters()]
        for m in (a, b):
            for p, g in zip(m.parameters(), grads):
                p.grad = g.clone()
        oa.step()
        ob.step()
    moved = max(float((p - q).abs().max()) for p, q in zip(a.parameters(), start))
    assert moved > 1e-3  # the steps did something
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-6), n


@pytest.mark.parametrize("saved", ["none", "two", "no_output_dir"])
def test_ctrl_c_names_the_checkpoint_that_resumes(tmp_path, monkeypatch, capfd, saved):
    """A second Ctrl-C (KeyboardInterrupt; the first finishes the step and saves it,
    test_long_runs.py): the line names the checkpoint --resume auto would take (the one with the
    most steps, not the newest file), says when there is none, and never names one that does not
    exist."""
    from greenmim.pretrain import cli, engine

    def interrupted(args, ctx, resume=None):
        if saved == "two":   # written out of order: the later file has fewer steps
            torch.save({"step": 9, "model": {}}, tmp_path / "checkpoint-1.pth")
            torch.save({"step": 4, "model": {}}, tmp_path / "checkpoint-0-step4.pth")
        raise KeyboardInterrupt
    monkeypatch.setattr(engine, "run", interrupted)
    argv = _quick(tmp_path)
    if saved == "no_output_dir":   # --output_dir '' saves nothing
        argv[argv.index("--output_dir") + 1] = ""
    assert cli.main(argv) == 130
    line = [l for l in capfd.readouterr().err.splitlines() if l.strip()][-1]
    assert line.startswith("greenmim.pretrain: interrupted; "), line
    if saved == "two":
        assert str(tmp_path / "checkpoint-1.pth") in line and "checkpoint-0-step4" not in line, line
        assert "--resume auto" in line, line
    elif saved == "none":
        assert "no checkpoint in" in line and "nothing to resume" in line and ".pth" not in line, line
    else:
        assert "nothing was saved" in line and ".pth" not in line, line
