"""The convolutions on visible tokens (conv_ops.py): each equals a dense zero-filled conv2d over the
full grid read back at the output cells, under random masks (per token and per mask unit, shared
and per sample, every stage geometry of Twins-L); gradients by gradcheck; the fakes by opcheck;
the CUDA path on the emulator against the CPU; bad input refused with the library's reason."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import greenmim
from greenmim import GreenmimError

D = torch.float64


def stage_mask(H, batch, per_token, gen, keep=None):
    """A stage mask [H, H] or [B, H, H]: per token (any pattern: borders, partly visible blocks,
    an empty sample) or per 32 px unit (whole blocks, what GreenMIM draws)."""
    B = 1 if batch is None else batch
    if per_token:
        m = torch.rand(B, H, H, generator=gen) < (keep if keep is not None else 0.35)
        if B > 2:
            m[1] = False                                   # a sample with no visible token
    else:
        u = torch.stack([greenmim.random_masks(generator=gen) for _ in range(B)])
        m = u.repeat_interleave(H // 7, 1).repeat_interleave(H // 7, 2)
    return m[0] if batch is None else m


def dense_at(x, mask, weight, bias, stride, padding, groups, out_position):
    """conv2d over the zero-filled grid, read at the output cells (flat positions, per sample)."""
    M = mask.view(-1, *mask.shape[-2:])
    B, H, W = M.shape
    C = x.shape[-1]
    n_img = x.shape[0] if mask.dim() == 2 else B
    img = x.new_zeros(n_img * H * W, C)
    pos = M.reshape(-1).nonzero().flatten()                 # row-major per sample = the token order
    if mask.dim() == 2:
        img = img.view(n_img, H * W, C)
        img[:, pos] = x
    else:
        img[pos] = x[0]
    img = img.view(n_img, H, W, C).permute(0, 3, 1, 2)
    y = F.conv2d(img, weight, bias, stride=stride, padding=padding, groups=groups)
    y = y.permute(0, 2, 3, 1).reshape(n_img, -1, y.shape[1])
    if mask.dim() == 2:
        return y[:, out_position.long()]
    return y.reshape(1, -1, y.shape[-1])[:, out_position.long()]


def features(table_tokens, mask, C, dtype=D, batch=2):
    return torch.randn(batch if mask.dim() == 2 else 1, table_tokens, C, dtype=dtype)


GRIDS = (56, 28, 14, 7)


@pytest.mark.parametrize("per_token", [True, False])
@pytest.mark.parametrize("batch", [None, 3])
def test_depthwise_equals_dense_conv_at_visible_cells(per_token, batch):
    g = torch.Generator().manual_seed(1)
    for H in GRIDS:
        mask = stage_mask(H, batch, per_token, g)
        t = greenmim.conv_tables.neighbor_table(mask, cache=False)
        C = 8
        x = features(t.num_tokens, mask, C)
        w, b = torch.randn(C, 1, 3, 3, dtype=D), torch.randn(C, dtype=D)
        for residual in (False, True):
            for bias in (b, None):
                want = dense_at(x, mask, w, bias, 1, 1, C, t.position) + (x if residual else 0)
                got = greenmim.conv_ops.submanifold_depthwise_conv3x3(x, t, w, bias, residual=residual)
                torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("per_token", [True, False])
@pytest.mark.parametrize("batch", [None, 3])
@pytest.mark.parametrize("algo", ["auto", "reference"])
def test_block_conv_equals_dense_conv_at_output_cells(per_token, batch, algo):
    g = torch.Generator().manual_seed(2)
    for H, sr in zip(GRIDS, (8, 4, 2, 1)):                  # GSA sub-sampling, then the patch embedding
        mask = stage_mask(H, batch, per_token, g)
        for s in {sr, 2} if H > 7 else {1}:
            t = greenmim.conv_tables.block_table(mask, s, cache=False)
            assert t.holes == (per_token and s > 1 and bool((t.gather < 0).any()))
            Ci, Co = 5, 6
            x = features(t.num_inputs, mask, Ci)
            w, b = torch.randn(Co, Ci, s, s, dtype=D), torch.randn(Co, dtype=D)
            want = dense_at(x, mask, w, b, s, 0, 1, t.position)
            got = greenmim.conv_ops.block_conv(x, t, w, b, algo=algo)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
            if per_token and s > 1:
                assert t.holes                                  # the partly visible blocks exist


def test_tables_describe_their_outputs():
    g = torch.Generator().manual_seed(3)
    mask = stage_mask(28, 4, True, g, keep=0.3)
    t = greenmim.conv_tables.block_table(mask, 4, cache=False)
    pooled = F.max_pool2d(mask.double().unsqueeze(1), 4).squeeze(1).bool()   # any rule
    assert torch.equal(t.cu_seqlens.diff(), pooled.flatten(1).sum(1).int())
    assert torch.equal(t.position.long(), pooled.flatten().nonzero().flatten())
    n = greenmim.conv_tables.neighbor_table(mask, cache=False)
    assert torch.equal(n.position.long(), mask.flatten().nonzero().flatten())
    assert n.nbr[:, 4].tolist() == list(range(n.num_tokens))                 # the centre tap is the token
    assert greenmim.conv_tables.neighbor_table(mask) is greenmim.conv_tables.neighbor_table(mask)     # cached with the plans


def test_gradcheck_float64():
    g = torch.Generator().manual_seed(4)
    for batch in (None, 2):
        mask = stage_mask(8, batch, True, g, keep=0.5)
        nt, bt = greenmim.conv_tables.neighbor_table(mask, cache=False), greenmim.conv_tables.block_table(mask, 4, cache=False)
        C = 3
        x = features(nt.num_tokens, mask, C).requires_grad_()
        w = torch.randn(C, 1, 3, 3, dtype=D, requires_grad=True)
        b = torch.randn(C, dtype=D, requires_grad=True)
        wb = torch.randn(4, C, 4, 4, dtype=D, requires_grad=True)
        bb = torch.randn(4, dtype=D, requires_grad=True)
        for residual in (False, True):
            assert torch.autograd.gradcheck(
                lambda x, w, b: greenmim.conv_ops.submanifold_depthwise_conv3x3(x, nt, w, b, residual=residual), (x, w, b))
        for algo in ("auto", "reference"):
            assert torch.autograd.gradcheck(lambda x, w, b: greenmim.conv_ops.block_conv(x, bt, w, b, algo=algo), (x, wb, bb))
        assert torch.autograd.gradcheck(lambda x, w: greenmim.conv_ops.block_conv(x, bt, w, None, algo="reference"), (x, wb))


def test_opcheck():
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck needs a newer torch")
    g = torch.Generator().manual_seed(5)
    mask = stage_mask(8, 2, True, g, keep=0.5)
    nt, bt = greenmim.conv_tables.neighbor_table(mask, cache=False), greenmim.conv_tables.block_table(mask, 2, cache=False)
    x = features(nt.num_tokens, mask, 4, torch.float32).requires_grad_()
    w, b = torch.randn(4, 1, 3, 3, requires_grad=True), torch.randn(4, requires_grad=True)
    wb, bb = torch.randn(6, 4, 2, 2, requires_grad=True), torch.randn(6, requires_grad=True)
    ops = torch.ops.greenmim
    torch.library.opcheck(ops.depthwise_conv3x3_fwd.default, (x, nt.nbr, w, b, True))
    torch.library.opcheck(ops.depthwise_conv3x3_fwd.default, (x, nt.nbr, w, None, False))
    torch.library.opcheck(ops.block_conv_fwd.default, (x, bt.gather, wb, bb, False))
    dy = torch.randn_like(x)
    torch.library.opcheck(ops.depthwise_conv3x3_bwd.default, (dy, x.detach(), nt.nbr, w.detach(), True, True, False))
    dyb = torch.randn(1, bt.num_outputs, 6)
    torch.library.opcheck(ops.block_conv_bwd.default, (dyb, x.detach(), bt.gather, wb.detach(), True, True, False))


@pytest.mark.parametrize("kernels", [False, True])
@pytest.mark.parametrize("holes", [True, False])
def test_block_conv_gemm_path_equals_reference(holes, kernels):
    """The CUDA default (the blocks' rows gathered, torch GEMMs, dx scattered back:
    _conv_abi._block_*_gemm) against the Eigen reference: forward, dx, dweight, dbias; shared
    and per-sample masks, strided rows, masks aligned to the blocks (no holes) or not. `kernels`:
    the gather and scatter on the library's row copies (the emulator, float32, inside a bf16
    autocast region), else torch's (float64)."""
    import contextlib
    from greenmim import _conv_abi as cb
    g = torch.Generator().manual_seed(11)
    @contextlib.contextmanager
    def emulated_under_autocast():   # an autocast region of another dtype must not leak into the GEMMs
        with greenmim.emulate_cuda(), torch.autocast("cpu", dtype=torch.bfloat16):
            yield

    dt, ctx = (torch.float32, emulated_under_autocast) if kernels else (D, contextlib.nullcontext)
    for batch in (None, 3):
        for s in (2, 4):
            mask = stage_mask(16 if holes else 28, batch, holes, g, keep=0.4)   # 28: 4 x 4-token units
            bt = greenmim.conv_tables.block_table(mask, s, cache=False)
            assert bool(bt.holes) == holes
            C, Co = 5, 7
            rows = features(bt.num_inputs, mask, C + 3)[..., :C]      # rows C + 3 apart
            x = rows.detach().clone().requires_grad_()
            w = torch.randn(Co, C, s, s, dtype=D, requires_grad=True)
            b = torch.randn(Co, dtype=D, requires_grad=True)
            want = greenmim.conv_ops.block_conv(x, bt, w, b, algo="reference")
            dy = torch.randn_like(want)
            want_g = torch.autograd.grad(want, (x, w, b), dy)
            tol = {} if dt == D else dict(rtol=1e-4, atol=1e-4)
            with ctx():
                got = torch.empty(want.shape, dtype=dt)
                cb._block_fwd_gemm(rows.to(dt), bt.gather, w.to(dt), b.to(dt), got)
                dx = torch.full(rows.shape, float("nan"), dtype=dt)             # every element must be written
                gd = cb.grad_dtype(dx)
                dw, db = torch.full(w.shape, float("nan"), dtype=gd), torch.full(b.shape, float("nan"), dtype=gd)
                cb._block_bwd_gemm(dy.to(dt), rows.to(dt), bt.gather, w, dx, dw, db)
            torch.testing.assert_close(got.double(), want.detach(), **tol)
            for a, e in zip((dx, dw, db), want_g):
                torch.testing.assert_close(a.double(), e, **tol)


