"""greenmim.pretrain --cuda_graphs: the captured optimizer step (pretrain/graphs.py).

A CUDA graph replays the kernels it recorded, on the addresses it recorded: the step must read
everything that changes (images, plan, learning rate) from the captured inputs, and capturing
must leave the model and optimizer as it found them. On the CPU a stand-in plays the graph:
capture records the function without running it, and replay runs it again (with the gradients
unset, as they were when the real graph was captured). Everything the step does is then checked
against plain eager steps on the same batches: losses, parameters and optimizer state, through a
capture with a resumed optimizer, a learning-rate schedule, and plans that overflow the capacity.
The real capture ran on an H200 in bench/gpu/train_step.py --graphs (docs/perf/NVIDIA_H200_2026-11-26c);
this trainer path has not run on a device yet."""
import contextlib
import gc
import weakref

import pytest
import torch

import greenmim
from greenmim.pretrain import data, graphs, optim

NANO = "green_mim_swin_nano_patch4_dec128b1"


class _StandIn:
    """torch.cuda graphs' part in GraphedStep, on the CPU: capture records without running,
    replay runs what was recorded (which starts by unsetting the gradients, or zeroing the flat
    buffer with several processes)."""

    def __init__(self, opt=None):
        self.captures = 0

    def side_stream(self):
        return contextlib.nullcontext()

    def capture(self, fn):
        self.captures += 1
        out = torch.zeros((), dtype=torch.float64)
        return _Graph(fn, out), out


class _Graph:
    def __init__(self, fn, out):
        self.fn, self.out = fn, out

    def replay(self):
        self.out.copy_(self.fn())


def _pair():
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(greenmim.create_model(NANO).double())
    # foreach=False: torch's CPU AdamW takes a tensor learning rate on its single-tensor path only
    opts = [torch.optim.AdamW(optim.param_groups(m, 0.05), lr=1e-3, betas=(0.9, 0.95), foreach=False)
            for m in models]
    return models, opts


def _eager_step(model, opt, img, plan):
    opt.zero_grad(set_to_none=True)
    loss = model(img, plan)[0]
    loss.backward()
    opt.step()
    return loss.detach()


@pytest.mark.parametrize("per_sample", [False, True])
def test_graphed_steps_equal_eager_steps(per_sample):
    (ref, model), (ref_opt, opt) = _pair()
    gen = torch.Generator().manual_seed(17)
    B = 3
    img0 = torch.randn(B, 3, 224, 224, dtype=torch.float64, generator=gen)
    plan0 = ref.plan(ref.random_masks(B if per_sample else None, generator=gen), cache=False)
    for m, o in ((ref, ref_opt), (model, opt)):   # a step before: the capture meets a resumed optimizer's state
        _eager_step(m, o, img0, plan0)
    geo = data.Geometry(model, fixed_groups=True)
    geo.capacity = geo.capacity_for(B, per_sample, 0.75, seed=1, samples=16)
    graphs.tensor_lr(opt, torch.device("cpu"), torch.float64)   # float64: the eager reference's own rounding
    assert all(isinstance(g["lr"], torch.Tensor) for g in opt.param_groups)
    stand_in = _StandIn(opt)
    step = graphs.GraphedStep(model, lambda x, p: model(x, p)[0], opt, None, torch.device("cpu"), geo.capacity,
                              warmup=2, graph_api=stand_in)
    unpadded = data.Geometry(model, fixed_groups=True)           # plans the graph cannot take: eager
    for k in range(7):
        lr = 1e-3 * (0.5 + 0.1 * k)                               # the schedule moves every step
        optim.set_lr(ref_opt, lr)
        optim.set_lr(opt, lr)
        masks = ref.random_masks(B if per_sample else None, generator=gen)
        over = k in (0, 4)                                        # the first plan overflows: capture waits
        plan = (unpadded if over else geo).plan(masks)
        if over:
            assert plan.group_counts() != geo.capacity
        img = torch.randn(B, 3, 224, 224, dtype=torch.float64, generator=gen)
        want = _eager_step(ref, ref_opt, img, plan)
        seen = []                                                 # the overflow's own gradients, as AdamW sees them
        hook = opt.register_step_pre_hook(lambda o, a, kw: seen.extend(weakref.ref(p.grad) for g in o.param_groups
                                                                       for p in g["params"] if p.grad is not None))
        got = step.step(img, plan)
        hook.remove()
        torch.testing.assert_close(got, want, rtol=1e-10, atol=0)
        if over and k > 0:                                        # after the capture: freed, not kept to the end
            gc.collect()
            assert seen and not any(r() is not None for r in seen)
            assert all(p.grad is g for p, g in zip(step.params, step._graph_grads))
    assert stand_in.captures == 1 and step.replays == 5 and step.overflows == 2
    for (n, p), q in zip(ref.named_parameters(), model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-9, atol=1e-12, msg=n)
    for p, q in zip(ref.parameters(), model.parameters()):
        a, b = ref_opt.state[p], opt.state[q]
        assert float(a["step"]) == float(b["step"]) == 8
        torch.testing.assert_close(b["exp_avg_sq"], a["exp_avg_sq"], rtol=1e-8, atol=1e-20)


