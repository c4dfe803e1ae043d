"""The package's CUDA path (ctypes marshalling of views, strides, dtypes, lse, workspace, d(bias)
accumulation, device-side index building) run on CPU tensors through the kernels built for the
CPU emulator (libgreenmim_emu). The kernels themselves are tested in C++ (greenmim_emu_tests);
this proves the glue the GPU will run. Slow per element: tiny shapes."""
import pathlib
import os

import pytest
import torch

import greenmim
from greenmim import GreenmimError
from conftest import oracle_attention, random_stage_mask

_lib_dir = pathlib.Path(os.environ.get("GREENMIM_LIB_DIR", pathlib.Path(__file__).resolve().parents[2] / "build/lib"))
pytestmark = pytest.mark.skipif(not (_lib_dir / "libgreenmim_emu.so").exists(),
                                reason="libgreenmim_emu.so not built (needs the CUDA headers)")

TOL = {torch.float32: 2e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("per_sample", [False, True])
@pytest.mark.parametrize("shift", [0, 3])
def test_device_index_building_equals_host(per_sample, shift):
    m = random_stage_mask(28, 4, 3 if per_sample else None)
    host = greenmim.testing.stage_partition(m, 7, shift, 128, cache=False)
    with greenmim.emulate_cuda():
        dev = greenmim.testing.stage_partition(m, 7, shift, 128, cache=False)
    for f in ("gather", "scatter", "slot_window", "slot_coord", "token_window"):
        assert torch.equal(getattr(host, f), getattr(dev, f)), f
    assert (host.group_size, host.num_groups, host.window, host.shift) == \
        (dev.group_size, dev.num_groups, dev.window, dev.shift)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_packed_attention_forward_backward(dtype):
    part = greenmim.testing.stage_partition(random_stage_mask(14, 2), 7, 3, 64, cache=False)
    N = part.num_tokens
    qkv = torch.randn(2, N, 3, 2, 32).to(dtype).requires_grad_()
    bias = torch.randn(169, 2, requires_grad=True)
    with greenmim.emulate_cuda():
        o = greenmim.group_window_attention_packed(qkv, bias, part)
        g = torch.randn(o.shape).to(dtype)
        o.backward(g)
    assert o.dtype == dtype and qkv.grad.dtype == dtype and bias.grad.dtype == torch.float32
    qkv64 = qkv.detach().double().requires_grad_()
    b64 = bias.detach().double().requires_grad_()
    o64 = oracle_attention(*qkv64.unbind(2), b64, part, part.window)
    o64.backward(g.double())
    scale = lambda t: max(1.0, float(t.detach().abs().max()))
    tol = TOL[dtype]
    o = o.detach()
    assert float((o.double() - o64).abs().max()) <= tol * scale(o64)
    assert float((qkv.grad.double() - qkv64.grad).abs().max()) <= tol * scale(qkv64.grad)
    assert float((bias.grad.double() - b64.grad).abs().max()) <= tol * scale(b64.grad) * 4


def test_dbias_deterministic_and_views_per_sample():
    part = greenmim.testing.stage_partition(random_stage_mask(14, 7, 3, keep=2), 7, 0, 64, cache=False)
    N = part.num_tokens
    qkv = torch.randn(1, N, 3, 1, 32, dtype=torch.float16)
    grads = []
    for _ in range(2):
        q, k, v = (t.requires_grad_() for t in qkv.clone().unbind(2))   # separate strided views
        bias = torch.randn(169, 1, generator=torch.Generator().manual_seed(3), requires_grad=True)
        with greenmim.emulate_cuda():
            greenmim.group_window_attention(q, k, v, bias, part).float().sum().backward()
        grads.append(bias.grad.clone())
    assert torch.equal(grads[0], grads[1])


def test_partition_ops_on_kernels():
    part = greenmim.testing.stage_partition(random_stage_mask(28, 4), 7, 3, 128, cache=False)
    x = torch.randn(2, part.num_tokens, 16, dtype=torch.bfloat16)
    with greenmim.emulate_cuda():
        y = greenmim.ops.partition_tokens(x, part)
        back = greenmim.ops.unpartition_tokens(y, part)
    assert torch.equal(y, greenmim.ops.partition_tokens(x.float(), part).to(torch.bfloat16))
    assert torch.equal(back, x)


def test_kernel_refusals_are_exceptions():
    part = greenmim.testing.stage_partition(random_stage_mask(14, 7), 7, 0, 64, cache=False)
    q = torch.randn(1, part.num_tokens, 1, 48)          # head_dim 48: not implemented by the kernels
    with greenmim.emulate_cuda(), pytest.raises(GreenmimError, match="head_dim"):
        greenmim.group_window_attention(q, q, q, None, part)
    q = torch.randn(1, part.num_tokens, 1, 32, dtype=torch.float64)
    with greenmim.emulate_cuda(), pytest.raises(GreenmimError, match="float32, float16 or bfloat16"):
        greenmim.group_window_attention(q, q, q, None, part)


@pytest.mark.parametrize("max_group_size", [None, 0])
def test_window16_through_the_package(max_group_size):
    """Swin V2's window 16 end to end on the kernels: three full 16 x 16 windows and one of 10
    tokens. The default plan caps G at the tensor-core limit (256, four groups: the tiled
    tensor-core forward and backward under AUTO); max_group_size=0 lets the planner take its
    free optimum G = 266 (three groups: the CUDA-core kernels). Both equal the oracle."""
    m = torch.ones(32, 32, dtype=torch.bool)
    fourth = torch.zeros(256, dtype=torch.bool)
    fourth[:10] = True
    m[16:, 16:] = fourth.view(16, 16)
    part = greenmim.testing.stage_partition(m, 16, 0, 256, cache=False, max_group_size=max_group_size)
    assert part.group_size == (256 if max_group_size is None else 266)
    N = part.num_tokens
    qkv = torch.randn(1, N, 3, 1, 32).to(torch.bfloat16).requires_grad_()
    bias = torch.randn(31 * 31, 1, requires_grad=True)
    with greenmim.emulate_cuda():
        o = greenmim.group_window_attention_packed(qkv, bias, part)
        g = torch.randn(o.shape).to(torch.bfloat16)
        o.backward(g)
    qkv64 = qkv.detach().double().requires_grad_()
    b64 = bias.detach().double().requires_grad_()
    o64 = oracle_attention(*qkv64.unbind(2), b64, part, part.window)
    o64.backward(g.double())
    scale = lambda t: max(1.0, float(t.detach().abs().max()))
    tol = TOL[torch.bfloat16]
    assert float((o.detach().double() - o64.detach()).abs().max()) <= tol * scale(o64)
    assert float((qkv.grad.double() - qkv64.grad).abs().max()) <= tol * scale(qkv64.grad)
    assert float((bias.grad.double() - b64.grad).abs().max()) <= tol * scale(b64.grad) * 4


@pytest.mark.parametrize("per_sample", [False, True])
@pytest.mark.parametrize("name", ["green_mim_swin_nano_patch4_dec128b1", "green_mim_twins_nano_patch4_dec128b1"])
def test_training_step_on_the_kernel_path_is_capturable(name, per_sample):
    """What a CUDA graph cannot capture, checked on the CPU: a tensor made from host data
    (lift_fresh, a host-to-device copy on a GPU), a value read to the host (_local_scalar_dense:
    .item(), bool(t)) and an op whose output size depends on values (nonzero, unique). The nano
    models' forward + backward on the kernel path (the emulator) make none of them once their
    one-time checks are done. Device runs found such copies twice after CPU tests had passed; this
    test fails on the first (the reshape block conv's tap order made with torch.tensor)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.bad = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if any(s in str(func) for s in ("lift_fresh", "_local_scalar_dense", "nonzero", "unique")):
                self.bad.append(str(func))
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    model = greenmim.create_model(name)
    masks = model.random_masks(2 if per_sample else None, generator=torch.Generator().manual_seed(1))
    plan = model.plan(masks, cache=False)
    img = torch.randn(2, 3, 224, 224)
    with greenmim.emulate_cuda():
        model(img, plan)[0].backward()                     # the first step: tables checked, caches filled
        with Recorder() as rec:
            model(img, plan)[0].backward()
    assert not rec.bad, rec.bad