class _OpNames(TorchDispatchMode):
    """Records the name of every op dispatched inside it (``.names``)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def _twins_mask(units, batch, gen):
    """A Twins plan's mask: 32 px units (7 x 7, whole blocks at every stage) or 8 px cells
    (28 x 28: partly visible 8x8, 4x4 and 2x2 blocks); one shared or `batch` per sample."""
    if units == 7:
        m = torch.stack([greenmim.random_masks(generator=gen) for _ in range(batch or 1)])
    else:
        m = torch.rand(batch or 1, 28, 28, generator=gen) < 0.4
    return m[0] if batch is None else m


def _scatter_dense(x, position, per_sample, batch, H):
    """Tokens [B, N, C] (or [1, sum N, C]) at their flat positions on a zero grid [B', C, H, H]."""
    n_img = batch if per_sample else x.shape[0]
    img = x.new_zeros(n_img, H * H, x.shape[-1])
    pos = position.long()
    if per_sample:
        img.view(n_img * H * H, -1)[pos] = x[0]
    else:
        img[:, pos] = x
    return img.view(n_img, H, H, -1).permute(0, 3, 1, 2)


@pytest.mark.parametrize("batch", [None, 3])
@pytest.mark.parametrize("units", [7, 28])
def test_twins_plan_block_convs_are_reshapes_and_one_gemm(units, batch):
    """A Twins plan's tokens are block-major: with 32 px units every GSA and patch-embedding block
    table is a reshape (``reshape=True``: output n's taps are tokens n*s*s + Morton rank) and
    block_conv takes one GEMM over a view; finer masks leave partly visible blocks and the gather
    path. Either way the forward and the gradients equal the reference on the same table, and the
    patch embedding equals a dense conv2d over the zero-filled grid read at the next stage's cells."""
    from greenmim.conv_tables import reshape_gather
    g = torch.Generator().manual_seed(13)
    mask = _twins_mask(units, batch, g)
    plan = greenmim.plan_twins(mask, cache=False)
    per_sample = batch is not None
    seen = 0
    for k, st in enumerate(plan.stages):
        H = st.grid[0]
        for t in (st.keys, st.embed):
            if t is None:
                continue
            assert t.reshape == (not t.holes)               # whole blocks in block-major order
            if t.reshape:
                assert torch.equal(t.gather, reshape_gather(t.num_outputs, t.stride))
                seen += 1
            C, Co, s = 5, 6, t.stride
            x = torch.randn(1 if per_sample else 2, t.num_inputs, C, dtype=D, requires_grad=True)
            w = torch.randn(Co, C, s, s, dtype=D, requires_grad=True)
            b = torch.randn(Co, dtype=D, requires_grad=True)
            got = greenmim.conv_ops.block_conv(x, t, w, b)
            want = greenmim.conv_ops.block_conv(x, t, w, b, algo="reference")
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
            dy = torch.randn_like(want)
            for a, e in zip(torch.autograd.grad(got, (x, w, b), dy), torch.autograd.grad(want, (x, w, b), dy)):
                torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)
            if t is st.embed:                              # the dense oracle, through the positions
                img = _scatter_dense(x.detach(), st.position, per_sample, batch, H)
                y = F.conv2d(img, w.detach(), b.detach(), stride=2).permute(0, 2, 3, 1)
                nxt = plan.stages[k + 1].position.long()
                dense = y.reshape(-1, Co)[nxt].unsqueeze(0) if per_sample else y.reshape(y.shape[0], -1, Co)[:, nxt]
                torch.testing.assert_close(got.detach(), dense, rtol=1e-12, atol=1e-12)
    # 32 px units: all 6 (GSA at sr 8, 4, 2 and three embeddings); 8 px cells: the 2x2 blocks of
    # stage 1 only (whole 2x2 cells), the others partly visible
    assert seen == (6 if units == 7 else 1)


