"""The random crop and flip of pretraining, and the CPU path that makes them.

The crop is torchvision's ``RandomResizedCrop(scale=(0.2, 1), ratio=(3/4, 4/3))`` followed by
``RandomHorizontalFlip()``, the released augmentation. ``draw_crop`` and ``draw_flip`` make the
same draws, in the same order, as those transforms' ``get_params`` and ``forward``, from an
explicit generator instead of torch's global one: seeded like the global generator, they give the
same boxes and flips (tests/test_loader.py checks both that and the distribution).

The CPU path (``crop_one``) decodes a JPEG with libjpeg-turbo straight into a tensor
(``torchvision.io.decode_jpeg``), crops it (a view), and resizes the crop with torch's uint8
antialiased bicubic (the filter PIL uses), then flips it. Where the crop is at least twice the
output size on both sides, the decoder's DCT scaling does part of the shrinking (PIL's ``draft``,
1/2, 1/4 or 1/8: the crop stays at least the output size, so nothing is upsampled). At ImageNet
sizes that is rare (halving a 500x375 image leaves a short side under 224); on large photographs
it skips most of the decode. Files that are not JPEGs (PNG, ...) or that libjpeg-turbo refuses
(CMYK, ...) go through PIL; files PIL cannot read either raise ``Unreadable``.
"""
from __future__ import annotations

import functools
import io
import math
from typing import Optional, Tuple

import torch
from torch import Tensor

SCALE = (0.2, 1.0)
RATIO = (3.0 / 4.0, 4.0 / 3.0)
Box = Tuple[int, int, int, int]          # (top, left, height, width), as torchvision's (i, j, h, w)


class Unreadable(Exception):
    """An image that no decoder here can read (the caller skips it with a warning)."""


def draw_crop(g: torch.Generator, height: int, width: int, scale=SCALE, ratio=RATIO) -> Box:
    """``RandomResizedCrop.get_params`` with generator ``g``: up to 10 tries of an area fraction
    uniform in ``scale`` and a log-uniform aspect ratio in ``ratio``, a uniform position, else the
    central crop clamped to ``ratio``."""
    area = height * width
    lo, hi = _log_ratio(tuple(ratio))
    u = torch.empty(1)
    for _ in range(10):
        target_area = area * u.uniform_(scale[0], scale[1], generator=g).item()
        aspect_ratio = u.uniform_(lo, hi, generator=g).exp_().item()         # float32 exp, as torch.exp
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = torch.randint(0, height - h + 1, size=(1,), generator=g).item()
            j = torch.randint(0, width - w + 1, size=(1,), generator=g).item()
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


@functools.lru_cache(maxsize=8)
def _log_ratio(ratio: tuple) -> Tuple[float, float]:
    """torchvision's ``torch.log(torch.tensor(ratio))`` (float32), as exact Python floats."""
    r = torch.log(torch.tensor(ratio))
    return float(r[0]), float(r[1])


def draw_flip(g: torch.Generator) -> bool:
    """``RandomHorizontalFlip(0.5)``'s draw with generator ``g``."""
    return bool(torch.rand(1, generator=g) < 0.5)


_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}       # start-of-frame markers (not DHT, JPG, DAC)


def jpeg_info(buf) -> Optional[Tuple[int, int, int]]:
    """(height, width, components) from a JPEG's frame header, or None when ``buf`` is not a
    JPEG or its header cannot be parsed (then a full decoder decides)."""
    n = len(buf)
    if n < 4 or buf[0] != 0xFF or buf[1] != 0xD8:
        return None
    i = 2
    while i + 4 <= n:
        if buf[i] != 0xFF:
            return None
        m = buf[i + 1]
        if m == 0xFF:                                  # fill byte
            i += 1
            continue
        if m == 0x01 or 0xD0 <= m <= 0xD8:              # markers without a length
            i += 2
            continue
        if m in (0xD9, 0xDA):                          # end of image, or scan data before any frame
            return None
        if m in _SOF:
            if i + 10 > n:
                return None
            h, w = (buf[i + 5] << 8) | buf[i + 6], (buf[i + 7] << 8) | buf[i + 8]
            return (h, w, buf[i + 9]) if h > 0 and w > 0 else None
        i += 2 + ((buf[i + 2] << 8) | buf[i + 3])
    return None


def jpeg_complete(buf) -> bool:
    """The file ends with its end-of-image marker (a truncated download does not). In entropy-coded
    data 0xFF is always followed by 0x00 or a restart marker, so FF D9 near the end is the EOI."""
    return bytes(buf[-4096:]).rfind(b"\xff\xd9") != -1


