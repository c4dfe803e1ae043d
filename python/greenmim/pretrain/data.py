"""Images, masks and plans for pretraining.

One DataLoader item is one micro-batch: its images, its unit masks and the plan of those masks
(:class:`greenmim.MaskPlan`, one int32 arena: one shared-memory file per item). Masks are drawn
and planned in the loader's workers, so planning never waits on, or stalls, the GPU; the main
process only copies the plan's arena to the device.

Every random choice of a micro-batch (crops, flips, masks) is drawn from a seed derived from
(seed, epoch, step, micro-batch), not from a worker's state: the data do not depend on the
number of workers, ranks draw different masks, and a resumed run draws exactly what the
uninterrupted one would have. Optimizer step t of an epoch covers positions [t*E, (t+1)*E) of
that epoch's permutation (E = batch_size x accum_iter x world_size); micro-batch m = a * world
+ rank (accumulation step a) takes its m-th slice. So two ranks without accumulation see
exactly what one process sees with accum_iter 2.

The images themselves are decoded either in the workers (``crops``: libjpeg-turbo into tensors,
uint8 crops) or on the step's device (``decode``: the workers ship bytes and crop boxes); the
sources of images are in ``images``.
"""
from __future__ import annotations

import hashlib
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .. import mask_plan
from .._lib import GreenmimError
from . import crops, decode as _decode
from .dist import node_cpus
from .images import (IMAGE_EXTENSIONS, SAMPLE_CROPS_PER_EPOCH, SAMPLE_HELD_OUT, SAMPLE_TRAIN, SKIP_LIMIT,  # noqa: F401
                     DataError, ImageFiles, SamplePhotographs)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integers (stable across processes and Python versions)."""
    h = hashlib.blake2b(",".join(str(int(p)) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1)


def train_transform(size: int):
    """The released augmentation: RandomResizedCrop (scale 0.2-1, bicubic), horizontal flip,
    ImageNet normalisation."""
    from torchvision import transforms as T
    return T.Compose([T.RandomResizedCrop(size, scale=(0.2, 1.0), interpolation=T.InterpolationMode.BICUBIC),
                      T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def train_crops(size: int):
    """``train_transform`` up to the pixels (PIL): the random crop and flip, as uint8 ``[3, size, size]``.
    The loader's workers ran this until ``crops.crop_one`` (the same draws on tensors) replaced
    it; bench/loader.py measures it as the baseline. ``normalize`` does the rest on the step's
    device. Converting to float and normalising took a fifth to a quarter of a worker's time per
    image, and float32 batches are four times the bytes to pin and copy (timm's PrefetchLoader
    makes the same split)."""
    from torchvision import transforms as T
    return T.Compose([T.RandomResizedCrop(size, scale=(0.2, 1.0), interpolation=T.InterpolationMode.BICUBIC),
                      T.RandomHorizontalFlip(), T.PILToTensor()])


def normalize(imgs: Tensor) -> Tensor:
    """uint8 ``[B, 3, H, W]`` (``train_crops``) -> float32, as ``ToTensor`` then ``Normalize``
    compute it (the same operations in the same order), on the tensor's device."""
    if imgs.dtype != torch.uint8:
        raise TypeError(f"normalize: expected uint8 images, got {imgs.dtype}")
    mean, std = _mean_std(imgs.device)
    return imgs.float().div(255).sub(mean).div(std)


_MEAN_STD: dict = {}


def _mean_std(device: torch.device) -> Tuple[Tensor, Tensor]:
    """The normalisation's constants on ``device``, made once: a host-to-device copy cannot be
    captured in a CUDA graph (--cuda_graphs captures ``normalize``; its warm-up makes them)."""
    key = str(device)
    if key not in _MEAN_STD:
        _MEAN_STD[key] = tuple(torch.tensor(v, dtype=torch.float32).view(1, 3, 1, 1).to(device)
                               for v in (IMAGENET_MEAN, IMAGENET_STD))
    return _MEAN_STD[key]


