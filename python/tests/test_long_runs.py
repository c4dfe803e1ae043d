"""Long runs that survive (issue 39), through ``python -m greenmim.pretrain`` as a user runs it, on
the CPU: preemption signals sent to the process group as Slurm sends them, scheduled saves and
their retention, refusing to start over a finished run, torn and stale checkpoints, non-finite
steps, torchrun's elastic restarts, one-line usage errors, clean log.jsonl, CPU threads and the
packaging of the pretrain extra. Every checkpoint a run writes is read back and checked finite;
resumed runs are compared bitwise with uninterrupted ones."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading

import pytest
import torch

from greenmim.pretrain import args as pargs
from greenmim.pretrain import checkpoints, cli, dist, engine, graphs
from conftest import child_env

ROOT = pathlib.Path(__file__).resolve().parents[2]
NANO = "green_mim_swin_nano_patch4_dec128b1"
pytest.importorskip("skimage")
pytest.importorskip("torchvision")


_env = child_env


def _quick(out, *extra):
    return ["--model", NANO, "--batch_size", "4", "--epochs", "2", "--warmup_epochs", "1", "--lr", "1e-3",
            "--output_dir", str(out), "--num_workers", "0", "--vis_freq", "100", "--save_freq", "100",
            "--device", "cpu", "--print_freq", "1", *extra]


def _steps(out):
    return [json.loads(l) for l in open(pathlib.Path(out) / "log.jsonl") if '"step"' in l]


def _rows(out):
    return [json.loads(l) for l in open(pathlib.Path(out) / "log.jsonl")]


def _all_checkpoints_read_back_finite(out):
    """Every checkpoint of ``out`` reads whole, is a training checkpoint, and holds finite weights
    (checkpoints.read checks both); no temporary file is left. Returns {name: step}."""
    found = {}
    for p in sorted(pathlib.Path(out).glob("checkpoint-*.pth")):
        found[p.name] = int(checkpoints.read(str(p))["step"])
    assert not list(pathlib.Path(out).glob("*.tmp*")), list(pathlib.Path(out).glob("*.tmp*"))
    return found


def _watchdog(proc, seconds=240):
    """Kills ``proc``'s process group after ``seconds``: reading its output line by line has no
    timeout of its own, and a hung run must fail the test, not hang CI."""
    t = threading.Timer(seconds, lambda: proc.poll() is None and os.killpg(proc.pid, signal.SIGKILL))
    t.daemon = True
    t.start()
    return t


def _one_line(capfd, code, rc, expect):
    err = capfd.readouterr().err
    lines = [l for l in err.splitlines() if l.strip()]
    assert rc == code, err[-2000:]
    assert len(lines) == 1, err
    for e in expect:
        assert e in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 8-step run (in this interpreter): the losses the interrupted ones must equal."""
    out = tmp_path_factory.mktemp("reference")
    assert cli.main(_quick(out, "--max_steps", "8", "--per_sample_masks")) == 0
    return [r["loss"] for r in _steps(out)]


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGUSR1", "SIGINT"])
def test_a_signal_to_the_process_group_saves_the_step_and_resume_is_bitwise(tmp_path, sig, reference):
    """Sent to the whole process group (the main process and its loader worker), as Slurm does: the
    run finishes its step, saves it, prints one line naming the checkpoint and --resume auto, and
    exits with 128 + the signal's number. --resume auto then ends where the uninterrupted run ends,
    with the same losses, bit for bit, each step once in log.jsonl."""
    signum = getattr(signal, sig)
    out = tmp_path / "o"
    proc = subprocess.Popen([sys.executable, "-m", "greenmim.pretrain",
                             *_quick(out, "--max_steps", "60", "--num_workers", "1", "--per_sample_masks")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                            start_new_session=True)
    dog = _watchdog(proc)
    try:
        for line in proc.stdout:                      # training under way, the worker running
            if "step 3/" in line:
                break
        os.killpg(proc.pid, signum)
        stdout, err = proc.communicate(timeout=120)
    finally:
        dog.cancel()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signum, err[-3000:]
    assert "Traceback" not in err and "DataLoader worker" not in err, err[-3000:]
    lines = [l for l in err.splitlines() if l.strip()]
    saved = _all_checkpoints_read_back_finite(out)
    assert len(saved) == 1, saved
    (name, step), = saved.items()
    assert lines[-1] == (f"greenmim.pretrain: {sig}: stopped after step {step}; saved {out / name}; the same "
                         f"command with --resume auto continues from it"), lines[-1]
    assert step >= 3 and name == f"checkpoint-0-step{step}.pth"
    if sig != "SIGTERM":
        return
    assert cli.main(_quick(out, "--max_steps", "8", "--per_sample_masks", "--resume", "auto")) == 0
    rows = _steps(out)
    assert [r["step"] for r in rows] == list(range(1, 9))             # each step once
    assert [r["loss"] for r in rows] == reference                     # bitwise
    assert not [r for r in _rows(out) if "epoch_end" in r]            # no partial epoch reported
    assert _all_checkpoints_read_back_finite(out)[f"checkpoint-0-step8.pth"] == 8


def test_a_signal_that_breaks_the_step_in_progress_is_one_line_and_resume_continues(tmp_path, capfd, monkeypatch):
    """Slurm signals the whole process group, so the signal can also reach a helper of the step in
    progress (inductor's compiler under --compile) and make that step raise. The run then stops with
    the preemption's line and exit code, not a traceback, and resumes from its last checkpoint."""
    from greenmim.pretrain import data
    out = tmp_path / "o"
    calls = [0]
    normalize = data.normalize

    def breaks_in_step_3(x):
        calls[0] += 1
        if calls[0] == 3:
            os.kill(os.getpid(), signal.SIGTERM)
            raise RuntimeError("the compiler was killed\nsecond line")
        return normalize(x)
    monkeypatch.setattr(data, "normalize", breaks_in_step_3)
    assert cli.main(_quick(out, "--max_steps", "5", "--save_every_steps", "1")) == 128 + signal.SIGTERM
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("greenmim.pretrain: SIGTERM: stopped in step 3, which the signal broke (RuntimeError: the "
                             "compiler was killed)") and "checkpoint-0-step2.pth is the newest" in err[0], err
    assert _all_checkpoints_read_back_finite(out) == {"checkpoint-0-step1.pth": 1, "checkpoint-0-step2.pth": 2}

    def bug(x):                                          # without a signal an exception is not hidden
        raise RuntimeError("an ordinary bug")
    monkeypatch.setattr(data, "normalize", bug)
    with pytest.raises(RuntimeError, match="an ordinary bug"):
        cli.main(_quick(tmp_path / "b", "--max_steps", "2"))
    monkeypatch.setattr(data, "normalize", normalize)
    assert cli.main(_quick(out, "--max_steps", "5", "--resume", "auto")) == 0
    assert [r["step"] for r in _rows(out) if "loss" in r and "step" in r][-3:] == [3, 4, 5]


def test_inductor_cache_remnants_are_removed_before_compiling(tmp_path, monkeypatch):
    """A kernel library cut short by a kill (pytorch/pytorch#102539) would fail every later
    --compile run; the trainer removes any .so shorter than an ELF header and older than 30 s,
    and nothing else."""
    from greenmim.pretrain import inductor_cache
    root = tmp_path / "cache"
    (root / "yb").mkdir(parents=True)
    (root / "yb" / "cut.main.so").write_bytes(b"")
    (root / "yb" / "half.so").write_bytes(b"\x7fELF" + b"\0" * 20)
    (root / "yb" / "good.so").write_bytes(b"\x7fELF" + b"\0" * 200)
    (root / "yb" / "empty.cpp").write_bytes(b"")
    old = os.path.getmtime(root / "yb" / "cut.main.so") - 120
    for f in os.listdir(root / "yb"):
        os.utime(root / "yb" / f, (old, old))
    (root / "yb" / "linking.so").write_bytes(b"")          # fresh: a compile in flight may be writing it
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(root))
    assert inductor_cache.cache_dir() == str(root)
    assert sorted(os.path.basename(p) for p in inductor_cache.mend()) == ["cut.main.so", "half.so"]
    assert sorted(os.listdir(root / "yb")) == ["empty.cpp", "good.so", "linking.so"]
    assert inductor_cache.mend() == [] and inductor_cache.mend(str(tmp_path / "none")) == []


