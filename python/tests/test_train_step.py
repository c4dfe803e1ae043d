"""bench/gpu/train_step.py runs end to end on the CPU at a toy size (the GPU run is the real one)."""
import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_train_step_toy_runs_all_rows():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "python") + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, str(ROOT / "bench/gpu/train_step.py"), "--toy", "--reps", "1"],
                         capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    for row in ("simmim", "greenmim", "per-sample", "released", "mae", "hiera"):
        assert f"| {row} |" in text
    assert "| images/s | peak GiB | GFLOP/step | MFU |" in text and "MFU blank: no dense bf16 peak known for CPU" in text
    assert "per-sample / shared step time" in text and "released / greenmim step time" in text
    lines = [l for l in text.splitlines() if l.startswith("| ") and l[2].isdigit()]
    assert len(lines) == 8                       # 4 stages x 2 shifts of the breakdown
    assert text.rstrip().endswith("train_step: done")


def test_train_step_toy_swin_v2_rows():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, str(ROOT / "bench/gpu/train_step.py"), "--toy", "--model",
                          "swinv2_base_window8_256", "--no-breakdown"], capture_output=True, text=True, env=env,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "toy-v2, batch 2, 256 px" in out.stdout
    for row in ("simmim", "greenmim", "per-sample", "released"):
        assert f"| {row} |" in out.stdout


def test_train_step_rejects_unknown_rows():
    out = subprocess.run([sys.executable, str(ROOT / "bench/gpu/train_step.py"), "--toy", "--rows", "bogus"],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "python")})
    assert out.returncode == 2 and "unknown rows" in out.stderr


def test_train_step_full_models_rows():
    """--full: whole models (SimMIM's linear decoder and L1; GreenMIM's decoder and loss), with the
    trainer's plan pipeline (--plans loader: planned before the timed steps, copied in the step)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, str(ROOT / "bench/gpu/train_step.py"), "--toy", "--full", "--no-breakdown",
                          "--plans", "loader"], capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "train step (whole models): toy" in out.stdout and "plans loader" in out.stdout
    for row in ("simmim", "greenmim", "per-sample", "released"):
        assert f"| {row} |" in out.stdout


def test_train_step_toy_twins_rows(tmp_path):
    """--model twins_svt_large --toy: the Twins rows (timm's Twins with a mask token; ours), with
    --trace: a Chrome trace per row and the profiler's tables."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, str(ROOT / "bench/gpu/train_step.py"), "--toy", "--full", "--model",
                          "twins_svt_large", "--trace", str(tmp_path), "--json"], capture_output=True, text=True,
                         env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "train step (whole models): toy-twins, batch 2, 224 px" in out.stdout
    rows = ("simmim", "greenmim", "per-sample", "released", "mae", "hiera")
    for row in rows:
        assert f"| {row} |" in out.stdout
        assert (tmp_path / f"trace_toy-twins_{row}.json").stat().st_size > 0
    assert out.stdout.count("under torch.profiler") == 6
    # the time-by-category table of each row: greenmim's ops hold host time in greenmim's models only
    # (Twins' PEG is greenmim's depthwise conv op on the CPU too, in the released path's model as
    # well), and the peers' rows have none; GEMMs and the optimizer everywhere
    import json
    res = {r["row"]: r for r in json.loads(out.stdout.strip().splitlines()[-1])["rows"]}
    assert set(res) == set(rows)
    for row, r in res.items():
        host = r["trace"]["host"]
        assert (host["greenmim ops"] > 0) == (row in ("greenmim", "per-sample", "released")), (row, host)
        assert host["GEMM"] > 0 and host["optimizer"] > 0 and r["trace"]["gpu"] == {}
        assert r["gflop"] > 0 and r["mfu"] is None and r["images_per_s"] > 0


def test_simmim_twins_without_masking_is_timms_twins():
    import importlib.util
    import torch
    import timm
    spec = importlib.util.spec_from_file_location("train_step", ROOT / "bench/gpu/train_step.py")
    ts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ts)
    cfg = ts.TWINS["toy-twins"][0]
    m = timm.models.twins.Twins(num_classes=0, wss=(7, 7, 7, 7), **cfg).eval()
    enc = ts.SimMIMTwins(m, cfg["embed_dims"][0])
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        none = torch.zeros(2, 56, 56, dtype=torch.bool)
        torch.testing.assert_close(enc(x, none).reshape(2, 49, -1), m.forward_features(x))
        some = torch.rand(2, 56, 56) < 0.5
        assert not torch.allclose(enc(x, some), enc(x, none))


