"""``--cuda_graphs``: the optimizer step (forward, backward, AdamW) captured once as a CUDA graph
and replayed on every batch.

Why: in eager PyTorch a GreenMIM step is host-bound. Swin-B's step queues about 1,600 kernels
for 25 ms of GPU work, and the host's per-op Python took 45-80 ms on an H200 machine. Replayed
as one graph, the same step took 25.3 ms: 4.7x SimMIM's. Compiled and replayed, it took
15.5 ms: 4.1x SimMIM compiled and replayed (docs/perf/NVIDIA_H200_2026-11-26c).

How:
- A graph replays fixed shapes at fixed addresses. Every plan is therefore padded to one
  capacity (:meth:`greenmim.MaskPlan.padded`; ``Geometry.capacity``, planned in the loader
  workers). Each step copies its images and plan into the captured inputs and replays.
- A plan beyond the capacity runs eagerly on the same parameters, gradients and optimizer
  state, and is counted.
- In one process the gradients are born inside the graph, during the backward, in memory that
  the forward's activations held (the graph's private pool): nothing holds them through the
  forward, as ``zero_grad(set_to_none=True)`` gives eager steps. A persistent buffer would cost
  the model's size in float32 at the step's peak (Swin-L on an H100: 8.08 GiB with it, 7.34
  without; docs/perf/NVIDIA_H100_80GB_HBM3_2026-11-26d). After an overflow step the parameters'
  ``grad`` point at the graph's gradients again, so that step's own are freed.
- With several processes the gradients are views of one flat buffer, as DDP's buckets are. The
  graph holds the forward and backward only. One all-reduce of that buffer follows eagerly,
  then AdamW. There is no DDP wrapper and no collective inside a graph, and every process makes
  exactly one all-reduce per step, replayed or not.
- The learning rate is a device tensor that the schedule fills in place, so the replayed AdamW
  reads each step's value. A float would be frozen into the graph.
- Capture needs warm-up runs first: lazy initialisations must not land in the graph, and
  AdamW's state must exist, or every replay would zero it again. The warm-up runs local steps
  (no collective) on the first batch, then puts back the parameters, buffers and optimizer state
  as they were. So the run trains exactly the steps it reports, and a resumed run continues
  from its checkpoint.

- A non-finite loss or gradient skips the step on the device: the graph computes a flag
  (``optim.nonfinite``) and hands it to the fused AdamW as ``found_inf``, as GradScaler does, so
  nothing waits for the host. The trainer reads the flags with the losses, every few steps.
- When more than 1% of the steps of a window (``grow_window``, 100 steps) overflow, the capacity
  grows to cover the plans that overflowed, and the step is captured once more (at most
  ``max_recaptures`` times); the plans the loader padded to the old capacity are padded again.

Scope (``choose``): CUDA by default, one process or torchrun without ``--fsdp``, ``--accum_iter 1``,
bf16 or float32, the greenmim decoder order; Swin, Twins and ConvNeXt V2's FCMAE (its plans have
no groups: at a fixed mask ratio every plan has the same shapes). Anything else runs eagerly, with one
line saying why. ``graph_api`` lets tests run the same logic on the CPU, with a stand-in that
replays by running the captured function again.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Callable, Optional, Tuple

import torch

from .._arena import ArenaPlan
from . import optim


def choose(args, device: torch.device) -> Tuple[bool, Optional[str]]:
    """Whether this run's step is captured as a CUDA graph, and when it is not on CUDA, the line
    that says why (None: nothing to say). On by default on CUDA; ``--eager`` opts out; the CPU
    runs eagerly (``--cuda_graphs`` there is refused before this)."""
    if device.type != "cuda" or args.eager:
        return False, None
    why = [w for w, bad in (("--fsdp (its collectives run inside the step)", args.fsdp),
                            (f"--accum_iter {args.accum_iter} (one graph holds one micro-batch)", args.accum_iter != 1),
                            ("--amp fp16 (its GradScaler reads the device each step; bf16 runs graphed)",
                             args.amp == "fp16"),
                            ("--decoder_order released (its permutation is drawn on the host each step)",
                             args.decoder_order == "released")) if bad]
    if why:
        return False, (f"greenmim.pretrain: steps run eagerly, not as a CUDA graph: {'; '.join(why)}. "
                       f"--eager says so and silences this line")
    return True, None


def _grown(a: tuple, b: tuple) -> tuple:
    return tuple(tuple(max(x, y) for x, y in zip(sa, sb)) for sa, sb in zip(a, b))


class _CudaGraphs:
    """torch.cuda's graphs: warm-up on a side stream, capture, replay."""

    def __init__(self, device: torch.device):
        self.device = device

    @contextlib.contextmanager
    def side_stream(self):
        s = torch.cuda.Stream(self.device)
        s.wait_stream(torch.cuda.current_stream(self.device))
        try:
            with torch.cuda.stream(s):
                yield
        finally:                         # also when a warm-up step raised: nothing may race the restore
            torch.cuda.current_stream(self.device).wait_stream(s)

    def capture(self, fn: Callable[[], torch.Tensor]):
        graph = torch.cuda.CUDAGraph()
        # thread_local: the DataLoader's pin-memory thread (cudaHostAlloc) and NCCL's watchdog
        # (event queries) keep running while this thread captures; "global" would fail on them
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            out = fn()
        return graph, out