def test_scheduled_saves_keep_the_newest_and_every_milestone(tmp_path):
    """--save_every_steps and --save_every_minutes besides --save_freq; --keep_last 2 prunes the
    older step checkpoints, never a milestone (checkpoint-<epoch>.pth)."""
    from PIL import Image
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(8):
        Image.new("RGB", (64, 64), (i * 30, 100, 200 - i * 20)).save(folder / f"{i}.png")
    out = tmp_path / "o"
    # 8 images / batch 4: 2 steps per epoch; milestones after epochs 2 and 4 (steps 4 and 8)
    argv = _quick(out, "--data_path", str(folder), "--epochs", "4", "--save_freq", "2", "--save_every_steps", "1",
                  "--keep_last", "2")
    assert cli.main(argv) == 0
    saved = _all_checkpoints_read_back_finite(out)
    assert saved == {"checkpoint-1.pth": 4, "checkpoint-3.pth": 8, "checkpoint-3-step7.pth": 7,
                     "checkpoint-2-step6.pth": 6}, saved
    ends = [r["epoch_end"] for r in _rows(out) if "epoch_end" in r]
    assert ends == [0, 1, 2, 3]
    # every read-back is a timed save when the interval is tiny
    out2 = tmp_path / "t"
    assert cli.main(_quick(out2, "--max_steps", "3", "--save_every_minutes", "1e-9", "--keep_last", "0")) == 0
    assert _all_checkpoints_read_back_finite(out2) == {f"checkpoint-0-step{s}.pth": s for s in (1, 2, 3)}


