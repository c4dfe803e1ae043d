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
import subprocess
import sys

import pytest
import torch

import greenmim
from greenmim.pretrain import data, graphs, optim

NANO = "green_mim_swin_nano_patch4_dec128b1"


class _StandIn:
    """torch.cuda graphs' part in GraphedStep, on the CPU."""

    def __init__(self, opt):
        self.opt, self.captures = opt, 0

    def side_stream(self):
        return contextlib.nullcontext()

    def capture(self, fn):
        self.captures += 1
        out = torch.zeros((), dtype=torch.float64)
        return _Graph(fn, out, self.opt), out


class _Graph:
    def __init__(self, fn, out, opt):
        self.fn, self.out, self.opt = fn, out, opt

    def replay(self):
        self.opt.zero_grad(set_to_none=True)      # as at the capture: the graph writes the gradients
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
        got = step.step(img, plan)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=0)
    assert stand_in.captures == 1 and step.replays == 5 and step.overflows == 2
    for (n, p), q in zip(ref.named_parameters(), model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-9, atol=1e-12, msg=n)
    for p, q in zip(ref.parameters(), model.parameters()):
        a, b = ref_opt.state[p], opt.state[q]
        assert float(a["step"]) == float(b["step"]) == 8
        torch.testing.assert_close(b["exp_avg_sq"], a["exp_avg_sq"], rtol=1e-8, atol=1e-20)


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


def test_cuda_graphs_refuses_what_it_cannot_capture(tmp_path):
    def bad(expect, *extra):
        out = subprocess.run([sys.executable, "-m", "greenmim.pretrain", "--model", NANO, "--output_dir",
                              str(tmp_path), "--max_steps", "1", "--num_workers", "0", "--cuda_graphs", *extra],
                             capture_output=True, text=True, timeout=300)
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert out.returncode == 2 and len(lines) == 1 and expect in lines[0], out.stderr[-2000:]
    bad("--accum_iter 2", "--accum_iter", "2")
    bad("--amp fp16", "--amp", "fp16")
    bad("--decoder_order released", "--decoder_order", "released")
    bad("Twins plans are not padded", "--model", "green_mim_twins_nano_patch4_dec128b1")
    bad("needs one process on a CUDA device", "--device", "cpu")