def test_block_conv_reshape_path_under_autocast_and_a_false_claim():
    """The reshape path autocasts as F.linear (bf16 on the CPU here) and a table that claims to be a
    reshape without being one is refused, not computed."""
    g = torch.Generator().manual_seed(14)
    plan = greenmim.plan_twins(_twins_mask(7, None, g), cache=False)
    t = plan.stages[0].keys
    assert t.reshape and t.stride == 8
    x, w, b = torch.randn(2, t.num_inputs, 16), torch.randn(8, 16, 8, 8), torch.randn(8)
    want = greenmim.conv_ops.block_conv(x, t, w, b, algo="reference")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = greenmim.conv_ops.block_conv(x, t, w, b)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=3e-2, atol=0.5)
    bt = greenmim.conv_tables.block_table(torch.ones(8, 8, dtype=torch.bool), 2, cache=False)    # row-major: not a reshape
    liar = greenmim.conv_tables.BlockTable(bt.gather.clone(), 2, bt.num_inputs, False, bt.grid, reshape=True)
    with pytest.raises(GreenmimError, match="says reshape=True"):
        greenmim.conv_ops.block_conv(torch.randn(1, 64, 3), liar, torch.randn(4, 3, 2, 2))
    with pytest.raises(GreenmimError, match="features have 63 tokens"):
        greenmim.conv_ops.block_conv(torch.randn(2, 63, 16), t, w, b)
    # a claim made after the table's check is checked on its next use
    ok = greenmim.conv_tables.block_table(torch.ones(8, 8, dtype=torch.bool), 2, cache=False)
    x2, w2 = torch.randn(1, 64, 3), torch.randn(4, 3, 2, 2)
    greenmim.conv_ops.block_conv(x2, ok, w2)
    ok.reshape = True
    with pytest.raises(GreenmimError, match="says reshape=True"):
        greenmim.conv_ops.block_conv(x2, ok, w2)
    # float64 under autocast stays float64 (autocast leaves it alone), as on the other paths
    x64, w64, b64 = x.double(), w.double(), b.double()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got64 = greenmim.conv_ops.block_conv(x64, t, w64, b64)
    assert got64.dtype == torch.float64
    torch.testing.assert_close(got64, greenmim.conv_ops.block_conv(x64, t, w64, b64, algo="reference"))