def test_refusals_and_usage_errors_are_one_line_exit_2_before_the_model_is_built(tmp_path, capfd, monkeypatch):
    monkeypatch.setattr(engine, "build_model", lambda a: pytest.fail("the model was built before the refusal"))
    o = tmp_path / "o"
    _one_line(capfd, 2, cli.main(_quick(o, "--bath_size", "8")), ["--bath_size", "did you mean --batch_size?"])
    _one_line(capfd, 2, cli.main(_quick(o, "--max_stpes", "8")), ["did you mean --max_steps"])
    (tmp_path / "file").write_text("x")
    _one_line(capfd, 2, cli.main(_quick(tmp_path / "file" / "out")), ["cannot be created", "is a file"])
    _one_line(capfd, 2, cli.main(_quick(o, "--data_path", str(tmp_path / "file"))), ["is a file"])
    torch.save({"weights": torch.zeros(3)}, tmp_path / "foreign.pth")
    _one_line(capfd, 2, cli.main(_quick(o, "--resume", str(tmp_path / "foreign.pth"))),
              ["foreign.pth", "not a greenmim.pretrain training checkpoint"])
    _one_line(capfd, 2, cli.main(_quick(o, "--warmup_epochs", "5")), ["--warmup_epochs must be in [0, --epochs=2]"])
    assert not o.exists()                                             # nothing created by a refusal


