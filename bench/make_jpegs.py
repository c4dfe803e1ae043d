#!/usr/bin/env python3
"""Writes an ImageFolder of ImageNet-like JPEGs, for measuring the input pipeline on realistic files.

    python bench/make_jpegs.py DIR [--n 1024] [--classes 8] [--seed 0]

DIR/train/<class>/<name>.JPEG, as ImageNet's train folder is laid out (greenmim.pretrain
--data_path DIR reads it). Each image is a random crop of one of the photographs inside
scikit-image's wheel (no download), resized so that the sizes spread around ImageNet's typical
500x375: the long side is 500 for most, 300 to 640 for the rest; landscape 4:3 most often,
then 3:2, 1:1, 16:9 and portrait. Noise stands in for the grain of a real photograph (smooth
upscaled crops would compress, and decode, faster than photographs do), and the quality is
85 to 95 (about 90, with PIL's default 4:2:0 chroma subsampling). About 5% are single-channel
(greyscale) JPEGs, as ImageNet has some. The files average about 85 KB (ImageNet's: about
110 KB; decode time grows with it).

A DIR that exists and is not empty is refused (exit code 2): nothing is overwritten or mixed.
"""
import argparse
import os
import pathlib
import sys

import numpy as np

COLOUR = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry", "retina")
GREY = ("brick", "camera", "grass", "gravel", "moon", "coins", "clock", "cell")
# (width / height, weight): landscape 4:3 is ImageNet's commonest shape
ASPECTS = ((4 / 3, 0.45), (3 / 2, 0.15), (1.0, 0.12), (16 / 9, 0.08), (3 / 4, 0.15), (2 / 3, 0.05))


def _sources():
    import skimage.data
    out = []
    for name in COLOUR + GREY:
        a = getattr(skimage.data, name)()
        a = np.stack([a] * 3, -1) if a.ndim == 2 else a[..., :3]
        out.append((name, np.ascontiguousarray(a.astype(np.uint8))))
    return out


def _size(rng: np.random.Generator) -> tuple:
    """(width, height) spread around 500x375."""
    ratios, weights = zip(*ASPECTS)
    r = ratios[rng.choice(len(ratios), p=np.array(weights) / sum(weights))]
    long = 500 if rng.random() < 0.7 else int(rng.integers(300, 641))
    return (long, max(1, round(long / r))) if r >= 1 else (max(1, round(long * r)), long)


def make_image(src: np.ndarray, rng: np.random.Generator):
    """One ImageNet-like PIL image from a source photograph (random crop, resize, flip, noise)."""
    from PIL import Image
    w, h = _size(rng)
    H, W = src.shape[:2]
    # the largest crop of the target's aspect that fits, scaled by sqrt(area fraction 0.35-1)
    ar = w / h
    cw, ch = (W, W / ar) if W / ar <= H else (H * ar, H)
    f = float(np.sqrt(rng.uniform(0.35, 1.0)))
    cw, ch = max(8, int(cw * f)), max(8, int(ch * f))
    x0, y0 = int(rng.integers(0, W - cw + 1)), int(rng.integers(0, H - ch + 1))
    im = Image.fromarray(src[y0:y0 + ch, x0:x0 + cw]).resize((w, h), Image.Resampling.BICUBIC)
    if rng.random() < 0.5:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    a = np.asarray(im, dtype=np.float32)
    a = a * rng.uniform(0.85, 1.15) + rng.uniform(-12, 12)            # exposure
    a += rng.normal(0.0, 11.0, size=a.shape[:2] + (1,)) + rng.normal(0.0, 5.0, size=a.shape)   # grain
    return Image.fromarray(np.clip(a + 0.5, 0, 255).astype(np.uint8))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--n", type=int, default=1024, help="number of images (default 1024)")
    ap.add_argument("--classes", type=int, default=8, help="class folders (default 8)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.n < 1 or a.classes < 1:
        print(f"make_jpegs: --n and --classes must be at least 1 (got {a.n}, {a.classes})", file=sys.stderr)
        return 2
    root = pathlib.Path(a.dir)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        print(f"make_jpegs: {root} exists and is not an empty folder; give a new or empty one", file=sys.stderr)
        return 2
    try:
        import skimage.data  # noqa: F401
    except ImportError:
        print("make_jpegs: needs scikit-image (pip install -r python/requirements.txt)", file=sys.stderr)
        return 2
    from PIL import Image  # noqa: F401
    rng = np.random.default_rng(a.seed)
    sources = _sources()
    train = root / "train"
    total = 0
    for c in range(a.classes):
        (train / f"n{c:08d}").mkdir(parents=True, exist_ok=True)
    for i in range(a.n):
        name, src = sources[int(rng.integers(len(sources)))]
        im = make_image(src, rng)
        if rng.random() < 0.05:
            im = im.convert("L")                                          # a greyscale JPEG
        path = train / f"n{i % a.classes:08d}" / f"n{i % a.classes:08d}_{i:06d}.JPEG"
        tmp = path.with_suffix(".tmp")
        im.save(tmp, "JPEG", quality=int(rng.integers(85, 96)))
        os.replace(tmp, path)                                             # never a half-written image
        total += path.stat().st_size
    print(f"make_jpegs: {a.n} JPEGs in {a.classes} classes under {train} ({total / a.n / 1024:.0f} KB on average)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
