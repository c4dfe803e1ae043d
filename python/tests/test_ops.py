"""The ops on the CPU: exact against an independent oracle, gradcheck, adjointness, views,
custom-op contracts, and clear errors on bad input."""
import pytest
import torch

import greenmim
from greenmim import GreenmimError
from conftest import oracle_attention, random_stage_mask


def _case(grid=14, unit=2, window=7, shift=3, batch=None, heads=2, head_dim=4, B=2, dtype=torch.float64,
          strategy="fast"):
    m = random_stage_mask(grid, unit, batch)
    part = greenmim.testing.stage_partition(m, window, shift, channels=heads * head_dim, strategy=strategy, cache=False)
    N = part.num_tokens
    Bx = 1 if batch is not None else B
    q, k, v = (torch.randn(Bx, N, heads, head_dim, dtype=dtype) for _ in range(3))
    bias = torch.randn((2 * part.window - 1) ** 2, heads, dtype=dtype)
    return part, q, k, v, bias


@pytest.mark.parametrize("shift", [0, 3])
@pytest.mark.parametrize("batch", [None, 3])
@pytest.mark.parametrize("strategy", ["fast", "paper", "per-window", "single"])
def test_forward_equals_window_oracle(shift, batch, strategy):
    for _ in range(3):
        part, q, k, v, bias = _case(shift=shift, batch=batch, strategy=strategy)
        o = greenmim.group_window_attention(q, k, v, bias, part)
        torch.testing.assert_close(o, oracle_attention(q, k, v, bias, part, part.window), rtol=1e-12, atol=1e-12)
        o_nb = greenmim.group_window_attention(q, k, v, None, part)
        torch.testing.assert_close(o_nb, oracle_attention(q, k, v, None, part, part.window), rtol=1e-12, atol=1e-12)


def test_backward_equals_oracle_autograd():
    for shift in (0, 3):
        part, q, k, v, bias = _case(shift=shift, batch=2)
        leaves = [t.requires_grad_() for t in (q, k, v, bias)]
        g = torch.randn(q.shape, dtype=q.dtype)
        got = torch.autograd.grad(greenmim.group_window_attention(q, k, v, bias, part), leaves, g)
        want = torch.autograd.grad(oracle_attention(q, k, v, bias, part, part.window), leaves, g)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)


def test_released_path_agrees():
    part, q, k, v, bias = _case(grid=28, unit=4)
    torch.testing.assert_close(greenmim.group_window_attention(q, k, v, bias, part),
                               greenmim.released.released_group_attention(q, k, v, bias, part), rtol=1e-10, atol=1e-12)


# "auto" is torch's batched kernels on CPU (autograd's backward); "reference" the custom op with
# the Eigen reference's hand-written backward.
@pytest.mark.parametrize("algo", ["auto", "reference"])
def test_gradcheck_attention(algo):
    part, q, k, v, bias = _case(grid=14, unit=7, heads=2, head_dim=3, B=1)
    for t in (q, k, v, bias):
        t.requires_grad_()
    assert torch.autograd.gradcheck(lambda *a: greenmim.group_window_attention(*a, part, algo=algo), (q, k, v, bias))