@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last])
def test_w_prime_gradient_is_one_copy_in_the_weights_layout(fmt):
    """W''s backward writes the weight's gradient in one copy, in the weight's memory format
    (autograd's own backward of the permuting cast made two: a cast in W''s order, then
    AccumulateGrad's clone into the weight's strides; a contiguous gradient for a channels_last
    weight would be cloned too), with the values of the plain permute."""
    from greenmim._conv_abi import _w_prime_view, w_prime

    for s, morton in ((1, False), (2, True), (4, True), (8, True), (3, False)):
        w = torch.randn(6, 5, s, s).to(memory_format=fmt).requires_grad_(True)
        wp = w_prime(w, torch.bfloat16, morton=morton)
        r = torch.randn(wp.shape, dtype=torch.bfloat16)
        with _OpNames() as ops:
            torch.autograd.backward(wp, r)
        copies = [n for n in ops.names if "copy" in n or "clone" in n]
        assert len(copies) == 1, ops.names
        # the weight's strides (size-1 dims aside: AccumulateGrad's layout contract ignores them)
        assert all(a == b for a, b, n in zip(w.grad.stride(), w.stride(), w.shape) if n > 1), (w.grad.stride(), w.stride())
        assert w.grad.dtype == torch.float32
        # the plain path's gradient: the same view (its order is checked against morton_rank
        # below), autograd's copies
        w2 = w.detach().clone().requires_grad_(True)
        _w_prime_view(w2, morton).reshape(6, -1).to(torch.bfloat16).backward(r)
        assert torch.equal(w.grad, w2.grad)
    w64 = torch.randn(3, 2, 4, 4, dtype=D, requires_grad=True)
    assert torch.autograd.gradcheck(lambda w: w_prime(w, morton=True), (w64,))
    assert torch.autograd.gradgradcheck(lambda w: w_prime(w, morton=True), (w64,))