def tensor_lr(opt: torch.optim.Optimizer, device: torch.device, dtype: torch.dtype = torch.float32) -> None:
    """Each param group's learning rate as a device tensor (filled in place by ``optim.set_lr``),
    so a captured AdamW reads the current value. float32, as the fused AdamW computes."""
    for g in opt.param_groups:
        if not isinstance(g["lr"], torch.Tensor):
            g["lr"] = torch.tensor(float(g["lr"]), dtype=dtype, device=device)


class GraphedStep:
    """``step(imgs, item) -> loss`` (a fresh tensor): one optimizer step, replayed from a graph.

    ``loss_fn(imgs, item)`` is the step's loss. It runs under autocast to ``amp``, without the
    weight cache, which must not live inside a captured region. ``item`` is the step's mask
    input. A plan (:class:`~greenmim.MaskPlan`, :class:`~greenmim.TwinsPlan`) is captured on the
    first plan at ``capacity``
    (``MaskPlan.group_counts()``), and later plans must share its shapes. A tensor (SimMIM's
    mask, in the benchmark) must keep its shape. ``module`` holds the parameters and buffers that
    the warm-up must leave as it found them. ``overflows`` counts the steps that ran eagerly,
    ``replays`` the others.

    Without ``grad_sync`` (one process) the whole step is in the graph: each step unsets the
    gradients, the backward allocates them in the graph's pool, the optimizer step reads them,
    and ``flat`` is None. With ``grad_sync`` (many processes) the gradients are views of one flat
    buffer, ``flat``: the graph zeroes it, the backward accumulates into it, and the graph holds
    the forward and the backward only. ``grad_sync(flat)`` then averages the buffer across
    processes, eagerly and outside the graph: one collective per step, whatever ran, so
    processes whose plans overflow at different steps stay in step. The optimizer step follows,
    also eagerly."""

    def __init__(self, module: torch.nn.Module, loss_fn: Callable, opt: torch.optim.Optimizer,
                 amp: Optional[torch.dtype], device: torch.device, capacity: Optional[tuple] = None,
                 warmup: int = 3, graph_api=None, grad_sync: Optional[Callable[[torch.Tensor], None]] = None,
                 grow_window: int = 100, max_recaptures: int = 3):
        self.module, self.loss_fn, self.opt, self.amp, self.device = module, loss_fn, opt, amp, device
        self.capacity = None if capacity is None else tuple(tuple(c) for c in capacity)
        self.warmup, self.grad_sync = warmup, grad_sync
        self.grow_window, self.max_recaptures, self.recaptures = grow_window, max_recaptures, 0
        self._window = [0, 0]            # steps and overflows since the last capture (or window)
        self._seen = None                # the largest group counts of the window's overflowing plans
        # 1.0 when this step's loss or a gradient is not finite: the fused AdamW then skips the step
        self.found = torch.zeros((), dtype=torch.float32, device=device)
        self.api = graph_api if graph_api is not None else _CudaGraphs(device)
        self.graph = self.loss = self.imgs = self.item = None
        self._graph_grads = None         # one process: the gradients the graph writes (its pool)
        self.overflows = self.replays = 0
        self.failure: Optional[str] = None   # why the capture failed (every step then runs eagerly)
        params = [p for g in opt.param_groups for p in g["params"] if p.requires_grad]
        self.params, self.flat = params, None
        if grad_sync is not None:
            dtypes = {p.dtype for p in params}
            if len(dtypes) != 1:
                raise ValueError(f"GraphedStep: the parameters have several dtypes {dtypes}; one flat gradient buffer "
                                 f"needs one")
            self.flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
            at = 0
            for p in params:
                p.grad = self.flat[at:at + p.numel()].view_as(p)
                at += p.numel()

    def _forward_backward(self, imgs: torch.Tensor, item) -> torch.Tensor:
        if self.flat is not None:
            self.flat.zero_()
        else:                            # born in the backward (in the graph's pool when captured)
            for p in self.params:
                p.grad = None
        with torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp is not None, cache_enabled=False):
            loss = self.loss_fn(imgs, item)
        loss.backward()                  # into the views of flat, or fresh gradients
        return loss.detach()

    def _optimizer_step(self, loss: torch.Tensor) -> None:
        """AdamW, skipped on the device when the loss or a gradient is not finite (a fused AdamW;
        another optimizer steps regardless, and ``found`` still says so)."""
        self.found.copy_(optim.nonfinite(loss, self.params))
        if optim.on_device_skip(self.opt):
            self.opt.found_inf = self.found
        self.opt.step()

    def _captured(self) -> torch.Tensor:
        loss = self._forward_backward(self.imgs, self.item)
        if self.grad_sync is None:
            self._optimizer_step(loss)
        return loss

    def _fits(self, imgs: torch.Tensor, item) -> bool:
        """Whether the captured graph can take this step's inputs (before the capture: whether
        they are the inputs to capture on)."""
        if self.failure is not None:
            return False
        if self.graph is None:
            return not isinstance(item, ArenaPlan) or self.capacity is None or item.group_counts() == self.capacity
        if imgs.shape != self.imgs.shape or imgs.dtype != self.imgs.dtype:
            return False
        if isinstance(item, ArenaPlan):
            return item.shape_key() == self.item.shape_key()
        return item.shape == self.item.shape and item.dtype == self.item.dtype

    def _capture(self, imgs: torch.Tensor, item) -> None:
        saved = {k: v.detach().clone() for k, v in self.module.state_dict().items()}
        opt_state = {id(p): {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
                     for p, s in self.opt.state.items()}
        self.imgs = imgs.to(self.device, copy=True)
        item = item.to(self.device, non_blocking=True)
        self.item = type(item)(item.arena.clone(), item.layout) if isinstance(item, ArenaPlan) else item.clone()
        try:
            with self.api.side_stream():  # local steps only: no collective (other processes may not capture now)
                for _ in range(self.warmup):
                    self._optimizer_step(self._forward_backward(self.imgs, self.item))
        finally:
            with torch.no_grad():        # the warm-up's updates undone: the run trains what it reports
                for k, v in self.module.state_dict().items():
                    v.copy_(saved[k])
                for p, s in self.opt.state.items():
                    old = opt_state.get(id(p))
                    for k, v in s.items():
                        if isinstance(v, torch.Tensor):
                            if old is None:
                                v.zero_()  # state the warm-up created: as a fresh optimizer has it
                            else:
                                v.copy_(old[k])
        del saved, opt_state             # not held through the capture
        if self.flat is None:
            for p in self.params:        # the warm-up's gradients: freed now, reborn in the graph's pool
                p.grad = None
        self.graph, self.loss = self.api.capture(self._captured)   # records; runs nothing
        if self.flat is None:
            self._graph_grads = [p.grad for p in self.params]

    def step(self, imgs: torch.Tensor, item) -> torch.Tensor:
        if self.recaptures and isinstance(item, ArenaPlan) and item.group_counts() != self.capacity:
            try:                         # the loader padded to the first capacity: pad to the grown one
                item = item.padded(self.capacity)
            except Exception:  # noqa: BLE001 - beyond the grown capacity too: an overflow
                pass
        loss = self._step(imgs, item)
        self._window[0] += 1
        if self._window[0] >= self.grow_window:
            self._maybe_grow()
        return loss

    def _maybe_grow(self) -> None:
        """More than 1% of the window's steps overflowed: the capacity grows to cover their plans,
        and the next step is captured once more."""
        steps, over = self._window
        self._window = [0, 0]
        seen, self._seen = self._seen, None
        if over * 100 <= steps or seen is None or self.capacity is None or self.recaptures >= self.max_recaptures \
                or self.failure is not None:
            return
        self.capacity = _grown(self.capacity, seen)
        self.recaptures += 1
        self.graph = self.loss = self.imgs = self.item = None   # the old graph and its pool freed
        if self._graph_grads is not None:
            for p in self.params:
                p.grad = None
            self._graph_grads = None

    def _step(self, imgs: torch.Tensor, item) -> torch.Tensor:
        if not self._fits(imgs, item):
            if isinstance(item, ArenaPlan) and self.capacity is not None:
                counts = tuple(tuple(c) for c in item.group_counts())
                self._seen = counts if self._seen is None else _grown(self._seen, counts)
            self._window[1] += 1
            return self._eager(imgs, item)
        if self.graph is None:
            try:
                self._capture(imgs, item)
            except Exception as e:  # noqa: BLE001 - a step that cannot be captured still trains, eagerly
                self.graph, self.failure = None, f"{type(e).__name__}: {e}"
                warnings.warn(f"greenmim.pretrain --cuda_graphs: the step could not be captured ({self.failure}); "
                              f"every step runs eagerly", RuntimeWarning, stacklevel=2)
                return self._eager(imgs, item)
        else:
            self.imgs.copy_(imgs, non_blocking=True)
            self.item.copy_(item, non_blocking=True)
        self.graph.replay()
        self.replays += 1
        loss = self.loss.clone()
        if self.grad_sync is not None:
            self.grad_sync(self.flat)
            self._optimizer_step(loss)
        return loss

    def _eager(self, imgs: torch.Tensor, item) -> torch.Tensor:
        """Inputs the graph cannot take: the same step, eagerly (on the same gradient buffer with
        ``grad_sync``)."""
        self.overflows += 1
        loss = self._forward_backward(imgs.to(self.device, non_blocking=True), item.to(self.device, non_blocking=True))
        if self.grad_sync is not None:
            self.grad_sync(self.flat)
        self._optimizer_step(loss)
        if self._graph_grads is not None:  # this step's gradients freed; grad reads the graph's again
            for p, g in zip(self.params, self._graph_grads):
                p.grad = g
        return loss