def test_twins_ops_bench_smoke_on_cpu():
    """bench/gpu/twins_ops.py (run.sh's Twins step) runs end to end; on the CPU its times mean nothing."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, str(ROOT / "bench/gpu/twins_ops.py"), "--device", "cpu", "--batch", "1",
                          "--reps", "1", "--warmup", "0", "--keep", "0.25"], capture_output=True, text=True, env=env,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [l for l in out.stdout.splitlines() if l.startswith("| ") and l[2].isalpha() and "| op |" not in l]
    # 3 stages x (PEG: copy, masked dense; 2 block convs x (3 peers: cuBLAS, autocast F.linear,
    # dense cuDNN; the gather path and the fused kernels against cuBLAS; the channels_last weight
    # against autocast F.linear))
    assert len(rows) == 3 * 14
    assert sum("(channels_last weight)" in l for l in rows) == 3 * 2
    assert sum("autocast F.linear" in l for l in rows) == 3 * 4
    assert sum("(fused kernels)" in l for l in rows) == 3 * 2
    assert sum("(gather + cuBLAS)" in l for l in rows) == 3 * 2
    assert out.stdout.rstrip().endswith("twins_ops: done")


def test_activation_memory_counts_what_each_row_keeps():
    """bench/activation_memory.py on the toy: the visible-token model keeps a fraction of what SimMIM's
    all-token model keeps per sample (a quarter of the tokens; the memory target's proxy)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, str(ROOT / "bench/activation_memory.py"), "--model", "toy"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {l.split("|")[1].strip(): [c.strip() for c in l.split("|")[2:-1]]
            for l in out.stdout.splitlines() if l.startswith("| ") and not l.startswith("| row")}
    assert set(rows) == {"simmim", "greenmim", "per-sample"}
    per = {r: float(v[2]) for r, v in rows.items()}        # saved per sample, MiB
    assert 0 < per["greenmim"] < 0.3 * per["simmim"]
    assert abs(per["per-sample"] - per["greenmim"]) <= 0.1 * per["greenmim"]


def test_loader_bench_times_the_pipeline_and_refuses_bad_arguments(capsys):
    """bench/loader.py on the nano model and the sample photographs, one worker: the split of a
    worker's time and the loader's rate are printed; a zero batch is refused."""
    spec = importlib.util.spec_from_file_location("loader_bench", ROOT / "bench/loader.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--model", "green_mim_swin_nano_patch4_dec128b1", "--batch", "4", "--workers", "1",
                     "--batches", "2", "--split_reps", "1", "--per_sample_masks", "--cuda_graphs"]) == 0
    out = capsys.readouterr().out
    assert "plans padded" in out and "img/s per worker" in out
    assert "loader, 1 workers: 2 micro-batches" in out
    with pytest.raises(SystemExit):
        mod.main(["--batch", "0"])


def _bench_module(name, path):
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_flop_count_knows_greenmims_ops():
    """The MFU's FLOPs: a GreenMIM step's count with greenmim's attention as the custom ops (the
    CUDA path, here on the emulator with its kernels stubbed out: counting needs shapes only)
    equals the count of the CPU path, where the same attention runs in torch's batched matmuls."""
    import argparse
    import greenmim
    import torch
    ts = _bench_module("train_step", "bench/gpu/train_step.py")
    oo = _bench_module("op_overhead", "bench/op_overhead.py")
    args = argparse.Namespace(twins=False, v2=False, img=224, window=7, full=True)
    torch.manual_seed(0)
    model = ts.make_row("greenmim", ts.MODELS["toy"][0], args, torch.device("cpu"))
    plan = model.plan(ts.unit_masks(2, False, 0.75, torch.Generator().manual_seed(0), 7), cache=False)
    img = torch.randn(2, 3, 224, 224)
    amp = torch.autocast("cpu", enabled=False)
    cpu = ts.step_flops(lambda: model(img, plan)[0], amp, model)
    with oo.null_kernels(), greenmim.emulate_cuda():
        from torch.utils.flop_counter import FlopCounterMode
        with FlopCounterMode(display=False) as fc:
            model(img, plan)[0].backward()
        ops = {str(k) for k in fc.get_flop_counts()["Global"]}
        emulated = ts.step_flops(lambda: model(img, plan)[0], amp, model)
    assert {"greenmim.attention_packed_fwd", "greenmim.attention_packed_bwd"} <= ops
    assert emulated == cpu > 0
    assert ts.peak_tflops("NVIDIA H100 80GB HBM3") == 989.0 and ts.peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert ts.peak_tflops("NVIDIA H200") == 989.0 and ts.peak_tflops("CPU") is None