def test_reshape_path_weight_order_and_no_host_tensors():
    """W' of the reshape path has tap (i, j) at Morton rank (i, j) for every power-of-two stride,
    and the path makes no tensor from host data (lift_fresh: torch.tensor of a list), which a CUDA
    graph cannot capture (a device run found such a copy and the Twins step lost its graphs)."""
    from greenmim._conv_abi import w_prime
    from greenmim.conv_tables import morton_rank
    for s in (1, 2, 4, 8, 16):
        w = torch.randn(3, 5, s, s, dtype=D)
        got = w_prime(w, morton=True).view(3, s * s, 5)
        for i in range(s):
            for j in range(s):
                assert torch.equal(got[:, morton_rank(i, j)], w[:, :, i, j])

    t = greenmim.plan_twins(_twins_mask(7, 2, torch.Generator().manual_seed(15)), cache=False).stages[0].keys
    x = torch.randn(1, t.num_inputs, 4, requires_grad=True)
    w, b = torch.randn(6, 4, 8, 8, requires_grad=True), torch.randn(6, requires_grad=True)
    greenmim.conv_ops.block_conv(x, t, w, b)                      # the table's one-time checks happen here
    with _OpNames() as ops:
        greenmim.conv_ops.block_conv(x, t, w, b).sum().backward()
    assert any("addmm" in n or "linear" in n or "mm" in n for n in ops.names), ops.names
    assert not [n for n in ops.names if "lift_fresh" in n or "_to_copy" in n or "index" in n], ops.names


