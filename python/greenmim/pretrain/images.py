"""Where pretraining's images come from: a folder of image files, or the photographs inside
scikit-image's wheel. Both hand out an image's raw form (``raw``: a file's bytes, or a photograph
as a uint8 ``[3, H, W]`` tensor) for the input pipeline (``decode``), and a PIL image (``load``)
for the fixed visualisation images and for the released transform (bench/loader.py's baseline).
"""
from __future__ import annotations

import pathlib
import sys
from typing import List, Sequence, Union

import torch
from torch import Tensor

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
# Photographs inside scikit-image's wheel (no download). The last two are held out of training.
SAMPLE_TRAIN = ("astronaut", "brick", "camera", "cell", "chelsea", "clock", "coins", "grass", "gravel",
                "hubble_deep_field", "immunohistochemistry", "moon", "page", "retina", "text")
SAMPLE_HELD_OUT = ("coffee", "rocket")
SAMPLE_CROPS_PER_EPOCH = 64      # each sample photograph gives this many random crops per epoch
SKIP_LIMIT = 64                  # unreadable images in a row before the run stops

Raw = Union[bytes, bytearray, Tensor]


class DataError(ValueError):
    """Bad data arguments (the command line turns it into one line and exit code 2)."""


class ImageFiles:
    """Images under a folder: an ImageFolder tree (class subfolders, labels ignored) or the
    images directly in it. An image that cannot be read is replaced by the next readable one,
    with a warning naming it (a step never loses a sample); a folder where no image reads
    stops the run."""

    def __init__(self, root: str):
        path = pathlib.Path(root)
        if (path / "train").is_dir():             # the released layout: DATA_PATH/train/<class>/<image>
            path = path / "train"
        if not path.is_dir():
            raise DataError(f"--data_path {root}: no such folder")
        files = sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())
        if not files:
            raise DataError(f"--data_path {root}: no image found (looked for {', '.join(IMAGE_EXTENSIONS)} "
                            f"under {path}, in class subfolders or directly)")
        self.root, self.files = str(path), files
        self._warned = set()
        self._probe()

    def _probe(self, tries: int = 16) -> None:
        """Stops at once when none of a few images spread over the folder reads."""
        from PIL import Image
        why = None
        for i in range(min(tries, len(self.files))):
            f = self.files[(i * len(self.files)) // min(tries, len(self.files))]
            try:
                with Image.open(f) as im:
                    im.load()
                return
            except Exception as e:  # noqa: BLE001
                why = why or f"{f}: {type(e).__name__}: {e}"
        raise DataError(f"--data_path {self.root}: none of {min(tries, len(self.files))} images tried could be read "
                        f"(first: {why})")

    def __len__(self) -> int:
        return len(self.files)

    def name(self, i: int) -> str:
        return str(self.files[i % len(self.files)])

    def raw(self, i: int) -> bytearray:
        """File ``i``'s bytes (writable, so ``torch.frombuffer`` shares them without a copy)."""
        with open(self.files[i % len(self.files)], "rb") as f:
            return bytearray(f.read())

    def warn_unreadable(self, i: int, e: BaseException) -> None:
        """One warning per unreadable file, the first time it is met."""
        f = self.files[i % len(self.files)]
        if f not in self._warned:
            self._warned.add(f)
            print(f"greenmim.pretrain: warning: skipping unreadable image {f} ({type(e).__name__}: {e})",
                  file=sys.stderr, flush=True)

    def give_up(self, i: int):
        return DataError(f"--data_path {self.root}: {min(len(self.files), SKIP_LIMIT)} images in a row could not "
                         f"be read, from {self.files[i % len(self.files)]}")

    def load(self, i: int):
        """The first readable image from ``i`` on, as an RGB PIL image."""
        from PIL import Image
        for k in range(min(len(self.files), SKIP_LIMIT)):
            f = self.files[(i + k) % len(self.files)]
            try:
                with Image.open(f) as im:
                    return im.convert("RGB")      # decodes now, while the file is open
            except Exception as e:                # noqa: BLE001 - any decoder error: skip the file
                self.warn_unreadable(i + k, e)
        raise self.give_up(i)

    def describe(self) -> str:
        return f"{len(self.files)} images under {self.root}"

    def spread(self, count: int) -> List[int]:
        """``count`` indices spread over the folder (the visualisation's fixed images)."""
        return [(i * len(self.files)) // count for i in range(count)]


class SamplePhotographs:
    """The photographs that ship inside scikit-image's wheel, each seen as
    ``SAMPLE_CROPS_PER_EPOCH`` random crops per epoch: a data set that needs no download. They
    are decoded once per process and kept (a few MB)."""

    def __init__(self, names: Sequence[str] = SAMPLE_TRAIN, repeats: int = SAMPLE_CROPS_PER_EPOCH):
        try:
            import skimage.data  # noqa: F401
        except ImportError as e:
            raise DataError("without --data_path the sample photographs of scikit-image are used: "
                            "pip install scikit-image (or give --data_path)") from e
        self.names, self.repeats = tuple(names), repeats
        self._cache = {}

    def __len__(self) -> int:
        return len(self.names) * self.repeats

    def name(self, i: int) -> str:
        return f"skimage.data.{self.names[i % len(self.names)]}"

    def _array(self, i: int):
        import numpy as np
        import skimage.data
        name = self.names[i % len(self.names)]
        if name not in self._cache:
            a = getattr(skimage.data, name)()
            a = np.stack([a] * 3, -1) if a.ndim == 2 else a[..., :3]
            self._cache[name] = np.ascontiguousarray(a.astype(np.uint8))
        return self._cache[name]

    def raw(self, i: int) -> Tensor:
        """The photograph as uint8 ``[3, H, W]`` (a view of the kept ``[H, W, 3]`` array)."""
        return torch.from_numpy(self._array(i)).permute(2, 0, 1)

    def warn_unreadable(self, i: int, e: BaseException) -> None:   # pragma: no cover - they always read
        raise e

    def give_up(self, i: int):   # pragma: no cover
        return DataError(f"sample photograph {self.name(i)} could not be read")

    def load(self, i: int):
        from PIL import Image
        return Image.fromarray(self._array(i))

    def spread(self, count: int) -> List[int]:
        return list(range(min(count, len(self.names))))

    def describe(self) -> str:
        return (f"{len(self.names)} sample photographs of scikit-image x {self.repeats} random crops per epoch "
                f"(no --data_path)")