class _Refuses(_StandIn):
    """A capture that fails, as CUDA refuses an operation it cannot record."""

    def capture(self, fn):
        raise RuntimeError("operation not permitted when stream is capturing")


def test_a_failed_capture_trains_eagerly_from_where_it_was():
    """The warm-up's updates are put back, a warning says why, and every step then equals eager."""
    (ref, model), (ref_opt, opt) = _pair()
    gen = torch.Generator().manual_seed(4)
    geo = data.Geometry(model, fixed_groups=True)
    geo.capacity = geo.capacity_for(2, False, 0.75, seed=1, samples=8)
    graphs.tensor_lr(opt, torch.device("cpu"), torch.float64)
    step = graphs.GraphedStep(model, lambda x, p: model(x, p)[0], opt, None, torch.device("cpu"), geo.capacity,
                              warmup=2, graph_api=_Refuses())
    with pytest.warns(RuntimeWarning, match="could not be captured .RuntimeError: operation not permitted"):
        for _ in range(3):
            plan = geo.plan(ref.random_masks(None, generator=gen))
            img = torch.randn(2, 3, 224, 224, dtype=torch.float64, generator=gen)
            torch.testing.assert_close(step.step(img, plan), _eager_step(ref, ref_opt, img, plan), rtol=1e-10, atol=0)
    assert step.failure.startswith("RuntimeError") and step.replays == 0 and step.overflows == 3
    for p, q in zip(ref.parameters(), model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-9, atol=1e-12)


def test_tensor_learning_rates_are_saved_as_numbers(tmp_path):
    (model, _), (opt, _) = _pair()
    graphs.tensor_lr(opt, torch.device("cpu"))
    optim.set_lr(opt, 2.5e-4)
    want = float(torch.tensor(2.5e-4, dtype=torch.float32))
    assert [float(g["lr"]) for g in opt.param_groups] == [want, want]
    from greenmim.pretrain import dist, state
    ctx = dist.Context(device=torch.device("cpu"), rank=0, world=1, local_rank=0, fsdp=False)
    path = str(tmp_path / "c.pth")
    state.save(path, model, opt, None, 0, 1, type("A", (), {})(), model.config, ctx)
    saved = torch.load(path, weights_only=False)["optimizer"]["param_groups"]
    assert all(type(g["lr"]) is float and g["lr"] == want for g in saved)