@pytest.mark.parametrize("algo", ["auto", "reference"])
def test_gradcheck_packed_and_partition(algo):
    part, q, *_ = _case(grid=14, unit=7, heads=1, head_dim=2, B=1)
    N = part.num_tokens
    qkv = torch.randn(1, N, 3, 1, 2, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(169, 1, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: greenmim.group_window_attention_packed(a, b, part, algo=algo),
                                    (qkv, bias))
    x = torch.randn(2, N, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: greenmim.ops.partition_tokens(a, part), (x,))
    y = torch.randn(2, part.num_groups * part.group_size, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: greenmim.ops.unpartition_tokens(a, part), (y,))


def test_packed_views_read_in_place_and_match():
    part, *_ = _case(batch=None)
    N = part.num_tokens
    qkv = torch.randn(2, N, 3, 2, 4, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(169, 2, dtype=torch.float64, requires_grad=True)
    q, k, v = qkv.unbind(2)                      # strided views, not copies
    assert not q.is_contiguous()
    o1 = greenmim.group_window_attention(q, k, v, bias, part)
    o2 = greenmim.group_window_attention_packed(qkv, bias, part)
    o3 = greenmim.group_window_attention(q.contiguous(), k.contiguous(), v.contiguous(), bias, part)
    assert torch.equal(o1, o2) and torch.equal(o1, o3)
    g = torch.randn_like(o1)
    g1 = torch.autograd.grad(o1, (qkv, bias), g)
    g2 = torch.autograd.grad(o2, (qkv, bias), g)
    torch.testing.assert_close(g1[0], g2[0], rtol=0, atol=0)
    torch.testing.assert_close(g1[1], g2[1], rtol=1e-14, atol=1e-14)


def test_partition_round_trip_and_adjoint():
    for batch in (None, 4):
        part, *_ = _case(batch=batch, grid=28, unit=4)
        x = torch.randn(1 if batch else 3, part.num_tokens, 5, dtype=torch.float64)
        y = greenmim.ops.partition_tokens(x, part)
        assert y.shape == (x.shape[0], part.num_groups * part.group_size, 5)
        assert torch.equal(greenmim.ops.unpartition_tokens(y, part), x)
        pad = part.gather < 0
        assert torch.all(y[:, pad] == 0)
        z = torch.randn_like(y)
        lhs = (y * z).sum()
        rhs = (x * greenmim.ops.unpartition_tokens(z, part)).sum()
        torch.testing.assert_close(lhs, rhs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("algo", ["auto", "reference"])
def test_nan_does_not_cross_windows(algo):
    part, q, k, v, bias = _case(grid=14, unit=2, shift=0)
    tw = part.token_window
    victim = int(tw[0])
    v = v.clone()
    v[:, tw == victim] = float("nan")
    o = greenmim.group_window_attention(q, k, v, bias, part, algo=algo)
    assert torch.isnan(o[:, tw == victim]).all()
    assert torch.isfinite(o[:, tw != victim]).all()
    qkv = torch.stack([q, k, v], 2)             # the packed path, with a NaN in K of that window too
    qkv[:, tw == victim, 1] = float("nan")
    o = greenmim.group_window_attention_packed(qkv, bias, part, algo=algo)
    assert torch.isnan(o[:, tw == victim]).all()
    assert torch.isfinite(o[:, tw != victim]).all()


@pytest.mark.parametrize("batch", [None, 3])
def test_nan_does_not_cross_windows_in_the_backward(batch):
    """A NaN in one window's output gradient, or in its q, k or v at the next attention (whose
    NaN output then flows back), stays in that window's dq, dk, dv, as on the reference: neither
    another window of its group nor, per sample, another sample gets a NaN."""
    part, q, k, v, bias = _case(grid=14, unit=2, shift=3, batch=batch)
    tw = part.token_window
    inside = tw == int(tw[part.gather[0]])          # the window of group 0's first slot
    for packed in (False, True):
        for algo in ("auto", "reference"):
            qkv = torch.stack([q, k, v], 2).requires_grad_()
            b = bias.clone().requires_grad_()
            if packed:
                o = greenmim.group_window_attention_packed(qkv, b, part, algo=algo)
            else:
                o = greenmim.group_window_attention(*qkv.unbind(2), b, part, algo=algo)
            g = torch.randn_like(o)
            g[:, inside] = float("nan")
            (dqkv,) = torch.autograd.grad(o, qkv, g)
            assert torch.isnan(dqkv[:, inside]).any(), (packed, algo)
            assert torch.isfinite(dqkv[:, ~inside]).all(), (packed, algo)
    for which in range(3):                          # the NaN born in the next attention's q, k or v
        qkv = torch.stack([q, k, v], 2).requires_grad_()
        h = greenmim.group_window_attention_packed(qkv, bias, part)
        nxt = torch.stack([h, h, h], 2).clone()
        nxt[:, inside, which] = float("nan")
        o = greenmim.group_window_attention_packed(nxt, bias, part)
        (dqkv,) = torch.autograd.grad(o[:, ~inside].sum(), qkv)
        assert torch.isfinite(dqkv[:, ~inside]).all(), which


@pytest.mark.parametrize("algo", ["auto", "reference"])
def test_float32_on_cpu(algo):
    part, q, k, v, bias = _case(dtype=torch.float32)
    o = greenmim.group_window_attention(q, k, v, bias, part, algo=algo)
    ref = oracle_attention(q.double(), k.double(), v.double(), bias.double(), part, part.window)
    torch.testing.assert_close(o.double(), ref, rtol=1e-5, atol=1e-5)


def test_cpu_paths_agree_forward_and_backward():
    """torch's batched kernels (auto) against the Eigen reference: outputs and every gradient,
    shared and per-sample partitions, with and without a bias table."""
    for batch, with_bias in ((None, True), (3, True), (None, False)):
        part, q, k, v, bias = _case(grid=28, unit=4, batch=batch)
        qkv = torch.stack([q, k, v], 2).requires_grad_()
        b = bias.requires_grad_() if with_bias else None
        g = torch.randn(q.shape, dtype=q.dtype)
        outs = {}
        for algo in ("auto", "reference"):
            o = greenmim.group_window_attention_packed(qkv, b, part, algo=algo)
            outs[algo] = (o, torch.autograd.grad(o, [qkv] + ([b] if with_bias else []), g))
        torch.testing.assert_close(outs["auto"][0], outs["reference"][0], rtol=1e-12, atol=1e-12)
        for x, y in zip(outs["auto"][1], outs["reference"][1]):
            torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)


@pytest.mark.skipif(not hasattr(torch.library, "opcheck"), reason="torch.library.opcheck needs a newer torch")
def test_opcheck_contracts():
    part, q, k, v, bias = _case(batch=None)
    index = [part.gather, part.scatter, part.slot_window, part.slot_coord]
    args = (q, k, v, bias, index, part.group_size, part.window, 0.5, "auto")
    torch.library.opcheck(torch.ops.greenmim.attention_fwd.default, args)
    qkv = torch.stack([q, k, v], 2).requires_grad_()
    torch.library.opcheck(torch.ops.greenmim.attention_packed_fwd.default,
                          (qkv, bias.requires_grad_(), *args[4:]))
    x = torch.randn(2, part.num_tokens, 3, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(torch.ops.greenmim.partition.default,
                          (x, index, part.group_size))


def _raises(match, fn):
    with pytest.raises(GreenmimError, match=match):
        fn()


def test_bad_input_raises_clear_errors():
    part, q, k, v, bias = _case()
    other, *_ = _case(grid=28, unit=4)
    _raises("covers .* tokens", lambda: greenmim.group_window_attention(q, k, v, bias, other))
    _raises("shapes differ", lambda: greenmim.group_window_attention(q, k[:, :, :1], v, bias, part))
    _raises("dtypes differ", lambda: greenmim.group_window_attention(q, k.float(), v, bias, part))
    _raises("float32 and float64", lambda: greenmim.group_window_attention(q.half(), k.half(), v.half(), bias, part))
    _raises("bias table has", lambda: greenmim.group_window_attention(q, k, v, bias[:-1], part))
    _raises(r"\[B, N, heads, head_dim\]", lambda: greenmim.group_window_attention(q[0], k[0], v[0], bias, part))
    _raises("rows", lambda: greenmim.ops.partition_tokens(torch.randn(1, part.num_tokens + 1, 2), part))
    # A corrupted partition is refused by the library's own checks, with its reason.
    bad = greenmim.mask_plan.StagePartition(**{**part.__dict__, "gather": part.gather.clone()})
    bad.gather[0] = part.num_tokens + 5
    with pytest.raises(GreenmimError, match="attention forward: .*out of range|covers"):
        greenmim.group_window_attention(q, k, v, bias, bad)


def test_lse_output_and_scale():
    part, q, k, v, bias = _case()
    index = [part.gather, part.scatter, part.slot_window, part.slot_coord]
    o, lse = torch.ops.greenmim.attention_fwd(q, k, v, bias, index, part.group_size, part.window, 0.3, "auto")
    torch.testing.assert_close(o, oracle_attention(q, k, v, bias, part, part.window, scale=0.3), rtol=1e-12,
                               atol=1e-12)
    assert lse.shape == q.shape[:3] and torch.isfinite(lse).all()


def _device_pairings():
    """(plan's device, tensors' device): every pairing of meta, CPU and (where present) CUDA."""
    devs = ["cpu", "meta"] + (["cuda"] if torch.cuda.is_available() else [])
    return [(a, b) for a in devs for b in devs if a != b]


@pytest.mark.parametrize("plan_dev,data_dev", _device_pairings())
def test_a_plan_on_another_device_is_refused_by_every_op(plan_dev, data_dev):
    """A plan on "meta" with CPU tensors used to return uninitialised memory (the ops' fakes ran)."""
    part, q, k, v, bias = _case()
    p = greenmim.mask_plan.StagePartition(**{f.name: getattr(part, f.name) for f in part.__dataclass_fields__.values()})
    for name in ("gather", "scatter", "slot_window", "slot_coord"):
        setattr(p, name, getattr(part, name).to(plan_dev))
    q, k, v, bias = (t.to(data_dev) for t in (q, k, v, bias))
    qkv = torch.stack([q, k, v], 2)
    x = q.flatten(2)
    index = [p.gather, p.scatter, p.slot_window, p.slot_coord]
    calls = {
        "attention auto": lambda: greenmim.group_window_attention(q, k, v, bias, p),
        "attention reference": lambda: greenmim.group_window_attention(q, k, v, bias, p, algo="reference"),
        "packed": lambda: greenmim.group_window_attention_packed(qkv, bias, p),
        "partition": lambda: greenmim.ops.partition_tokens(x, p),
        "unpartition": lambda: greenmim.ops.unpartition_tokens(x.new_zeros(2, p.gather.numel(), x.shape[-1]), p),
        "raw op": lambda: torch.ops.greenmim.attention_fwd(q, k, v, bias, index, p.group_size, p.window, 0.5, "auto"),
        "raw partition op": lambda: torch.ops.greenmim.partition(x, index, p.group_size),
    }
    for what, call in calls.items():
        with pytest.raises(GreenmimError) as e:
            call()
        msg = str(e.value)
        assert plan_dev in msg and data_dev in msg, (what, msg)


@pytest.mark.parametrize("emulated", [False, True])
def test_eager_fast_path_is_taken_and_equals_the_custom_op(emulated):
    """In plain eager mode the ops skip the dispatcher (greenmim._dispatch); outputs and gradients
    are bitwise the custom ops'. Under a dispatch mode (FlopCounterMode) the custom ops run."""
    from torch.utils.flop_counter import FlopCounterMode
    from greenmim import _dispatch as _eager, flops as gm_flops
    dt = torch.float32 if emulated else torch.float64
    part, q, k, v, bias = _case(batch=2, dtype=dt, heads=1, head_dim=32 if emulated else 4)   # kernels: 32 or 64
    qkv = torch.stack([q, k, v], 2)
    x = torch.randn(q.shape[0], q.shape[1], 8, dtype=dt)

    def run(disable):
        leaves = [t.clone().requires_grad_() for t in (q, k, v, bias, qkv, x)]
        qq, kk, vv, bb, pk, xx = leaves
        before = _eager.fast_calls()
        with (_eager.disabled() if disable else torch.enable_grad()):
            outs = (greenmim.group_window_attention(qq, kk, vv, bb, part, algo="reference"),
                    greenmim.group_window_attention_packed(pk, bb, part, algo="reference"),
                    greenmim.ops.unpartition_tokens(greenmim.ops.partition_tokens(xx, part), part))
            loss = sum((o * torch.randn(o.shape, generator=torch.Generator().manual_seed(i), dtype=dt)).sum()
                       for i, o in enumerate(outs))
            grads = torch.autograd.grad(loss, leaves)
        return outs, grads, _eager.fast_calls() - before

    with (greenmim.emulate_cuda() if emulated else torch.enable_grad()):
        o0, g0, n0 = run(True)
        o1, g1, n1 = run(False)
        assert (n0, n1) == (0, 8)     # 4 forward ops, 4 backward ops
        for a, b in zip(o0 + g0, o1 + g1):
            assert torch.equal(a, b)
        gm_flops.register_flop_formulas()
        before = _eager.fast_calls()
        with FlopCounterMode(display=False) as fc:
            greenmim.group_window_attention(q, k, v, bias, part, algo="reference")
        assert _eager.fast_calls() == before and fc.get_total_flops() > 0


@pytest.mark.parametrize("packed", [False, True])
def test_fast_path_refuses_a_changed_index_and_a_double_backward_as_the_custom_op(packed):
    """The fast path's attention keeps the partition's Index on its Function's context instead of
    saving its tensors: an index tensor changed in place before the backward is refused as autograd
    refuses a changed saved tensor, and a double backward meets the custom op's error, on both paths."""
    from greenmim import _dispatch as _eager
    part, q, k, v, bias = _case(dtype=torch.float64)
    qkv = torch.stack([q, k, v], 2)

    def forward(leaf, bb, p):
        if packed:
            return greenmim.group_window_attention_packed(leaf, bb, p, algo="reference")
        return greenmim.group_window_attention(leaf, k, v, bb, p, algo="reference")

    msgs = {}
    for disable in (True, False):
        with (_eager.disabled() if disable else torch.enable_grad()):
            p = part
            leaf = (qkv if packed else q).clone().requires_grad_()
            bb = bias.clone().requires_grad_()
            before = _eager.fast_calls()
            o = forward(leaf, bb, p)
            assert (_eager.fast_calls() > before) == (not disable)
            g, = torch.autograd.grad(o.sum(), leaf, create_graph=True)
            with pytest.raises(RuntimeError, match="no autograd formula was registered") as e:
                g.sum().backward()
            msgs[disable] = str(e.value)
            for t in greenmim.ops.Index.tensors(p):    # each index tensor, changed in place (same values)
                o = forward(leaf, bb, p)
                t.add_(0)
                with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                    o.sum().backward()
    assert msgs[True] == msgs[False]


def test_eager_dispatch_switch_sends_every_call_through_the_dispatcher():
    import os
    import subprocess
    import sys
    code = ("import torch, greenmim; from greenmim import _dispatch as _eager; x = torch.randn(1, 4, 2); "
            "m = torch.zeros(8, 8, dtype=torch.bool); m[:4, :4] = True; "
            "p = greenmim.testing.stage_partition(m, 4, 0, channels=2, cache=False); "
            "greenmim.ops.partition_tokens(torch.randn(1, p.num_tokens, 2), p); print(_eager.fast_calls())")
    for value, want in (("1", "0"), ("0", "1")):
        env = dict(os.environ, GREENMIM_EAGER_DISPATCH=value)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == want, (value, out.stdout, out.stderr)


def test_eager_fast_path_steps_aside_under_jit_trace():
    """torch.jit.trace must record the custom op, not run its implementation inline."""
    import warnings
    from greenmim import _dispatch as _eager
    part, q, k, v, bias = _case(dtype=torch.float32)
    x = torch.randn(q.shape[0], q.shape[1], 8)
    before = _eager.fast_calls()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(lambda t: greenmim.ops.partition_tokens(t, part), (x,), check_trace=False)
    assert _eager.fast_calls() == before
    assert "greenmim::partition" in str(traced.graph)
    assert torch.equal(traced(x), greenmim.ops.partition_tokens(x, part))


def test_argument_structs_written_in_one_call_equal_field_by_field():
    """_abi_views.Packer (the ops' argument structs in one struct.pack_into) writes the bytes that
    setting each ctypes field does, for every kernel struct, with views of rank 1-4, strided,
    empty and absent (None) tensors."""
    import ctypes
    from greenmim import _abi_views, _lib
    t4 = torch.randn(2, 5, 3, 8)[:, 1:, ::2]                    # strided, rank 4
    views = [t4, torch.randn(7, 3).t(), torch.randn(6), torch.empty(0, 4), None, torch.randn(2, 3, 4)]
    part = _case()[0]
    for cls in (_lib.FwdArgs, _lib.BwdArgs, _lib.PartitionArgs, _lib.DepthwiseConvArgs, _lib.BlockConvArgs):
        tensor_names = [n for n, t in cls._fields_ if t is _lib.Tensor]
        picks = [views[(i * 5 + len(cls.__name__)) % len(views)] for i in range(len(tensor_names))]
        want = cls()
        values = []
        for name, typ in cls._fields_:
            if typ is _lib.Tensor:
                t = picks[tensor_names.index(name)]
                setattr(want, name, _abi_views.tensor(t))
                values += _abi_views.tensor_fields(t)
            elif typ is _lib.Partition:
                want.part = _abi_views.partition(part, slot_coord=cls is not _lib.PartitionArgs)
                values += _abi_views.partition_fields(part, slot_coord=cls is not _lib.PartitionArgs)
            else:
                v = 0.125 if name == "scale" else (0x7fff0000 + len(values) if typ is ctypes.c_void_p else len(values))
                setattr(want, name, v)
                values.append(v)
        assert bytes(_abi_views.Packer(cls).new(*values)) == bytes(want), cls.__name__
    with pytest.raises(GreenmimError, match="rank <= 4"):
        _abi_views.tensor_fields(torch.randn(1, 1, 1, 1, 1))


@pytest.mark.parametrize("emulated", [False, True])
def test_index_checks_remembered_only_while_the_index_is_unchanged(emulated):
    """Index tensors that passed the ops' checks are not checked again (_attention_abi.known_index),
    until one is modified in place (its version moves) or replaced: then the same inputs are
    refused with the same messages as on a first call."""
    from greenmim import _attention_abi as _backend
    dt = torch.float32 if emulated else torch.float64
    with (greenmim.emulate_cuda() if emulated else torch.enable_grad()):
        part, q, k, v, bias = _case(dtype=dt, heads=1, head_dim=32 if emulated else 4)
        x = torch.randn(q.shape[0], q.shape[1], 8, dtype=dt)
        ref = greenmim.ops.partition_tokens(x, part)
        greenmim.group_window_attention(q, k, v, bias, part, algo="reference")
        assert _backend.known_index(_backend.Index.tensors(part), part.group_size) is not None
        assert torch.equal(greenmim.ops.partition_tokens(x, part), ref)
        n = part.slot_coord.numel()
        part.slot_coord.resize_(n - 1)                          # in place: the version moves
        assert _backend.known_index(_backend.Index.tensors(part), part.group_size) is None
        with pytest.raises(GreenmimError, match="same length"):
            greenmim.group_window_attention(q, k, v, bias, part, algo="reference")
        part.slot_coord.resize_(n)
        part.gather = part.gather.long()                       # replaced: another object
        for call in (lambda: greenmim.group_window_attention(q, k, v, bias, part, algo="reference"),
                     lambda: greenmim.ops.partition_tokens(x, part)):
            with pytest.raises(GreenmimError, match="gather must be a 1-D int32 tensor"):
                call()
        with torch.inference_mode():            # inference tensors have no version: checked every call
            part = _case(dtype=dt, heads=1, head_dim=32 if emulated else 4)[0]
            x = torch.randn(2, part.num_tokens, 8, dtype=dt)
            y = greenmim.ops.partition_tokens(x, part)
            assert _backend.known_index(_backend.Index.tensors(part), part.group_size) is None
            assert torch.equal(greenmim.ops.unpartition_tokens(y, part), x)