def decode_pil(buf) -> Tensor:
    """Any format PIL reads, as RGB uint8 ``[3, H, W]``; ``Unreadable`` if it cannot."""
    from PIL import Image
    import numpy as np
    try:
        with Image.open(io.BytesIO(buf)) as im:
            a = np.array(im.convert("RGB"))
    except Exception as e:  # noqa: BLE001 - any decoder error
        raise Unreadable(f"{type(e).__name__}: {e}") from e
    return torch.from_numpy(a).permute(2, 0, 1)


def decode_full(buf) -> Tensor:
    """A whole image as RGB uint8 ``[3, H, W]``: libjpeg-turbo for JPEGs, PIL for the rest and for
    JPEGs libjpeg-turbo refuses. Raises ``Unreadable``."""
    if len(buf) >= 3 and buf[0] == 0xFF and buf[1] == 0xD8:
        from torchvision.io import ImageReadMode, decode_jpeg
        try:
            return decode_jpeg(torch.frombuffer(buf, dtype=torch.uint8), mode=ImageReadMode.RGB)
        except (RuntimeError, ValueError):
            pass                                       # PIL decides (and names the error if it fails too)
    return decode_pil(buf)


def resize_crop(img: Tensor, box: Box, flip: bool, size: int) -> Tensor:
    """Crop ``box`` of uint8 ``[3, H, W]`` resized to ``[3, size, size]`` (antialiased bicubic, torch's
    uint8 kernel: PIL's filter), flipped left-right if ``flip``."""
    i, j, h, w = box
    crop = img[None, :, i:i + h, j:j + w]
    out = torch.nn.functional.interpolate(crop, size=(size, size), mode="bicubic", align_corners=False,
                                          antialias=True)[0]
    return out.flip(-1) if flip else out


def dct_scale(box: Box, size: int) -> int:
    """The largest DCT scaling (8, 4, 2, else 1) after which the crop is still at least ``size``
    on both sides."""
    _, _, h, w = box
    for s in (8, 4, 2):
        if h >= s * size and w >= s * size:
            return s
    return 1


def crop_dct(buf, shape: Tuple[int, int], box: Box, flip: bool, size: int, scale: int) -> Tensor:
    """The DCT-scaled path: PIL decodes at 1/``scale`` (libjpeg-turbo's scaled IDCT) and resizes the
    crop, given in full-size pixels, by its fractional box."""
    from PIL import Image
    import numpy as np
    H, W = shape
    i, j, h, w = box
    try:
        with Image.open(io.BytesIO(buf)) as im:
            im.draft("RGB", (W // scale, H // scale))
            sw, sh = im.size
            s = next((s for s in (8, 4, 2, 1) if -(-W // s) == sw and -(-H // s) == sh), None)
            if s is None:
                raise Unreadable(f"draft size {sw}x{sh} of a {W}x{H} JPEG")
            im = im.convert("RGB") if im.mode != "RGB" else im
            im = im.resize((size, size), Image.Resampling.BICUBIC, box=(j / s, i / s, (j + w) / s, (i + h) / s))
            if flip:
                im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            a = np.array(im)
    except Unreadable:
        raise
    except Exception as e:  # noqa: BLE001
        raise Unreadable(f"{type(e).__name__}: {e}") from e
    return torch.from_numpy(a).permute(2, 0, 1)


def crop_one(raw, g: torch.Generator, size: int, dct: bool = True) -> Tensor:
    """One image's random crop, uint8 ``[3, size, size]``: ``raw`` is a file's bytes or an RGB
    uint8 ``[3, H, W]`` tensor (the sample photographs). Draws the box and flip from ``g`` once the
    image's size is known (from the JPEG header, before decoding, so that the DCT scaling can be
    chosen). Raises ``Unreadable``; the caller then restores ``g``'s state and skips the file."""
    if isinstance(raw, Tensor):
        img = raw
    else:
        info = jpeg_info(raw)
        if info is not None:
            H, W = info[0], info[1]
            box, flip = draw_crop(g, H, W), draw_flip(g)
            s = dct_scale(box, size) if dct else 1
            if s > 1:
                return crop_dct(raw, (H, W), box, flip, size, s)
            img = decode_full(raw)
            if tuple(img.shape[-2:]) != (H, W):
                raise Unreadable(f"the header says {W}x{H}, the decoder gave {img.shape[-1]}x{img.shape[-2]}")
            return resize_crop(img, box, flip, size)
        img = decode_full(raw)
    box, flip = draw_crop(g, int(img.shape[-2]), int(img.shape[-1])), draw_flip(g)
    return resize_crop(img, box, flip, size)