def test_block_conv_refuses_features_of_another_token_count_on_every_path():
    """A table indexes x's token axis: x with more or fewer tokens than the table's inputs is
    refused with the reason on every path (before, the gather paths ignored extra tokens or
    failed inside torch's index_select)."""
    bt = greenmim.conv_tables.block_table(torch.ones(8, 8, dtype=torch.bool), 2, cache=False)
    w = torch.randn(4, 3, 2, 2, dtype=D)
    for n in (63, 65):
        for algo in ("auto", "reference"):
            with pytest.raises(GreenmimError, match=f"features have {n} tokens, the block table 64"):
                greenmim.conv_ops.block_conv(torch.randn(2, n, 3, dtype=D), bt, w, algo=algo)


def test_block_conv_row_copy_refuses_mismatched_dtypes():
    """The gather + GEMM path's row copies move bytes: tokens and slots of different dtypes are
    refused (a bf16 dA copied into a float32 dx would be garbage), and nothing is written."""
    from greenmim import _conv_abi as cb
    mask = stage_mask(8, None, True, torch.Generator().manual_seed(12), keep=0.5)
    bt = greenmim.conv_tables.block_table(mask, 2, cache=False)
    x = torch.randn(1, bt.num_inputs, 8)
    slots = torch.full((1, bt.gather.numel(), 8), 7.0, dtype=torch.bfloat16)
    with greenmim.emulate_cuda():
        with pytest.raises(GreenmimError, match="row copy between torch.float32 and torch.bfloat16"):
            cb._copy_rows("gm_partition_tokens", x, slots, bt.gather, 4)
    assert bool((slots == 7).all())


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_emulated_cuda_path_equals_cpu(dtype, tol):
    g = torch.Generator().manual_seed(6)
    for batch in (None, 2):
        mask = stage_mask(16, batch, True, g, keep=0.4)
        nt, bt = greenmim.conv_tables.neighbor_table(mask, cache=False), greenmim.conv_tables.block_table(mask, 4, cache=False)
        C = 16
        x = features(nt.num_tokens, mask, C, torch.float32)
        w, b = torch.randn(C, 1, 3, 3), torch.randn(C)
        wb, bb = torch.randn(8, C, 4, 4) * 0.1, torch.randn(8)
        cases = ((lambda x, w, b: greenmim.conv_ops.submanifold_depthwise_conv3x3(x, nt, w, b, residual=True), w, b),
                 (lambda x, w, b: greenmim.conv_ops.block_conv(x, bt, w, b), wb, bb))
        for f, weight, bias in cases:
            ins = [t.clone().requires_grad_() for t in (x, weight, bias)]
            want = f(*ins)
            gy = torch.randn_like(want)
            want_g = torch.autograd.grad(want, ins, gy)
            emu = [ins[0].detach().to(dtype).requires_grad_(), *(t.detach().clone().requires_grad_() for t in ins[1:])]
            with greenmim.emulate_cuda():
                got = f(*emu)
                got_g = torch.autograd.grad(got, emu, gy.to(dtype))
            assert got.dtype == dtype
            scale = float(want.detach().abs().max())
            torch.testing.assert_close(got.detach().float(), want.detach(), rtol=tol, atol=tol * scale)
            for a, e in zip(got_g, want_g):
                torch.testing.assert_close(a.float(), e, rtol=tol, atol=tol * float(e.abs().max()))