def test_peer_models_select_the_reference_tokens():
    """baselines.py's MAE and Hiera MAE gather and scatter by index where the reference code uses
    boolean indexing (no host synchronisation, so a CUDA graph captures them): Hiera's visible
    tokens equal timm's own masked forward; the masked losses equal the boolean-indexed ones; the
    prediction tokens' mask equals Hiera's undo_windowing of the unit mask."""
    import torch
    bl = _bench_module("baselines", "bench/gpu/baselines.py")
    from timm.models.hiera import undo_windowing
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    hm = bl.HieraMAE(embed_dim=16, num_heads=1, stages=(1, 1, 1, 1), dec_dim=32, dec_depth=1, dec_heads=2).eval()
    img = torch.randn(3, 3, 224, 224)
    mask = hm.draw(3, gen)
    assert mask.sum(1).tolist() == [hm.keep] * 3 and hm.keep == int(49 * 0.4)
    with torch.no_grad():
        ours, stages, kept = hm.encode(img, mask)
        ref, ref_stages = hm.hiera.forward_features(img, mask=mask, return_intermediates=True)
    torch.testing.assert_close(ours, ref)
    for a, b in zip(stages, ref_stages):
        torch.testing.assert_close(a, b)
    B, (U, D) = 3, (hm.units, 5)
    x = torch.randn(B, hm.keep, *hm.mu_final, D)
    full = torch.zeros(B, U, *hm.mu_final, D)
    full[mask.view(B, U, 1, 1, 1).expand(-1, -1, *x.shape[2:])] = x.flatten()   # Hiera's x_dec[mask] = x
    ours = torch.zeros(B, U, *hm.mu_final, D).scatter_(1, kept.view(B, -1, 1, 1, 1).expand_as(x), x)
    assert torch.equal(ours, full)
    m5 = mask.view(B, U, 1, 1, 1).expand(-1, -1, *hm.mu_final, 1)
    ref_tok = undo_windowing(m5, hm.tokens_final, hm.mu_final).reshape(B, -1)
    ours_tok = mask.view(B, 7, 7, 1, 1).expand(-1, -1, -1, *hm.mu_final).permute(0, 1, 3, 2, 4).reshape(B, -1)
    assert torch.equal(ours_tok, ref_tok)
    pred, target, masked = torch.randn(B, 196, 12), torch.randn(B, 196, 12), torch.rand(B, 196) < 0.6
    ref_loss = ((pred - target) ** 2).mean(-1)[masked].mean()
    torch.testing.assert_close(bl.masked_mse(pred, target, masked), ref_loss)
    mae = bl.MAE(dim=32, depth=1, heads=2, dec_dim=32, dec_depth=1, dec_heads=2)
    ids = mae.draw(2, gen)
    assert mae.keep == 49 and torch.equal(ids.sort(1)[0], torch.arange(196).expand(2, -1))
    loss = mae(img[:2], ids)
    loss.backward()
    assert loss.ndim == 0 and mae.cls_token.grad is not None and mae.mask_token.grad is not None