def test_a_finished_run_is_never_overwritten_and_nothing_left_to_do_says_so(tmp_path, capfd):
    out = tmp_path / "o"
    assert cli.main(_quick(out, "--max_steps", "2")) == 0
    before = _all_checkpoints_read_back_finite(out)
    capfd.readouterr()
    _one_line(capfd, 2, cli.main(_quick(out, "--max_steps", "3")),
              ["holds 1 checkpoint(s)", "--resume auto", "--overwrite"])
    _one_line(capfd, 2, cli.main(_quick(out, "--max_steps", "2", "--resume", "auto")),
              ["nothing to do: the checkpoint", "is at step 2", "--max_steps 2"])
    assert _all_checkpoints_read_back_finite(out) == before
    # a truncated checkpoint named explicitly: one line, and no output folder created
    torn = tmp_path / "torn.pth"
    torn.write_bytes((out / "checkpoint-0-step2.pth").read_bytes()[:5000])
    _one_line(capfd, 2, cli.main(_quick(tmp_path / "new", "--resume", str(torn))), ["torn.pth", "unreadable"])
    assert not (tmp_path / "new").exists()
    # --overwrite starts afresh, says so, and the log holds the new run only
    assert cli.main(_quick(out, "--max_steps", "1", "--overwrite")) == 0
    assert "--overwrite: deleted 1 checkpoint(s) and log.jsonl" in capfd.readouterr().err
    assert [r["step"] for r in _steps(out)] == [1]
    assert _all_checkpoints_read_back_finite(out) == {"checkpoint-0-step1.pth": 1}


def test_epochs_1_alone_runs_the_default_warmup_adapts_with_a_note(tmp_path, capfd):
    assert cli.main(["--model", NANO, "--batch_size", "4", "--epochs", "1", "--max_steps", "1", "--num_workers", "0",
                     "--output_dir", str(tmp_path / "o"), "--device", "cpu"]) == 0
    out = capfd.readouterr().out
    assert "note: the default warm-up (40 epochs) is longer than --epochs 1: warming up over 0.1 epochs" in out


def test_every_flag_in_help_shows_its_default():
    p = pargs.parser()
    fmt = p._get_formatter()
    for action in p._actions:
        if action.dest != "help":
            assert "default" in (fmt._get_help_string(action) or ""), action.option_strings


def test_torn_newest_and_stale_temporary_checkpoints(tmp_path, capfd):
    """--resume auto skips a truncated newest checkpoint with one warning naming it and why, and
    resumes from the one before, bitwise; a save cut short (checkpoint-*.tmp-PID of a dead
    process) is removed at the start, with a line."""
    out = tmp_path / "o"
    assert cli.main(_quick(out, "--max_steps", "4", "--save_every_steps", "2", "--keep_last", "0")) == 0
    first = [r["loss"] for r in _steps(out)]
    newest = out / "checkpoint-0-step4.pth"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])     # torn
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = out / f"checkpoint-0-step6.pth.tmp-{int(dead.stdout)}"
    stale.write_bytes(b"\0" * 1000)
    capfd.readouterr()
    assert cli.main(_quick(out, "--max_steps", "5", "--resume", "auto", "--keep_last", "0")) == 0
    cap = capfd.readouterr()
    text = cap.out + cap.err
    assert f"removed {stale}, a checkpoint whose save was cut short" in text
    warnings = [l for l in text.splitlines() if "skipping" in l]
    assert len(warnings) == 1 and str(newest) in warnings[0] and "unreadable" in warnings[0], warnings
    assert "resumed from" in text and "checkpoint-0-step2.pth at step 2" in text
    rows = _steps(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["loss"] for r in rows][:4] == first                     # steps 3-4 redone bitwise
    assert not stale.exists()
    newest.unlink()                                                   # the torn one stays for the user to see
    assert _all_checkpoints_read_back_finite(out) == {"checkpoint-0-step2.pth": 2, "checkpoint-0-step5.pth": 5}