def test_cuda_graphs_on_the_cpu_or_with_eager_is_refused(tmp_path, capsys):
    """What --cuda_graphs refused before (fp16, --accum_iter > 1, --fsdp, the released decoder order)
    now runs eagerly with one line (graphs.choose, test_long_runs.py); asking for graphs on the CPU,
    or for graphs and --eager at once, is one line and exit code 2."""
    from greenmim.pretrain import cli

    def bad(expect, *extra):
        rc = cli.main(["--model", NANO, "--output_dir", str(tmp_path), "--max_steps", "1", "--num_workers", "0",
                       "--cuda_graphs", *extra])
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert rc == 2 and len(lines) == 1 and lines[0].startswith("greenmim.pretrain: error:"), lines
        assert expect in lines[0], lines[0]
    bad("--cuda_graphs needs a CUDA device", "--device", "cpu")
    bad("--cuda_graphs and --eager contradict each other", "--eager")
    assert not list(tmp_path.rglob("checkpoint*"))


def test_overflowing_plans_grow_the_capacity_and_the_step_is_captured_again():
    """A capacity from too few masks: more than 1% of a window's plans overflow, so the capacity
    grows to cover them and the step is captured once more; the plans the loader padded to the old
    capacity are padded to the new one. Every step still equals eager."""
    (ref, model), (ref_opt, opt) = _pair()
    gen = torch.Generator().manual_seed(5)
    geo = data.Geometry(model, fixed_groups=True)
    geo.capacity = geo.capacity_for(2, True, 0.75, seed=3, samples=1)
    stand_in = _StandIn()
    step = graphs.GraphedStep(model, lambda x, p: model(x, p)[0], opt, None, torch.device("cpu"), geo.capacity,
                              warmup=1, graph_api=stand_in, grow_window=4)
    first = step.capacity
    for k in range(10):
        plan = geo.plan(ref.random_masks(2, generator=gen))
        img = torch.randn(2, 3, 224, 224, dtype=torch.float64, generator=gen)
        torch.testing.assert_close(step.step(img, plan), _eager_step(ref, ref_opt, img, plan), rtol=1e-10, atol=0)
    assert step.recaptures >= 1 and stand_in.captures == 1 + step.recaptures, (step.recaptures, stand_in.captures)
    assert all(b >= a for sa, sb in zip(first, step.capacity) for a, b in zip(sa, sb)) and step.capacity != first
    for p, q in zip(ref.parameters(), model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-9, atol=1e-12)


def test_a_nonfinite_step_is_skipped_on_the_device_inside_the_graph():
    """The graph computes the flag and the fused AdamW skips the update (found_inf, as GradScaler
    drives it): nothing read back. The parameters and the step count stay; later steps equal eager
    steps that skipped the same batch."""
    models, opts = _pair()
    ref, model = models
    opts = [torch.optim.AdamW(optim.param_groups(m, 0.05), lr=1e-3, betas=(0.9, 0.95), fused=True) for m in models]
    ref_opt, opt = opts
    gen = torch.Generator().manual_seed(6)
    geo = data.Geometry(model, fixed_groups=True)
    geo.capacity = geo.capacity_for(2, False, 0.75, seed=1, samples=16)
    step = graphs.GraphedStep(model, lambda x, p: model(x, p)[0], opt, None, torch.device("cpu"), geo.capacity,
                              warmup=1, graph_api=_StandIn())
    flags = []
    for k in range(4):
        plan = geo.plan(ref.random_masks(None, generator=gen))
        img = torch.randn(2, 3, 224, 224, dtype=torch.float64, generator=gen)
        if k == 2:
            img[0, 0, 0, 0] = float("nan")
            before = [p.detach().clone() for p in model.parameters()]
            replays = step.replays
            assert not torch.isfinite(step.step(img, plan))
            assert step.replays == replays + 1                       # it ran in the graph
            assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
        else:
            torch.testing.assert_close(step.step(img, plan), _eager_step(ref, ref_opt, img, plan), rtol=1e-10, atol=0)
        flags.append(float(step.found))
    assert flags == [0.0, 0.0, 1.0, 0.0] and step.replays + step.overflows == 4
    assert {int(s["step"]) for s in opt.state.values()} == {3}
    for p, q in zip(ref.parameters(), model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-9, atol=1e-12)


