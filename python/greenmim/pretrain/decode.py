"""Decoding on the step's device: the workers read bytes and draw the crops, the device decodes.

``--decode gpu`` moves the input pipeline's heaviest part, the JPEG decode and the resize, off
the loader's CPU workers. A worker reads each file's bytes, parses its JPEG header for the size,
and draws the crop box and flip exactly as the CPU path would (``crops.draw_crop``,
``crops.draw_flip``, same generator, same order); it ships an ``EncodedBatch``: the bytes in one
buffer, the boxes and flips. ``GpuDecoder`` then decodes the batch with torchvision's batched
nvJPEG decode (``decode_jpeg(list, device="cuda")``) and crops, resizes (antialiased bicubic)
and flips all of it in a few kernels (``crop_resize``): the crop and the flip are folded into the
two resize matrices of each image, so an image costs two batched matrix products and no
per-image launch.

Why torchvision's nvJPEG rather than NVIDIA DALI: torchvision is already pinned and installed
(nothing new to pin, no second CUDA runtime in the wheel), its decode takes a plain list of byte
tensors from any DataLoader, and the resize here is ours either way (the crop statistics and
filter must match the CPU path's). DALI's fused ROI decode would skip decoding the pixels outside
the crop; no device has measured either yet (see docs/pretraining-speed.md).

What the GPU path cannot decode it does not guess at: a file that is not a JPEG (PNG, ...) or
whose end-of-image marker is missing is decoded and cropped in the worker, on the CPU, and
travels ready-made; a JPEG that nvJPEG refuses (CMYK, arithmetic coding, corrupt data) is decoded
on the CPU by the decoder, counted in ``GpuDecoder.fallbacks``.
"""
from __future__ import annotations

import sys
from typing import List, NamedTuple, Sequence

import torch
from torch import Tensor

from . import crops
from .images import DataError

DECODE_CHOICES = ("auto", "cpu", "gpu")


class EncodedBatch(NamedTuple):
    """A micro-batch before decoding (picklable; a NamedTuple so DataLoader's pinning walks it).
    Image ``b``'s bytes are ``data[offsets[b]:offsets[b + 1]]``, empty for the images in
    ``ready`` (decoded in the worker: ``ready[k]`` is image ``ready_index[k]``)."""
    data: Tensor            # uint8 [total bytes]: every file's bytes, one buffer (one shared-memory file)
    offsets: Tensor         # int64 [B + 1]
    shapes: Tensor          # int64 [B, 2]: (height, width) from each JPEG's header
    boxes: Tensor           # int64 [B, 4]: (top, left, height, width), crops.draw_crop's
    flips: Tensor           # bool [B]
    ready_index: Tensor     # int64 [K]
    ready: Tensor           # uint8 [K, 3, S, S]
    names: tuple            # str per image, for the warnings

    @property
    def size(self) -> int:
        return len(self.flips)


def plan_one(raw, g: torch.Generator, size: int):
    """A worker's part for one image: ``("jpeg", bytes, (H, W), box, flip)`` for a complete JPEG
    (box and flip drawn from ``g``, as ``crops.crop_one`` draws them), else the CPU crop
    ``("ready", uint8 [3, size, size])``. Raises ``crops.Unreadable`` as ``crop_one`` does."""
    if not isinstance(raw, Tensor):
        info = crops.jpeg_info(raw)
        if info is not None and info[2] in (1, 3) and crops.jpeg_complete(raw):
            H, W = info[0], info[1]
            box, flip = crops.draw_crop(g, H, W), crops.draw_flip(g)
            return "jpeg", raw, (H, W), box, flip
    return "ready", crops.crop_one(raw, g, size)


