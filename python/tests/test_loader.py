"""The input pipeline: the crop draws against torchvision's, the CPU path against the released PIL
path, the GPU path's batched crop/resize arithmetic against the CPU path (run on CPU tensors),
bad files (skipped once with a warning; refused by the device decoder: decoded on the CPU and
counted), ``decode.resolve_decode`` and bench/make_jpegs.py."""
import importlib.util
import io
import math
import pathlib
import pickle

import numpy as np
import pytest
import torch

pytest.importorskip("torchvision")
skimage_data = pytest.importorskip("skimage.data")
from PIL import Image  # noqa: E402

from greenmim.pretrain import crops, data, decode  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket")


def _jpeg(a, **kw) -> bytearray:
    im = a if isinstance(a, Image.Image) else Image.fromarray(a)
    b = io.BytesIO()
    im.save(b, "JPEG", **{"quality": 90, **kw})
    return bytearray(b.getvalue())


def _photo(name):
    return getattr(skimage_data, name)()


def _ks(a, b) -> float:
    """Two-sample Kolmogorov-Smirnov statistic."""
    a = torch.sort(torch.as_tensor(a, dtype=torch.float64))[0]
    b = torch.sort(torch.as_tensor(b, dtype=torch.float64))[0]
    x = torch.cat([a, b])
    fa = torch.searchsorted(a, x, right=True).double() / len(a)
    fb = torch.searchsorted(b, x, right=True).double() / len(b)
    return float((fa - fb).abs().max())


def _ks_bound(n, m, alpha=1e-3) -> float:
    """The two-sample KS critical value at level ``alpha`` (asymptotic: c(alpha) sqrt((n+m)/(nm)))."""
    return math.sqrt(-0.5 * math.log(alpha / 2)) * math.sqrt((n + m) / (n * m))


# (height, width): ImageNet's commonest, portrait, tiny, and shapes so thin that 10 tries fail (central crop)
SHAPES = ((375, 500), (500, 333), (97, 301), (10, 1000), (1000, 12), (224, 224), (1, 1))


def test_draws_equal_torchvision_s_under_the_same_seed():
    """draw_crop/draw_flip from a generator seeded s = RandomResizedCrop.get_params then
    RandomHorizontalFlip's draw from torch's global generator seeded s: the same boxes, flips and
    stream position (three images in a row), including the central-crop fallback."""
    from torchvision import transforms as T
    for seed in range(60):
        shapes = [SHAPES[(seed + k) % len(SHAPES)] for k in range(3)]
        torch.manual_seed(seed)
        ref = [(tuple(T.RandomResizedCrop.get_params(torch.empty(1, h, w), [0.2, 1.0], [3 / 4, 4 / 3])),
                bool(torch.rand(1) < 0.5)) for h, w in shapes]
        g = torch.Generator().manual_seed(seed)
        got = [(crops.draw_crop(g, h, w), crops.draw_flip(g)) for h, w in shapes]
        assert got == ref, (seed, shapes)
        for (i, j, h, w), _ in got:
            H, W = shapes[got.index(((i, j, h, w), _))]
            assert 0 <= i and 0 <= j and 0 < h and 0 < w and i + h <= H and j + w <= W


def test_crop_distribution_matches_random_resized_crop():
    """Independent draws (different seeds) of ours and torchvision's: the area fraction, the log
    aspect ratio and the relative position pass a two-sample KS test at level 1e-3 (bound from the
    sample sizes); the same test rejects a crop drawn with scale (0.3, 1), so it has the power to see a
    wrong range."""
    from torchvision import transforms as T
    n, H, W = 1500, 375, 500
    ours, ref, wrong = [], [], []
    for s in range(n):
        g = torch.Generator().manual_seed(s)
        ours.append(crops.draw_crop(g, H, W))
        g = torch.Generator().manual_seed(10 ** 6 + s)
        wrong.append(crops.draw_crop(g, H, W, scale=(0.3, 1.0)))
        torch.manual_seed(2 * 10 ** 6 + s)
        ref.append(tuple(T.RandomResizedCrop.get_params(torch.empty(1, H, W), [0.2, 1.0], [3 / 4, 4 / 3])))

    def stats(boxes):
        b = torch.tensor(boxes, dtype=torch.float64)
        return {"area": b[:, 2] * b[:, 3] / (H * W), "log_ratio": torch.log(b[:, 3] / b[:, 2]),
                "top": b[:, 0] / (H - b[:, 2] + 1), "left": b[:, 1] / (W - b[:, 3] + 1)}

    so, sr, sw = stats(ours), stats(ref), stats(wrong)
    bound = _ks_bound(n, n)
    for k in so:
        assert _ks(so[k], sr[k]) < bound, (k, _ks(so[k], sr[k]), bound)
    assert _ks(sw["area"], sr["area"]) > bound
    assert so["area"].min() >= 0.2 - 0.01 and so["area"].max() <= 1.0
    assert so["log_ratio"].abs().max() <= math.log(4 / 3) + 0.02