def _batches(model, rank_count, steps, B):
    """Each step's batch of every rank: (images, padded-or-not plan), the same on every process."""
    gen = torch.Generator().manual_seed(29)
    geo = data.Geometry(model, fixed_groups=True)
    geo.capacity = geo.capacity_for(B, False, 0.75, seed=2, samples=12)
    raw = data.Geometry(model, fixed_groups=True)
    out = []
    for k in range(steps):
        per_rank = []
        for r in range(rank_count):
            masks = model.random_masks(None, generator=gen)
            plan = (raw if (k, r) in ((1, 1), (3, 0)) else geo).plan(masks)   # overflows on one rank at a time
            per_rank.append((torch.randn(B, 3, 224, 224, dtype=torch.float64, generator=gen), plan))
        out.append(per_rank)
    return geo.capacity, out


def _rank_main(rank, world, init, out_dir, steps, B):
    import torch.distributed as torch_dist
    from greenmim.pretrain import dist as gdist
    torch.set_num_threads(1)
    torch_dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    ctx = gdist.Context(rank=rank, world=world, local_rank=rank, device=torch.device("cpu"), fsdp=False)
    (model, _), (opt, _) = _pair()
    if rank == 1:                                  # rank 0's weights reach every rank
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    gdist.broadcast_state(model, ctx)
    graphs.tensor_lr(opt, torch.device("cpu"), torch.float64)
    capacity, batches = _batches(model, world, steps, B)
    step = graphs.GraphedStep(model, lambda x, p: model(x, p)[0], opt, None, torch.device("cpu"), capacity,
                              warmup=2, graph_api=_StandIn(), grad_sync=gdist.average_gradients(ctx))
    losses = []
    for k in range(steps):
        optim.set_lr(opt, 1e-3 * (1 - 0.1 * k))
        img, plan = batches[k][rank]
        losses.append(gdist.mean(step.step(img, plan), ctx))
    torch.save({"params": [p.detach() for p in model.parameters()], "losses": losses,
                "counts": (step.replays, step.overflows)}, f"{out_dir}/rank{rank}.pt")
    torch_dist.destroy_process_group()


def test_graphed_steps_on_two_processes_equal_one_process_accumulating(tmp_path):
    """Two gloo processes, each replaying its own graph and averaging gradients after it, with
    overflows on different ranks at different steps, against one process accumulating both
    ranks' batches eagerly: the same losses and parameters."""
    import torch.multiprocessing as mp
    steps, B, world = 4, 2, 2
    mp.spawn(_rank_main, args=(world, f"file://{tmp_path}/store", str(tmp_path), steps, B), nprocs=world)
    (ref, _), (opt, _) = _pair()
    capacity, batches = _batches(ref, world, steps, B)
    want_losses = []
    for k in range(steps):
        optim.set_lr(opt, 1e-3 * (1 - 0.1 * k))
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for img, plan in batches[k]:
            loss = ref(img, plan)[0]
            (loss / world).backward()
            total += float(loss.detach()) / world
        opt.step()
        want_losses.append(total)
    ranks = [torch.load(f"{tmp_path}/rank{r}.pt") for r in range(world)]
    for r, got in enumerate(ranks):                # a plan off the capacity runs eagerly on its rank alone
        over = sum(batches[k][r][1].group_counts() != capacity for k in range(steps))
        assert got["counts"] == (steps - over, over) and over >= 1
    for r in ranks:
        assert r["losses"] == pytest.approx(want_losses, rel=1e-10)
        for p, q in zip(ref.parameters(), r["params"]):
            torch.testing.assert_close(q, p.detach(), rtol=1e-9, atol=1e-12)