def encode_batch(items: Sequence[tuple], names: Sequence[str], size: int) -> EncodedBatch:
    """``plan_one``'s results for a micro-batch -> one ``EncodedBatch``."""
    jpeg = [it if it[0] == "jpeg" else ("ready", b"", (0, 0), (0, 0, 0, 0), False) for it in items]
    offsets = torch.zeros(len(items) + 1, dtype=torch.int64)
    offsets[1:] = torch.tensor([len(it[1]) for it in jpeg], dtype=torch.int64).cumsum(0)
    data = torch.frombuffer(bytearray().join(it[1] for it in jpeg), dtype=torch.uint8) if int(offsets[-1]) else \
        torch.empty(0, dtype=torch.uint8)
    ready_index = [b for b, it in enumerate(items) if it[0] == "ready"]
    ready = [items[b][1] for b in ready_index]
    return EncodedBatch(data, offsets, torch.tensor([it[2] for it in jpeg], dtype=torch.int64).view(-1, 2),
                        torch.tensor([it[3] for it in jpeg], dtype=torch.int64).view(-1, 4),
                        torch.tensor([it[4] for it in jpeg], dtype=torch.bool),
                        torch.tensor(ready_index, dtype=torch.int64),
                        torch.stack(ready) if ready else torch.empty(0, 3, size, size, dtype=torch.uint8), tuple(names))


def _cubic(x: Tensor) -> Tensor:
    """The bicubic kernel with a = -0.5 (PIL's, and torch's antialiased bicubic)."""
    a = -0.5
    x = x.abs()
    return torch.where(x < 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                       torch.where(x < 2, (((x - 5) * x + 8) * x - 4) * a, torch.zeros_like(x)))


def resize_matrix(lengths: Tensor, out: int, pad: int, flips: Tensor = None) -> Tensor:
    """Antialiased bicubic resampling of ``n`` signals of ``lengths`` (int64 [n]) samples to ``out``,
    as matrices float32 ``[n, out, pad]`` (columns at and past a signal's length are zero).
    The taps and weights are those of torch's ``interpolate(mode="bicubic", antialias=True)``
    (and PIL's): the support widens with the downscale factor, is cut at the signal's ends, and
    each row is normalised to sum 1. ``flips`` (bool [n]) reverses the output order of those rows."""
    dev = lengths.device
    L = lengths.to(torch.float64)[:, None, None]                     # [n, 1, 1]
    scale = L / out
    support = torch.where(scale >= 1, 2.0 * scale, torch.full_like(scale, 2.0))
    inv = torch.where(scale >= 1, 1.0 / scale, torch.ones_like(scale))
    center = scale * (torch.arange(out, device=dev, dtype=torch.float64)[None, :, None] + 0.5)   # [n, out, 1]
    lo = torch.clamp((center - support + 0.5).trunc(), min=0)
    hi = torch.minimum((center + support + 0.5).trunc(), L)
    x = torch.arange(pad, device=dev, dtype=torch.float64)[None, None, :]                       # [1, 1, pad]
    w = _cubic((x - center + 0.5) * inv) * ((x >= lo) & (x < hi))
    w = w / w.sum(-1, keepdim=True)
    if flips is not None:
        w = torch.where(flips.to(dev)[:, None, None], w.flip(1), w)
    return w.to(torch.float32)


def _chunks(hw: List[tuple], budget: int) -> List[List[int]]:
    """Images grouped, largest crop first, so that each group padded to its largest crop stays under
    ``budget`` elements (3 channels)."""
    order = sorted(range(len(hw)), key=lambda b: -hw[b][0] * hw[b][1])
    groups, cur, mh, mw = [], [], 0, 0
    for b in order:
        h, w = hw[b]
        nh, nw = max(mh, h), max(mw, w)
        if cur and (len(cur) + 1) * 3 * nh * nw > budget:
            groups.append(cur)
            cur, nh, nw = [], h, w
        cur.append(b)
        mh, mw = nh, nw
    if cur:
        groups.append(cur)
    return groups