def test_lent_device_script_refuses_a_machine_without_a_gpu(tmp_path):
    """bench/gpu/lent_device.sh (the first command on a lent device) says in one line that it
    needs one, and exits 2, where nvidia-smi is absent; --dry-run is its CPU mode (about 3 minutes
    on 2 cores: run by hand, not here)."""
    import shutil
    if shutil.which("nvidia-smi"):
        pytest.skip("nvidia-smi present: this is a GPU machine")
    out = subprocess.run(["bash", str(ROOT / "bench/gpu/lent_device.sh"), str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=60, cwd=str(ROOT))
    assert out.returncode == 2 and "no nvidia-smi: not a GPU machine (use --dry-run here)" in out.stdout


def test_op_overhead_times_each_op_both_passes(capsys):
    """bench/op_overhead.py: every public op, forward and forward + backward, on both paths, with
    its scale rows and a JSON last line; unknown ops are refused."""
    import json
    oo = _bench_module("op_overhead", "bench/op_overhead.py")
    assert oo.main(["--reps", "3", "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    ops = {"attention_packed", "attention", "partition", "unpartition", "depthwise_conv3x3", "block_conv", "swin_block"}
    assert {(r["op"], r["pass"]) for r in res["rows"]} == {(o, p) for o in ops for p in ("forward", "forward + backward")}
    assert all(r["fast_us"] > 0 and r["dispatcher_us"] > 0 for r in res["rows"])
    assert res["torch_add_us"] > 0 and res["function_floor_us"] > 0
    with pytest.raises(SystemExit):
        oo.main(["--ops", "bogus"])


def test_step_profile_sorts_host_and_gpu_events_into_categories():
    """bench/gpu/step_profile.py on synthetic profiler events (the GPU side cannot run here): host
    self times and kernel times land in their categories, the fast path's autograd Functions and
    their backward nodes count as greenmim's ops, and GPU idle time is the wall minus the union of
    the kernels' intervals (overlaps counted once)."""
    from types import SimpleNamespace as NS
    sp = _bench_module("step_profile", "bench/gpu/step_profile.py")

    def ev(name, dev, start=0, end=0, self_us=0.0):
        tr = NS(start=start, end=end, elapsed_us=lambda: end - start)
        return NS(name=name, device_type=f"DeviceType.{dev}", time_range=tr, self_cpu_time_total=self_us)
    events = [ev("aten::mm", "CPU", self_us=100.0), ev("_attention_packed_fwd", "CPU", self_us=50.0),
              ev("autograd::engine::evaluate_function: _partitionBackward", "CPU", self_us=20.0),
              ev("cudaLaunchKernel", "CPU", self_us=30.0), ev("aten::topk", "CPU", self_us=5.0),
              ev("aten::_to_copy", "CPU", self_us=7.0),
              ev("sm90_xmma_gemm_bf16bf16_bf16f32", "CUDA", 0, 400),
              ev("void greenmim::detail::attention_fwd_kernel<...>", "CUDA", 300, 600),
              ev("void at::native::vectorized_layer_norm_kernel<...>", "CUDA", 1000, 1100)]
    cats = sp.categories(NS(events=lambda: events), steps=2, wall_ms=2.0)
    h, g = cats["host"], cats["gpu"]
    assert h["GEMM"] == 0.05 and h["greenmim ops"] == 0.035 and h["launches"] == 0.015
    assert h["other ops"] == 0.0025 and h["casts, copies"] == 0.0035    # aten::topk is no cast
    assert abs(h["untracked host"] - (2.0 - 0.212) / 2) < 1e-12
    assert g["GEMM"] == 0.2 and g["greenmim ops"] == 0.15 and g["norm"] == 0.05
    assert abs(g["idle"] - (2.0 - 0.7) / 2) < 1e-12                    # busy: [0, 600] and [1000, 1100] us
    text = sp.table(cats, 1.0)
    assert "| greenmim ops | 0.035 | 3.5 | 0.150 | 15.0 |" in text and "| idle | - | - |" in text


def test_train_step_toy_convnextv2_rows():
    """--model convnextv2_base --toy: greenmim's sparse FCMAE step against the dense masked FCMAE
    step (convnextv2_atto, 224 px, ratio 0.6, per-sample masks). Both run a whole step; the dense
    step counts more FLOPs, at most the encoder's all-sites/visible-sites factor (49 units / 19
    visible) more, the shared decoder making it less; a Swin row is refused for ConvNeXt V2."""
    import json
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, str(ROOT / "bench/gpu/train_step.py"), "--toy", "--model", "convnextv2_base",
                          "--json"], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "toy-convnext, batch 2, 224 px, ratio 0.6" in out.stdout and "masked-dense / greenmim step time" in out.stdout
    rows = {r["row"]: r for r in json.loads(out.stdout.strip().splitlines()[-1])["rows"]}
    assert set(rows) == {"masked-dense", "greenmim"}
    for r in rows.values():
        assert r["ms"] > 0 and r["images_per_s"] > 0 and r["gflop"] > 0
    keep = int(49 * (1 - 0.6))
    assert 1 < rows["masked-dense"]["gflop"] / rows["greenmim"]["gflop"] < 49 / keep
    bad = subprocess.run([sys.executable, str(ROOT / "bench/gpu/train_step.py"), "--toy", "--model", "convnextv2_base",
                          "--rows", "simmim"], capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2 and "unknown rows" in bad.stderr


def test_conv_backward_flops_counts_groups():
    """train_step's convolution-backward formula: a depthwise conv's backward costs its forward once
    for grad_input and once for grad_weight (torch's own formula counts grad_weight as one group)."""
    sys.path.insert(0, str(ROOT / "bench" / "gpu"))
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from train_step import conv_backward_flops
    for groups, need_dx in ((1, True), (16, True), (16, False)):
        conv = torch.nn.Conv2d(16, 32, 7, padding=3, groups=groups)
        x = torch.randn(2, 16, 9, 11, requires_grad=need_dx)
        counter = FlopCounterMode(display=False, custom_mapping={torch.ops.aten.convolution_backward: conv_backward_flops})
        with counter:
            conv(x).sum().backward()
        fwd = 2 * 2 * 9 * 11 * 32 * (16 // groups) * 49
        assert counter.get_total_flops() == fwd * (3 if need_dx else 2)
