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
    for row in ("simmim", "greenmim", "per-sample", "released"):
        assert f"| {row} |" in text
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
                          "twins_svt_large", "--trace", str(tmp_path)], capture_output=True, text=True, env=env,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "train step (whole models): toy-twins, batch 2, 224 px" in out.stdout
    for row in ("simmim", "greenmim", "per-sample", "released"):
        assert f"| {row} |" in out.stdout
        assert (tmp_path / f"trace_toy-twins_{row}.json").stat().st_size > 0
    assert out.stdout.count("under torch.profiler") == 4


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