def test_cpu_path_is_the_released_crop_on_tensors():
    """crops.crop_one (libjpeg-turbo, uint8 tensor resize) against data.train_crops (PIL decode,
    RandomResizedCrop bicubic, flip) under the same seed: the decoders agree bit for bit and the
    box and flip are the same, so the pixels differ only by the two uint8 resize kernels'
    fixed-point rounding and pass order. Bound: mean |difference| under 0.5 level per image, none over 16 (measured
    0.002-0.15 and at most 7 on these photographs: the larger ones where one side is upsampled).
    Crops are uint8 [3, S, S]."""
    tf = data.train_crops(224)
    for k, name in enumerate(PHOTOS):
        buf = _jpeg(_photo(name))
        pil = torch.from_numpy(np.array(Image.open(io.BytesIO(buf)).convert("RGB"))).permute(2, 0, 1)
        assert torch.equal(crops.decode_full(buf), pil)                   # the decoders agree
        for seed in range(4):
            torch.manual_seed(100 * k + seed)
            ref = tf(Image.open(io.BytesIO(buf)).convert("RGB"))
            got = crops.crop_one(buf, torch.Generator().manual_seed(100 * k + seed), 224, dct=False)
            assert got.dtype == torch.uint8 and got.shape == (3, 224, 224)
            d = (got.int() - ref.int()).abs()
            assert d.float().mean() < 0.5 and d.max() <= 16, (name, seed, float(d.float().mean()), int(d.max()))


def test_dct_scaling_only_where_the_crop_allows_and_close_to_full_decode():
    """DCT scaling is chosen only when the scaled crop is still at least the output size; its
    crops stay close to the full decode's (a different but proper low-pass: mean |difference|
    under 1.5 levels; measured 0.27-0.49 on the retina photograph)."""
    assert crops.dct_scale((0, 0, 375, 500), 224) == 1
    assert crops.dct_scale((0, 0, 448, 448), 224) == 2 and crops.dct_scale((0, 0, 447, 900), 224) == 1
    assert crops.dct_scale((0, 0, 1800, 1792), 224) == 8
    buf = _jpeg(_photo("retina"))                         # 1411 x 1411: scales 2 and 4 reachable
    seen = set()
    for seed in range(8):
        g = torch.Generator().manual_seed(seed)
        box = crops.draw_crop(g, 1411, 1411)
        seen.add(crops.dct_scale(box, 224))
        scaled = crops.crop_one(buf, torch.Generator().manual_seed(seed), 224)
        full = crops.crop_one(buf, torch.Generator().manual_seed(seed), 224, dct=False)
        d = (scaled.int() - full.int()).abs().float()
        assert d.mean() < 1.5, (seed, box, float(d.mean()))
    assert seen >= {2}, seen


def _random_image(g, h, w, layout):
    img = (torch.rand(h, w, 3, generator=g) * 255).to(torch.uint8)
    smooth = torch.nn.functional.avg_pool2d(img.permute(2, 0, 1)[None].float(), 5, 1, 2)[0].to(torch.uint8)
    if layout == "view":                                   # not dense: a window of a larger image
        big = torch.zeros(3, h + 9, w + 5, dtype=torch.uint8)
        big[:, 4:4 + h, 2:2 + w] = smooth
        return big[:, 4:4 + h, 2:2 + w]
    return smooth.permute(1, 2, 0).permute(2, 0, 1) if layout == "hwc" else smooth.contiguous()