def crop_resize(images: Sequence[Tensor], boxes: Tensor, flips: Tensor, size: int,
                budget: int = 1 << 25) -> Tensor:
    """Each uint8 ``[3, H_b, W_b]`` image's crop ``boxes[b]`` (top, left, height, width), resized to
    ``size`` (antialiased bicubic) and flipped where ``flips[b]``: uint8 ``[B, 3, size, size]`` on the
    images' device. For the whole batch at once: the crops are gathered from one concatenated
    buffer into a padded float batch (any memory layout: each image is indexed by its dense
    strides; decode_jpeg's CHW and HWC outputs are dense already, so nothing is copied), and
    resized by two batched matrix products (``resize_matrix``: the flip is folded into the
    horizontal one). The same arithmetic runs on CPU tensors (the tests check it there against
    the CPU path, ``crops.resize_crop``). ``budget`` bounds a group's padded elements."""
    B = len(images)
    dev = images[0].device if B else boxes.device
    out = torch.empty(B, 3, size, size, dtype=torch.uint8, device=dev)
    if B == 0:
        return out
    boxes_c = boxes.tolist()
    for group in _chunks([(b[2], b[3]) for b in boxes_c], budget):
        ims = [images[b] for b in group]
        # one flat buffer of the group's images in their own memory order (no per-image copy)
        flat_parts, offs, strides = [], [], []
        base = 0
        for im in ims:
            order = sorted(range(3), key=lambda d: -im.stride(d))
            dense = im.permute(order).contiguous()        # no copy for decode_jpeg's layouts (CHW or HWC)
            st = [0, 0, 0]
            for k, d in enumerate(order):
                st[d] = dense.stride(k)
            flat_parts.append(dense.view(-1))
            offs.append(base)
            strides.append(st)
            base += im.numel()
        flat = torch.cat(flat_parts) if len(flat_parts) > 1 else flat_parts[0]
        bx = torch.tensor([boxes_c[b] for b in group], dtype=torch.int64)
        hp, wp = int(bx[:, 2].max()), int(bx[:, 3].max())
        meta = torch.tensor([[o, *s] for o, s in zip(offs, strides)], dtype=torch.int64).to(dev)
        bx = bx.to(dev)
        y = torch.minimum(torch.arange(hp, device=dev)[None, :], bx[:, 2:3] - 1) + bx[:, 0:1]     # [n, hp]
        x = torch.minimum(torch.arange(wp, device=dev)[None, :], bx[:, 3:4] - 1) + bx[:, 1:2]     # [n, wp]
        c = torch.arange(3, device=dev)[None, :, None, None]
        idx = (meta[:, 0, None, None, None] + c * meta[:, 1, None, None, None]
               + (y * meta[:, 2:3])[:, None, :, None] + (x * meta[:, 3:4])[:, None, None, :])
        crops_f = flat[idx].to(torch.float32)                                  # [n, 3, hp, wp]
        wy = resize_matrix(bx[:, 2], size, hp)                                  # [n, S, hp]
        wx = resize_matrix(bx[:, 3], size, wp, flips[group].to(dev))            # [n, S, wp]
        # columns first, then rows; the intermediate rounded and clamped to 0-255 as PIL and torch's uint8
        # kernel keep it (uint8), so that overshoots near edges clip alike
        tmp = torch.matmul(crops_f, wx.transpose(1, 2)[:, None]).round_().clamp_(0, 255)       # [n, 3, hp, S]
        res = torch.matmul(wy[:, None], tmp)
        out[torch.tensor(group, device=dev)] = res.round_().clamp_(0, 255).to(torch.uint8)
    return out


def _probe_jpeg() -> Tensor:
    """A small JPEG made here (no file), to ask a device whether it decodes."""
    from torchvision.io import encode_jpeg
    g = torch.Generator().manual_seed(0)
    return encode_jpeg((torch.rand(3, 16, 16, generator=g) * 255).to(torch.uint8), quality=90)


def gpu_decode_unavailable(device: torch.device):
    """Why torchvision cannot decode JPEGs on ``device`` (one line), or None when it can."""
    if device.type != "cuda":
        return f"the step runs on {device}, not on a CUDA device"
    if not torch.cuda.is_available():
        return "CUDA is not available to torch"
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
        decode_jpeg([_probe_jpeg()], mode=ImageReadMode.RGB, device=device)
    except Exception as e:  # noqa: BLE001 - a torchvision built without nvJPEG, a driver error, ...
        return f"torchvision cannot decode JPEGs on {device} ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
    return None


def resolve_decode(choice: str, device: torch.device) -> str:
    """``--decode``: "cpu" (the workers decode and crop), "gpu" (the workers read bytes and draw the
    crops; ``GpuDecoder`` decodes on ``device``), or "auto": "gpu" when ``device`` is a CUDA device
    that torchvision decodes JPEGs on, else "cpu". "gpu" where that fails raises ``DataError``."""
    if choice not in DECODE_CHOICES:
        raise DataError(f"--decode {choice}: choose one of {', '.join(DECODE_CHOICES)}")
    if choice == "cpu":
        return "cpu"
    why = gpu_decode_unavailable(torch.device(device))
    if why is None:
        return "gpu"
    if choice == "gpu":
        raise DataError(f"--decode gpu: {why}; use --decode cpu (or auto)")
    return "cpu"


