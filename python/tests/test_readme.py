"""README's PyTorch example runs as written (on the CPU: the device and batch swapped)."""
import pathlib
import re

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _snippet(path, heading):
    text = (ROOT / path).read_text()
    section = text.split(heading, 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _run_on_cpu(code):
    subs = {".cuda()": "", 'device="cuda"': 'device="cpu"', "torch.randn(128,": "torch.randn(2,",
            'torch.autocast("cuda", dtype=torch.bfloat16)': 'torch.autocast("cpu", enabled=False)'}
    for a, b in subs.items():
        assert a in code, f"README example changed: {a!r} not found; update this test"
        code = code.replace(a, b)
    scope = {}
    exec(compile(code, "README", "exec"), scope)
    return scope


def test_readme_pytorch_example():
    scope = _run_on_cpu(_snippet("README.md", "## PyTorch in ten lines"))
    assert torch.isfinite(scope["loss"])
    assert scope["model"].layers[0].blocks[0].attn.qkv.weight.grad is not None