def test_batched_crop_resize_arithmetic_matches_the_cpu_path():
    """decode.crop_resize (the GPU path's arithmetic, here on CPU tensors) against
    crops.resize_crop image by image: random sizes, boxes (down- and upscaling, whole image,
    1-pixel crops), flips, both memory layouts decode_jpeg produces and a strided view, and a small budget that
    splits the batch into groups. Bound: at most 2 levels, mean under 0.02: both are the same
    separable bicubic (a = -0.5) with the same taps and a uint8-rounded intermediate; torch's
    uint8 kernel quantises its weights to fixed point, so a pixel near a rounding edge may land one
    level off after the first pass and carry that into the second."""
    g = torch.Generator().manual_seed(0)
    imgs, boxes, flips = [], [], []
    for b in range(12):
        h, w = int(torch.randint(20, 400, (1,), generator=g)), int(torch.randint(20, 400, (1,), generator=g))
        imgs.append(_random_image(g, h, w, ("chw", "hwc", "view")[b % 3]))
        box = crops.draw_crop(g, h, w) if b % 4 else ((0, 0, h, w) if b % 8 else (h // 2, w // 3, 1, 1))
        boxes.append(box)
        flips.append(bool(b % 3 == 0))
    for size, budget in ((64, 1 << 25), (37, 3 * 120 * 120)):
        got = decode.crop_resize(imgs, torch.tensor(boxes), torch.tensor(flips), size, budget=budget)
        assert got.shape == (12, 3, size, size) and got.dtype == torch.uint8
        for b in range(12):
            ref = crops.resize_crop(imgs[b], boxes[b], flips[b], size)
            d = (got[b].int() - ref.int()).abs()
            assert d.max() <= 2 and d.float().mean() < 0.02, (size, b, boxes[b], int(d.max()), float(d.float().mean()))


def test_resize_matrix_rows_are_normalised_and_local():
    L = torch.tensor([7, 224, 500, 1])
    w = decode.resize_matrix(L, 224, 600)
    torch.testing.assert_close(w.sum(-1), torch.ones(4, 224))
    for k, n in enumerate(L.tolist()):
        assert float(w[k, :, n:].abs().max()) == 0.0                     # nothing from past the crop
    eye = decode.resize_matrix(torch.tensor([224]), 224, 224)[0]        # same size: the identity
    torch.testing.assert_close(eye, torch.eye(224), atol=1e-6, rtol=0)
    flipped = decode.resize_matrix(torch.tensor([100]), 50, 100, torch.tensor([True]))[0]
    torch.testing.assert_close(flipped, decode.resize_matrix(torch.tensor([100]), 50, 100)[0].flip(0))


def _folder(tmp_path):
    """An ImageFolder with every kind of file the loader meets: RGB, greyscale, CMYK, progressive
    and large JPEGs, a PNG, a truncated JPEG and a file that is no image."""
    d = tmp_path / "train" / "n0"
    d.mkdir(parents=True)
    ast = _photo("astronaut")
    (d / "a_rgb.JPEG").write_bytes(_jpeg(_photo("chelsea")))
    (d / "b_grey.JPEG").write_bytes(_jpeg(Image.fromarray(ast).convert("L")))
    (d / "c_cmyk.JPEG").write_bytes(_jpeg(Image.fromarray(ast).convert("CMYK")))
    (d / "d_progressive.JPEG").write_bytes(_jpeg(_photo("coffee"), progressive=True))
    (d / "e_large.JPEG").write_bytes(_jpeg(_photo("retina")))
    Image.fromarray(_photo("rocket")).save(d / "f_png.png")
    full = _jpeg(ast)
    (d / "g_truncated.JPEG").write_bytes(full[:len(full) // 2])
    (d / "h_garbage.JPEG").write_bytes(b"\xff\xd8\xff not an image")
    return tmp_path


class _NoPlan:
    """A Geometry stand-in: the tests here are about images, not masks (no compiled library)."""
    grid = 2

    def plan(self, masks, batch=None):
        return None


def test_bad_files_skipped_once_with_a_warning_on_both_paths(tmp_path, capfd):
    """A truncated JPEG and a file that is no image are replaced by the next readable file, with
    one warning each however often they are met; their draws are undone, so the batch equals one
    made without them. CMYK, greyscale, progressive, large JPEGs and PNGs all crop. The GPU path's
    workers skip the same files, and draw the same boxes and flips as the CPU path."""
    images = data.ImageFiles(str(_folder(tmp_path)))
    assert len(images) == 8
    cpu = data.MicroBatches(images, 64, _NoPlan(), 0.75, False, 3)
    gpu = data.MicroBatches(images, 64, _NoPlan(), 0.75, False, 3, decode="gpu")
    idx = [6, 0, 1, 2, 3, 4, 5, 7, 6]                 # 6, 7: truncated and garbage, met twice: next readable
    item = (0, 1, 0, idx)
    x = cpu[item][0]
    err = capfd.readouterr().err
    assert err.count("skipping unreadable image") == 2, err
    assert "g_truncated" in err and "h_garbage" in err
    assert x.shape == (9, 3, 64, 64) and x.dtype == torch.uint8
    g = torch.Generator().manual_seed(data.derive_seed(3, 0, 1, 0))
    clean = [0, 0, 1, 2, 3, 4, 5, 0, 0]               # what the skips resolve to, drawn in that order
    ref = torch.stack([crops.crop_one(images.raw(i), g, 64) for i in clean])
    assert torch.equal(x, ref)
    assert torch.equal(cpu[item][0], x)                # deterministic, and no second warning
    enc = pickle.loads(pickle.dumps(gpu[item][0]))     # what a worker sends
    assert capfd.readouterr().err.count("warning") == 0
    assert isinstance(enc, decode.EncodedBatch) and enc.size == 9
    assert sorted(enc.ready_index.tolist()) == [3, 6]  # the CMYK JPEG and the PNG: cropped in the worker
    g = torch.Generator().manual_seed(data.derive_seed(3, 0, 1, 0))
    for b, i in enumerate(clean):
        raw = images.raw(i)
        info = crops.jpeg_info(raw)
        if b in (3, 6):
            assert torch.equal(enc.ready[enc.ready_index.tolist().index(b)], crops.crop_one(raw, g, 64))
            continue
        assert tuple(enc.shapes[b].tolist()) == info[:2]
        assert tuple(enc.boxes[b].tolist()) == crops.draw_crop(g, *info[:2])
        assert bool(enc.flips[b]) == crops.draw_flip(g)
        assert bytes(enc.data[enc.offsets[b]:enc.offsets[b + 1]].numpy()) == bytes(raw)
    out = decode.GpuDecoder("cpu", 64)(enc)          # the device path's arithmetic, on the CPU
    nodct = torch.stack([crops.crop_one(images.raw(i), g2, 64, dct=False)
                         for g2 in [torch.Generator().manual_seed(data.derive_seed(3, 0, 1, 0))] for i in clean])
    decoded = [b for b in range(9) if b not in (3, 6)]  # the worker's crops (DCT-scaled where allowed) pass as made
    assert torch.equal(out[[3, 6]], enc.ready[enc.ready_index.argsort()])
    d = (out[decoded].int() - nodct[decoded].int()).abs()
    assert d.max() <= 2 and d.float().mean() < 0.02, (int(d.max()), float(d.float().mean()))


def test_gpu_decoder_falls_back_to_the_cpu_and_counts(tmp_path, capfd, monkeypatch):
    """An image the device decoder refuses is decoded on the CPU (same pixels), counted in
    ``fallbacks`` with one warning; a JPEG whose header passes but that no decoder reads becomes
    grey, counted in ``failures``."""
    bufs = [_jpeg(_photo(n)) for n in PHOTOS[:3]]
    bad = bytearray(bufs[0][:600]) + bytearray(b"\x00" * 4000) + bytearray(b"\xff\xd9")   # header fine, data not
    g = torch.Generator().manual_seed(0)
    items = [decode.plan_one(b, g, 48) for b in bufs + [bad]]
    assert all(it[0] == "jpeg" for it in items)
    enc = decode.encode_batch(items, ["p0", "p1", "p2", "bad"], 48)
    clean = decode.GpuDecoder("cpu", 48)
    ref = clean(enc)
    assert clean.failures == 1 and clean.fallbacks == 0        # "bad": not by the device, not by the CPU
    assert torch.all(ref[3] == 128)
    capfd.readouterr()
    dec = decode.GpuDecoder("cpu", 48)
    real = dec._device_decode
    monkeypatch.setattr(dec, "_device_decode", lambda bs: [None if k == 1 else im for k, im in enumerate(real(bs))])
    got = dec(enc)
    dec(enc)
    assert dec.fallbacks == 2 and dec.failures == 2             # two calls: image 1 by the CPU, 3 by none
    assert torch.equal(got, ref)
    err = capfd.readouterr().err
    assert err.count("p1: not decoded on cpu; decoded on the CPU instead") == 1, err
    assert err.count("bad: no decoder reads it") == 1, err



def test_resolve_decode():
    assert decode.resolve_decode("cpu", torch.device("cpu")) == "cpu"
    assert decode.resolve_decode("auto", torch.device("cpu")) == "cpu"
    with pytest.raises(data.DataError,
                       match=r"^--decode gpu: the step runs on cpu, not on a CUDA device; use --decode cpu"):
        decode.resolve_decode("gpu", torch.device("cpu"))
    with pytest.raises(data.DataError, match="choose one of auto, cpu, gpu"):
        decode.resolve_decode("nvjpeg", torch.device("cpu"))
    with pytest.raises(data.DataError, match="decode must be 'cpu' or 'gpu'"):
        data.MicroBatches(data.SamplePhotographs(), 32, _NoPlan(), 0.75, False, 0, decode="auto")
    if torch.cuda.is_available():
        assert decode.resolve_decode("auto", torch.device("cuda")) in ("gpu", "cpu")


def test_sample_photographs_crop_as_before():
    """Without --data_path: the photographs (tensors, no decode) crop through the same draws."""
    photos = data.SamplePhotographs(repeats=1)
    ds = data.MicroBatches(photos, 32, _NoPlan(), 0.75, False, 0)
    x = ds[(0, 0, 0, [0, 4, 13])][0]
    g = torch.Generator().manual_seed(data.derive_seed(0, 0, 0, 0))
    for k, i in enumerate((0, 4, 13)):
        raw = photos.raw(i)
        box, flip = crops.draw_crop(g, raw.shape[1], raw.shape[2]), crops.draw_flip(g)
        assert torch.equal(x[k], crops.resize_crop(raw, box, flip, 32))
    enc = data.MicroBatches(photos, 32, _NoPlan(), 0.75, False, 0, decode="gpu")[(0, 0, 0, [0, 4, 13])][0]
    assert enc.ready_index.tolist() == [0, 1, 2] and torch.equal(enc.ready, x)


def _make_jpegs():
    spec = importlib.util.spec_from_file_location("make_jpegs", ROOT / "bench" / "make_jpegs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_make_jpegs(tmp_path, capsys):
    """An ImageFolder of JPEGs around 500x375 at quality about 90, in class folders, that the
    loader reads; a folder that is not empty is refused in one line with exit code 2."""
    mk = _make_jpegs()
    out = tmp_path / "jpegs"
    assert mk.main([str(out), "--n", "24", "--classes", "3"]) == 0
    files = sorted((out / "train").rglob("*.JPEG"))
    assert len(files) == 24 and len({f.parent.name for f in files}) == 3
    sizes = [Image.open(f).size for f in files]
    assert all(300 <= max(s) <= 640 and min(s) >= 150 for s in sizes), sizes
    assert sum(max(s) == 500 for s in sizes) >= 8                       # most have a long side of 500
    q = Image.open(files[0]).quantization                               # quality ~90: small luma steps
    assert max(q[0]) < 20
    assert len(data.ImageFiles(str(out))) == 24
    capsys.readouterr()
    assert mk.main([str(out), "--n", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not an empty folder" in err
    (tmp_path / "file").write_text("x")
    assert mk.main([str(tmp_path / "file")]) == 2
    assert len(sorted((out / "train").rglob("*.JPEG"))) == 24          # nothing written by the refusals


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the nvJPEG decode is unverified here")
def test_gpu_decoder_on_cuda_matches_the_cpu_path():
    """On a CUDA device: ``resolve_decode("auto")`` picks "gpu", and the decoder's crops are close
    to the CPU path's under the same draws. nvJPEG's IDCT and chroma upsampling are not
    libjpeg-turbo's, so the decoded pixels themselves may differ by a few levels; the bound
    (mean |difference| under 1.5 levels) has not yet met a device."""
    dev = torch.device("cuda")
    assert decode.resolve_decode("auto", dev) == "gpu"
    bufs = [_jpeg(_photo(n)) for n in PHOTOS] + [_jpeg(Image.fromarray(_photo("astronaut")).convert("L"))]
    g = torch.Generator().manual_seed(0)
    enc = decode.encode_batch([decode.plan_one(b, g, 224) for b in bufs], [str(k) for k in range(len(bufs))], 224)
    dec = decode.GpuDecoder(dev, 224)
    got = dec(enc)
    assert got.device.type == "cuda" and got.shape == (len(bufs), 3, 224, 224) and dec.fallbacks == 0
    g = torch.Generator().manual_seed(0)
    ref = torch.stack([crops.crop_one(b, g, 224, dct=False) for b in bufs])
    d = (got.cpu().int() - ref.int()).abs().float()
    assert d.mean() < 1.5, float(d.mean())


def test_items_do_not_depend_on_the_workers(tmp_path):
    """Both paths' micro-batches through a DataLoader with 2 workers (the EncodedBatch crossing the
    process boundary in shared memory) equal the ones made in this process."""
    images = data.ImageFiles(str(_folder(tmp_path)))
    sampler = data.StepSampler(len(images), 3, 1, 1, 0, seed=5, end=4)
    items = list(sampler)
    for mode in ("cpu", "gpu"):
        ds = data.MicroBatches(images, 32, _NoPlan(), 0.75, True, 5, decode=mode)
        here = [ds[it][0] for it in items]
        there = [x[0] for x in data.make_loader(ds, sampler, 2, pin_memory=False)]
        assert len(there) == len(here) == 4
        for a, b in zip(here, there):
            if mode == "cpu":
                assert torch.equal(a, b)
            else:
                assert all(torch.equal(u, v) for u, v in zip(a[:-1], b[:-1])) and tuple(a.names) == tuple(b.names)


def test_loader_bench_json(tmp_path, capsys):
    """bench/loader.py --json: the last line is one JSON object with the per-worker rate of both
    pipelines, their split by part and the GPU path's worker rate (nano model, 4 JPEGs a batch)."""
    import json
    spec = importlib.util.spec_from_file_location("loader_bench", ROOT / "bench" / "loader.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--data_path", str(_folder(tmp_path)), "--model", "green_mim_swin_nano_patch4_dec128b1",
                     "--batch", "4", "--reps", "2", "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for k in ("images_per_s_per_worker", "baseline_images_per_s_per_worker", "speedup",
              "gpu_decode_worker_images_per_s_per_worker"):
        assert res[k] > 0, k
    assert {"read", "decode", "crop/resize", "flip", "collate", "plan"} <= set(res["split_ms_per_batch"])
    assert mod.main(["--data_path", str(tmp_path / "none")]) == 2
    ds_gpu = data.MicroBatches(data.ImageFiles(str(tmp_path)), 32, _NoPlan(), 0.75, False, 0, decode="gpu")
    r = mod._time_gpu_decode(ds_gpu, 8, 4, 2, "cpu")   # --gpu_decode's timing, run on the CPU here
    assert r["ms_per_batch"] > 0 and r["failures"] == 0 and r["device"] == "cpu"
    if not torch.cuda.is_available():                 # the device's part needs CUDA: one line, exit code 2
        capsys.readouterr()
        assert mod.main(["--gpu_decode"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("loader: --decode gpu:"), err


def test_the_trainer_runs_the_device_decode_path(tmp_path, monkeypatch):
    """``--decode gpu`` wired through the trainer: the workers ship encoded batches, the step
    decodes them (here GpuDecoder on the CPU, standing in for the CUDA device, which this
    machine lacks), and the run's losses stay within the two paths' pixel tolerance of the CPU
    path's, step by step (the same crops from the same seeds)."""
    from greenmim.pretrain import cli, engine
    mk = _make_jpegs()
    assert mk.main([str(tmp_path / "jpegs"), "--n", "16", "--classes", "2"]) == 0
    calls = []
    real = decode.GpuDecoder.__call__

    def counted(self, enc):
        assert isinstance(enc, decode.EncodedBatch)
        calls.append(enc.size)
        return real(self, enc)

    losses = {}
    for mode in ("cpu", "gpu"):
        if mode == "gpu":
            monkeypatch.setattr(decode, "resolve_decode", lambda choice, device: "gpu")
            monkeypatch.setattr(decode.GpuDecoder, "__call__", counted)
        seen = []
        monkeypatch.setattr(engine, "run", lambda a, c, r=None, _run=engine.run: seen.append(_run(a, c, r)) or seen[-1])
        argv = ["--model", "green_mim_swin_nano_patch4_dec128b1", "--batch_size", "4", "--max_steps", "3",
                "--data_path", str(tmp_path / "jpegs"), "--num_workers", "0", "--device", "cpu",
                "--output_dir", str(tmp_path / mode), "--vis_freq", "100", "--lr", "1e-3"]
        assert cli.main(argv) == 0
        losses[mode] = seen[-1]["losses"]
        monkeypatch.undo()
    assert calls == [4, 4, 4]
    assert len(losses["gpu"]) == len(losses["cpu"]) == 3
    for g, c in zip(losses["gpu"], losses["cpu"]):
        assert math.isfinite(g) and abs(g - c) <= 1e-3 * abs(c), (losses["gpu"], losses["cpu"])