def eval_transform(size: int):
    """Resize the short side, centre crop, normalise (the fixed images of the visualisation)."""
    from torchvision import transforms as T
    return T.Compose([T.Resize(size, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(size), T.ToTensor(),
                      T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def pad_to(plan, capacity):
    """``plan.padded(capacity)``, or the plan itself when it needs more groups (an overflow: that
    step runs eagerly, graphs.GraphedStep) or there is no capacity."""
    if capacity is None:
        return plan
    try:
        return plan.padded(capacity)
    except GreenmimError:
        return plan


class Geometry:
    """What planning needs of the model: image size, patch, window, stages, stage-1 channels
    (Swin); an encoder with ``plan_spec`` (Twins, ConvNeXt V2) hands over its own picklable spec
    instead."""

    def __init__(self, model, fixed_groups: bool = False):
        enc = model.encoder
        self.group_size = -1 if fixed_groups else 0  # -1: G = each stage's window area (--compile)
        self.capacity = None                         # --cuda_graphs: plans padded to it (capacity_for)
        self.grid = model.grid                    # mask units per side (the last stage's grid)
        self.img_size, self.patch_size, self.window = enc.img_size, enc.patch_size, enc.window_size
        self.spec = enc.plan_spec(self.group_size) if hasattr(enc, "plan_spec") else None
        if self.spec is None:
            self.num_stages, self.embed_dim, self.strategy = len(enc.layers), enc.embed_dim, enc.strategy

    def plan(self, masks: Tensor, batch: Optional[int] = None):
        """The plan of a micro-batch's masks; ``batch``: its images (a ConvNeXt V2 plan is per
        sample, so one shared mask is planned for each)."""
        if getattr(self.spec, "fixed_shapes", False):
            return self.spec.plan(masks, device="cpu", cache=False, batch=batch)   # nothing to pad
        if self.spec is not None:
            plan = self.spec.plan(masks, device="cpu", cache=False)
        else:
            plan = mask_plan.plan_masks(masks, img_size=self.img_size, patch_size=self.patch_size,
                                      window_size=self.window, num_stages=self.num_stages, embed_dim=self.embed_dim,
                                      strategy=self.strategy, device="cpu", cache=False, group_size=self.group_size)
        return pad_to(plan, self.capacity)

    def capacity_for(self, batch: int, per_sample: bool, mask_ratio: float, seed: int, samples: int = 64) -> tuple:
        """The group capacity of this run's plans (``--cuda_graphs``): from ``samples`` masks of its
        distribution (``greenmim.group_capacity``), drawn from their own generator. None where
        every plan has the same shapes (ConvNeXt V2's: no groups)."""
        if getattr(self.spec, "fixed_shapes", False):
            return None
        g = torch.Generator().manual_seed(seed ^ 0x6A09E667)
        kept, self.capacity = self.capacity, None
        try:
            plans = [self.plan(mask_plan.random_masks(batch if per_sample else None, grid=self.grid, ratio=mask_ratio,
                                                    generator=g)) for _ in range(samples)]
        finally:
            self.capacity = kept
        return mask_plan.group_capacity(plans)


class MicroBatches(torch.utils.data.Dataset):
    """Item = one micro-batch ``(epoch, step, micro, indices)`` -> ``(images, masks, plan)``.

    ``decode="cpu"``: the images are uint8 crops ``[B, 3, size, size]`` (``crops.crop_one``: the
    released crop and flip, decoded and resized on the worker's CPU), for ``normalize`` on the
    device. ``decode="gpu"``: they are a ``decode.EncodedBatch`` (the files' bytes, the crop boxes
    and flips drawn here) for ``decode.GpuDecoder`` on the device. Both draw the same boxes and
    flips from the same seed, so the two paths crop alike and a run may resume on either.
    An unreadable file is skipped for the next one, with one warning (its draws are undone)."""

    def __init__(self, images, size: int, geometry: Geometry, mask_ratio: float, per_sample: bool, seed: int,
                 decode: str = "cpu"):
        if decode not in ("cpu", "gpu"):
            raise DataError(f"MicroBatches: decode must be 'cpu' or 'gpu' (decode.resolve_decode), not {decode!r}")
        self.images, self.size, self.geometry = images, size, geometry
        self.mask_ratio, self.per_sample, self.seed, self.decode = mask_ratio, per_sample, seed, decode

    def __len__(self) -> int:  # the sampler drives the loader; this is for DataLoader's checks only
        return len(self.images)

    def _first_readable(self, i: int, g: torch.Generator, make):
        """``make(raw, g)`` for the first image from ``i`` on that reads; a skipped one's draws undone."""
        n = len(self.images)
        for k in range(min(n, SKIP_LIMIT)):
            state = g.get_state()
            try:
                return self.images.name(i + k), make(self.images.raw(i + k), g)
            except (crops.Unreadable, OSError) as e:
                g.set_state(state)
                self.images.warn_unreadable(i + k, e)
        raise self.images.give_up(i)

    def cpu_crops(self, idx: List[int], g: torch.Generator) -> Tensor:
        """The CPU path's uint8 crops of images ``idx``, drawn from ``g`` in order."""
        out = torch.empty(len(idx), 3, self.size, self.size, dtype=torch.uint8)
        for k, i in enumerate(idx):
            out[k] = self._first_readable(i, g, lambda raw, g: crops.crop_one(raw, g, self.size))[1]
        return out

    def encoded(self, idx: List[int], g: torch.Generator) -> "_decode.EncodedBatch":
        """The GPU path's worker part: bytes, boxes and flips (``decode.plan_one``), drawn from ``g``."""
        got = [self._first_readable(i, g, lambda raw, g: _decode.plan_one(raw, g, self.size)) for i in idx]
        return _decode.encode_batch([it for _, it in got], [name for name, _ in got], self.size)

    def __getitem__(self, item: Tuple[int, int, int, List[int]]):
        epoch, step, micro, idx = item
        seed = derive_seed(self.seed, epoch, step, micro)
        g = torch.Generator().manual_seed(seed)   # the crops and flips; a stream as torch.manual_seed(seed)'s
        imgs = self.cpu_crops(idx, g) if self.decode == "cpu" else self.encoded(idx, g)
        g = torch.Generator().manual_seed(seed ^ 0x5DEECE66D)
        masks = mask_plan.random_masks(len(idx) if self.per_sample else None, grid=self.geometry.grid,
                                     ratio=self.mask_ratio, generator=g)
        return imgs, masks, self.geometry.plan(masks, len(idx))


class StepSampler(torch.utils.data.Sampler):
    """This rank's micro-batches, from optimizer step ``start_step`` of epoch ``epoch`` on: to the
    end of that epoch, or with ``end`` (a global step count) on through the following epochs up to
    step ``end``. One loader then serves the whole run: its workers keep prefetching across an
    epoch's end (the checkpoint, the reconstructions) instead of starting afresh for each epoch."""

    def __init__(self, n: int, batch: int, accum: int, world: int, rank: int, seed: int, epoch: int = 0,
                 start_step: int = 0, end: Optional[int] = None):
        self.n, self.batch, self.accum, self.world, self.rank, self.seed = n, batch, accum, world, rank, seed
        self.epoch, self.start_step, self.end = epoch, start_step, end

    @property
    def global_batch(self) -> int:
        return self.batch * self.accum * self.world

    @property
    def steps_per_epoch(self) -> int:
        return self.n // self.global_batch

    def _stop(self) -> int:
        """The global step this sampler stops before."""
        first_epoch_end = (self.epoch + 1) * self.steps_per_epoch
        return first_epoch_end if self.end is None else max(self.end, self.epoch * self.steps_per_epoch)

    def __len__(self) -> int:
        return max(self._stop() - (self.epoch * self.steps_per_epoch + self.start_step), 0) * self.accum

    def __iter__(self):
        spe, E, stop = self.steps_per_epoch, self.global_batch, self._stop()
        if spe == 0:                     # fewer images than one step (the trainer refuses that earlier)
            return
        epoch, start = self.epoch, self.start_step
        while epoch * spe + start < stop:
            perm = torch.randperm(self.n, generator=torch.Generator().manual_seed(derive_seed(self.seed, epoch)))
            for t in range(start, min(spe, stop - epoch * spe)):
                for a in range(self.accum):
                    m = a * self.world + self.rank
                    first = t * E + m * self.batch
                    yield epoch, t, m, perm[first:first + self.batch].tolist()
            epoch, start = epoch + 1, 0


def make_loader(dataset: MicroBatches, sampler: StepSampler, num_workers: int, pin_memory: bool):
    kw = {}
    if num_workers > 0:
        kw = dict(persistent_workers=False, prefetch_factor=2)
    return torch.utils.data.DataLoader(dataset, batch_size=None, sampler=sampler, num_workers=num_workers,
                                       pin_memory=pin_memory, **kw)


def fixed_images(images, size: int, count: int = 8) -> Tensor:
    """``count`` images for the visualisation: evenly spread over the data set, centre crops."""
    tf = eval_transform(size)
    return torch.stack([tf(images.load(i)) for i in images.spread(count)])


def held_out_photographs(size: int) -> Tensor:
    """The sample photographs kept out of training (coffee, rocket), centre crops."""
    tf = eval_transform(size)
    s = SamplePhotographs(SAMPLE_HELD_OUT, 1)
    return torch.stack([tf(s.load(i)) for i in range(len(SAMPLE_HELD_OUT))])


def worker_count(requested: Optional[int], local_world: Optional[int] = None) -> int:
    """``--num_workers``, or by default this process's share of the CPUs it may run on, less one
    for the process itself (at least 1, at most 32). The share divides by the processes on this
    node (torchrun's ``LOCAL_WORLD_SIZE``), so 8 ranks on a 16-core node get 1 worker each, not
    8. Decoding and cropping are what the workers spend their time on (bench/loader.py: about 98%),
    and a replayed Swin-B step takes 128 images in 29 ms on an H100, faster than 14 workers
    deliver them, so the default uses the cores."""
    if requested is not None:
        return requested
    cpus, local_world = node_cpus(local_world)
    return max(1, min(32, cpus // local_world - 1))