def test_bad_input_is_refused_with_the_reason():
    g = torch.Generator().manual_seed(7)
    mask = stage_mask(8, None, True, g, keep=0.5)
    nt, bt = greenmim.conv_tables.neighbor_table(mask, cache=False), greenmim.conv_tables.block_table(mask, 2, cache=False)
    x = torch.randn(2, nt.num_tokens, 4)
    w, wb = torch.randn(4, 1, 3, 3), torch.randn(3, 4, 2, 2)
    conv, block = greenmim.conv_ops.submanifold_depthwise_conv3x3, greenmim.conv_ops.block_conv
    with pytest.raises(GreenmimError, match="float32 and float64"):
        conv(x.half(), nt, w)
    with pytest.raises(GreenmimError, match=r"weight must be \[C, 1, 3, 3\]"):
        conv(x, nt, torch.randn(4, 9))
    with pytest.raises(GreenmimError, match="another stage or mask"):
        conv(x[:, 1:], nt, w)
    with pytest.raises(GreenmimError, match="features must be"):
        conv(x[0], nt, w)
    with pytest.raises(GreenmimError, match="NeighborTable"):
        conv(x, bt, w)
    with pytest.raises(GreenmimError, match="meta.*cpu|cpu.*meta"):
        conv(x, greenmim.conv_tables.NeighborTable(nt.nbr.to("meta"), nt.grid), w)
    with pytest.raises(GreenmimError, match="meta.*cpu|cpu.*meta"):
        block(x, greenmim.conv_tables.block_table(mask, 2, device="meta", cache=False), wb)
    with pytest.raises(GreenmimError, match="stride 2"):
        block(x, bt, torch.randn(3, 4, 4, 4))
    with pytest.raises(GreenmimError, match="C_in = 4"):
        block(x, bt, torch.randn(3, 5, 2, 2))
    bad = nt.nbr.clone()
    bad[0, 0] = nt.num_tokens
    with pytest.raises(GreenmimError, match="outside"):
        conv(x, greenmim.conv_tables.NeighborTable(bad, nt.grid), w)
    twice = bt.gather.clone()
    twice[0, 0] = twice[1, 0] if twice[1, 0] >= 0 else twice[0, 1]
    with pytest.raises(GreenmimError, match="two blocks"):
        block(x, greenmim.conv_tables.BlockTable(twice, 2, bt.num_inputs, True), wb)
    with pytest.raises(GreenmimError, match="out of range|outside"):   # the reference's own check
        torch.ops.greenmim.depthwise_conv3x3_fwd(x, bad, w, None, False)
    with pytest.raises(GreenmimError, match="stride 3 must be 1..64 and divide"):
        greenmim.conv_tables.block_table(mask, 3, cache=False)
    with pytest.raises(GreenmimError, match="bool"):
        greenmim.conv_tables.neighbor_table(mask.float())
    with greenmim.emulate_cuda(), pytest.raises(GreenmimError, match="float32, float16 or bfloat16"):
        conv(x.double(), nt, w.double())


@pytest.mark.parametrize("emulated", [False, True])
def test_eager_fast_path_is_taken_and_equals_the_custom_op(emulated):
    """In plain eager mode the ops skip the dispatcher (greenmim._dispatch); the results and every
    gradient are bitwise those of the custom ops, on the CPU reference and on the kernels."""
    from greenmim import _dispatch as _eager
    g = torch.Generator().manual_seed(11)
    mask = stage_mask(16, 2, True, g, keep=0.4)
    nt, bt = greenmim.conv_tables.neighbor_table(mask, cache=False), greenmim.conv_tables.block_table(mask, 4, cache=False)
    dt = torch.float32 if emulated else D
    x = features(nt.num_tokens, mask, 16, dt)
    w, b, wb, bb = torch.randn(16, 1, 3, 3), torch.randn(16), torch.randn(8, 16, 4, 4), torch.randn(8)
    cases = ((lambda x, w, b: greenmim.conv_ops.submanifold_depthwise_conv3x3(x, nt, w, b, residual=True, algo="reference"), w, b),
             (lambda x, w, b: greenmim.conv_ops.block_conv(x, bt, w, b, algo="reference"), wb, bb),
             (lambda x, w, b: greenmim.conv_ops.submanifold_depthwise_conv3x3(x, nt, w, None), w, b))
    ctx = greenmim.emulate_cuda() if emulated else torch.enable_grad()
    with ctx:
        for f, weight, bias in cases:
            runs = []
            for disable in (True, False):
                ins = [t.clone().to(dt if t is x else t.dtype).requires_grad_() for t in (x, weight, bias)]
                before = _eager.fast_calls()
                with (_eager.disabled() if disable else torch.enable_grad()):
                    y = f(*ins)
                    grads = torch.autograd.grad(y, ins, torch.ones_like(y), allow_unused=True)
                taken = _eager.fast_calls() - before
                assert taken == (0 if disable else 2), taken          # forward and backward op
                runs.append((y.detach(), grads))
            (y0, g0), (y1, g1) = runs
            assert torch.equal(y0, y1)
            for a, c in zip(g0, g1):
                assert (a is None and c is None) or torch.equal(a, c)