def test_nonfinite_steps_are_skipped_counted_and_stop_the_run_after_k(tmp_path, capfd, monkeypatch):
    out = tmp_path / "o"
    monkeypatch.setenv("GREENMIM_TEST_NONFINITE_STEPS", "2")
    assert cli.main(_quick(out, "--max_steps", "4")) == 0
    cap = capfd.readouterr()
    rows = _steps(out)
    assert [r["skipped"] for r in rows] == [False, True, False, False]
    assert [r["skipped_total"] for r in rows] == [0, 1, 1, 1] and rows[1]["loss"] is None
    assert "skipped 1 (non-finite)" in cap.out and "1 skipped (non-finite)" in cap.out
    ck = checkpoints.read(str(out / "checkpoint-0-step4.pth"))
    assert {int(s["step"]) for s in ck["optimizer"]["state"].values()} == {3}   # the skipped step left no trace
    # K consecutive: stop, one line naming the step and the last checkpoint (written at step 4 with
    # the finite weights of step 2: skipped steps change nothing); none written after
    out2 = tmp_path / "k"
    monkeypatch.setenv("GREENMIM_TEST_NONFINITE_STEPS", "3-9")
    rc = cli.main(_quick(out2, "--max_steps", "12", "--save_every_steps", "2", "--max_skipped_steps", "3",
                         "--keep_last", "0"))
    line = _one_line(capfd, 1, rc, ["stopped at step 5", "3 consecutive steps (3-5)", "non-finite",
                                    f"the last good checkpoint is {out2 / 'checkpoint-0-step4.pth'}"])
    assert _all_checkpoints_read_back_finite(out2) == {"checkpoint-0-step2.pth": 2, "checkpoint-0-step4.pth": 4}, line
    c2, c4 = (checkpoints.read(str(out2 / f"checkpoint-0-step{s}.pth"))["model"] for s in (2, 4))
    assert all(torch.equal(v, c4[k]) for k, v in c2.items())
    # a NaN reaching the weights is never saved: the run stops with one line instead
    ctx = dist.Context()
    model = torch.nn.Linear(2, 2)
    assert dist.all_finite(model, ctx)
    with torch.no_grad():
        model.weight[0, 0] = float("inf")
    assert not dist.all_finite(model, ctx)


def test_elastic_restart_after_a_worker_is_killed_resumes_and_finishes(tmp_path, torchrun_stopped_by_one_rank):
    """torchrun --max_restarts 1 on gloo: rank 1 is killed with SIGKILL after step 3 (a test hook:
    the step is then known), the workers restart, resume from the newest checkpoint (step 2)
    without --resume, and finish; the log holds each step once, and its losses equal, bitwise,
    those of the same two-rank run that was not interrupted before step 3 (the run of
    torchrun_stopped_by_one_rank, which differs only in --max_steps)."""
    out = tmp_path / "o"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--max_restarts=1",
           "-m", "greenmim.pretrain", *_quick(out, "--batch_size", "2", "--max_steps", "5", "--save_every_steps", "2",
                                               "--per_sample_masks")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                         env=_env(GREENMIM_TEST_KILL_AT="1:3", TORCHELASTIC_ERROR_FILE=""))
    text = res.stdout + res.stderr
    assert res.returncode == 0, text[-4000:]
    assert "elastic restart 1: resuming from the newest checkpoint" in text, text[-4000:]
    rows = _steps(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5], rows
    resumed = [r for r in _rows(out) if r.get("event") == "resumed"]
    assert len(resumed) == 1 and resumed[0]["at_step"] == 2 and resumed[0]["path"].endswith("checkpoint-0-step2.pth")
    saved = _all_checkpoints_read_back_finite(out)
    assert saved["checkpoint-0-step5.pth"] == 5
    reference = [r["loss"] for r in _steps(torchrun_stopped_by_one_rank[0])]
    assert len(reference) >= 3
    n = min(len(reference), 5)
    assert [r["loss"] for r in rows][:n] == reference[:n]               # step 3 redone bitwise


def _rank_pid(agent: int, rank: int):
    """The pid of torchrun worker ``rank`` (a child of the agent whose environment says RANK=rank)."""
    try:
        kids = open(f"/proc/{agent}/task/{agent}/children").read().split()
    except OSError:
        return None
    for pid in kids:
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            return int(pid)
    return None