class GpuDecoder:
    """``decoder(encoded) -> uint8 [B, 3, size, size]`` on ``device``: decodes an ``EncodedBatch``
    (batched nvJPEG), then crops, resizes and flips it (``crop_resize``). A JPEG the device cannot
    decode is decoded on the CPU instead (``fallbacks`` counts those images, one warning per file);
    one that no decoder reads (it passed only the worker's header check) becomes a grey image,
    counted in ``failures``, with one warning per file. ``device`` may be the CPU (the tests): then libjpeg-turbo
    decodes and the same arithmetic crops."""

    def __init__(self, device, size: int):
        self.device, self.size = torch.device(device), size
        self.fallbacks, self.failures = 0, 0
        self._warned = set()

    def _warn(self, name: str, what: str) -> None:
        if name not in self._warned:
            self._warned.add(name)
            print(f"greenmim.pretrain: warning: {name}: {what}", file=sys.stderr, flush=True)

    def _decode_cpu(self, buf: Tensor, name: str) -> Tensor:
        try:
            img = crops.decode_full(bytearray(buf.numpy().tobytes()))
        except crops.Unreadable as e:
            self.failures += 1
            self._warn(name, f"no decoder reads it ({e}); a grey image stands in")
            return None
        return img.to(self.device)

    def _device_decode(self, bufs: List[Tensor]) -> List[Tensor]:
        """The device's decode of ``bufs``: one batched nvJPEG call on CUDA (image by image if the
        batch fails, to find the ones that fail: None); libjpeg-turbo on the CPU."""
        from torchvision.io import ImageReadMode, decode_jpeg
        if self.device.type == "cuda":
            try:
                return decode_jpeg(bufs, mode=ImageReadMode.RGB, device=self.device)
            except Exception:  # noqa: BLE001
                pass
        imgs = []
        for buf in bufs:
            try:
                imgs.append(decode_jpeg([buf], mode=ImageReadMode.RGB, device=self.device)[0]
                            if self.device.type == "cuda" else decode_jpeg(buf, mode=ImageReadMode.RGB))
            except Exception:  # noqa: BLE001
                imgs.append(None)
        return imgs

    def _decode(self, bufs: List[Tensor], names: List[str], shapes: List[tuple]) -> List[Tensor]:
        if not bufs:
            return []
        imgs = self._device_decode(bufs)
        out = []
        for img, buf, name, shape in zip(imgs, bufs, names, shapes):
            if img is not None and tuple(img.shape) == (3, *shape):
                out.append(img)
                continue
            img = self._decode_cpu(buf, name)
            if img is not None:
                self.fallbacks += 1
                self._warn(name, f"not decoded on {self.device}; decoded on the CPU instead")
            if img is not None and tuple(img.shape) != (3, *shape):
                self.failures += 1
                self._warn(name, f"decoded as {tuple(img.shape)}, the header said {shape}; a grey image stands in")
                img = None
            out.append(img if img is not None else torch.full((3, *shape), 128, dtype=torch.uint8, device=self.device))
        return out

    def __call__(self, enc: EncodedBatch) -> Tensor:
        B, S = enc.size, self.size
        ready = set(enc.ready_index.tolist())
        todo = [b for b in range(B) if b not in ready]
        offs = enc.offsets.tolist()
        bufs = [enc.data[offs[b]:offs[b + 1]] for b in todo]
        imgs = self._decode(bufs, [enc.names[b] for b in todo], [tuple(enc.shapes[b].tolist()) for b in todo])
        out = torch.empty(B, 3, S, S, dtype=torch.uint8, device=self.device)
        if todo:
            # fp32 products, not TF32: the weights need more than TF32's 10 mantissa bits for
            # results within a level of the CPU path (the global setting is put back after)
            keep = torch.get_float32_matmul_precision()
            torch.set_float32_matmul_precision("highest")
            try:
                sel = torch.tensor(todo, dtype=torch.int64)
                out[sel.to(self.device)] = crop_resize(imgs, enc.boxes[sel], enc.flips[sel], S)
            finally:
                torch.set_float32_matmul_precision(keep)
        if ready:
            out[enc.ready_index.to(self.device)] = enc.ready.to(self.device, non_blocking=True)
        return out