@pytest.fixture(scope="module")
def torchrun_stopped_by_one_rank(tmp_path_factory):
    """Two ranks under torchrun; SIGTERM to rank 1 alone after step 3. Returns (output_dir, stderr)."""
    out = tmp_path_factory.mktemp("one_rank") / "o"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
           "greenmim.pretrain", *_quick(out, "--batch_size", "2", "--max_steps", "200", "--per_sample_masks")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                            start_new_session=True)
    dog = _watchdog(proc)
    try:
        for line in proc.stdout:
            if "step 3/" in line:
                break
        pid = _rank_pid(proc.pid, 1)
        assert pid is not None
        os.kill(pid, signal.SIGTERM)
        stdout, err = proc.communicate(timeout=120)
    finally:
        dog.cancel()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return out, err


def test_under_torchrun_a_signal_to_one_rank_stops_every_rank_after_the_same_step(torchrun_stopped_by_one_rank):
    """SIGTERM to rank 1 alone: the flag travels with the losses' all-reduce, so rank 0 stops after
    the same step, and the checkpoint of that step is written (by rank 0) and reads back."""
    out, err = torchrun_stopped_by_one_rank
    saved = _all_checkpoints_read_back_finite(out)
    assert len(saved) == 1, (saved, err[-3000:])
    (name, step), = saved.items()
    assert f"greenmim.pretrain: SIGTERM: stopped after step {step}; saved {out / name}" in err, err[-3000:]
    assert [r["step"] for r in _steps(out)] == list(range(1, step + 1))
    assert [r for r in _rows(out) if r.get("event") == "stopped"][0]["code"] == 143


def test_cpu_threads_are_shared_among_processes_and_workers(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    threads = torch.get_num_threads()
    try:
        assert dist.cpu_split(None, local_world=1)[:2] == (2, 14)
        assert dist.cpu_split(None, local_world=4)[:2] == (1, 3)
        assert dist.cpu_split(3, local_world=2)[:2] == (3, 5)
        assert dist.cpu_split(8, local_world=8)[:2] == (8, 1)
        w, n, why = dist.cpu_split(None, local_world=2)
        assert (w, n) == (1, 7) and torch.get_num_threads() == 7 and "16 cores / 2 processes" in why
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        torch.set_num_threads(3)
        assert dist.cpu_split(None, local_world=1)[1:] == (3, "OMP_NUM_THREADS")
    finally:
        torch.set_num_threads(threads)


def test_cuda_graphs_are_the_cuda_default_and_fall_back_with_one_line():
    a = pargs.parser().parse_args(["--model", NANO])
    pargs.validate(a)
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert graphs.choose(a, cuda) == (True, None)
    assert graphs.choose(a, cpu) == (False, None)
    a.eager = True
    assert graphs.choose(a, cuda) == (False, None)
    for flags, why in ((["--amp", "fp16"], "--amp fp16"), (["--accum_iter", "2"], "--accum_iter 2"),
                       (["--fsdp"], "--fsdp"), (["--decoder_order", "released"], "--decoder_order released"),
                       (["--cuda_graphs", "--fsdp"], "--fsdp")):
        a = pargs.parser().parse_args(["--model", NANO, *flags])
        pargs.validate(a)
        use, line = graphs.choose(a, cuda)
        assert not use and line.startswith("greenmim.pretrain: steps run eagerly, not as a CUDA graph: ") and \
            why in line and "\n" not in line, line


def test_the_pretrain_extra_installs_what_the_export_and_the_example_import():
    import ast
    tomllib = pytest.importorskip("tomllib")
    extra = tomllib.loads((ROOT / "python" / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    have = {n.lower() for n in extra["pretrain"]} | {"torch", "greenmim"}
    example = ast.parse((ROOT / "examples" / "finetune_timm.py").read_text())
    imported = {n.name.split(".")[0] for node in ast.walk(example) if isinstance(node, ast.Import) for n in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(example) if isinstance(node, ast.ImportFrom)
                 and node.module and node.level == 0}
    third_party = {m for m in imported if m not in sys.stdlib_module_names and m != "__future__"}
    assert "timm" in third_party and third_party <= have, (third_party, have)
