"""Plans padded to a capacity (MaskPlan.padded, group_capacity, copy_): what replaying one CUDA
graph on every mask needs. Padding groups must change nothing the model computes (loss and every
gradient equal to the unpadded plan's, on the CPU and on the kernels' CUDA path under the
emulator), plans of different masks padded to one capacity must share every shape and view, and
a plan copied into another's arena must compute what the copied plan computes."""
import pickle

import pytest
import torch

import greenmim
from greenmim import GreenmimError, mask_plan as indices

NANO = "green_mim_swin_nano_patch4_dec128b1"


def _model(dtype):
    torch.manual_seed(0)
    return greenmim.create_model(NANO).to(dtype)


def _plans(model, per_sample, n, gen, group_size=-1, ratio=0.75):
    enc = model.encoder
    out = []
    for _ in range(n):
        m = indices.random_masks(per_sample, grid=model.grid, ratio=ratio, generator=gen)
        out.append(indices.plan_masks(m, img_size=enc.img_size, patch_size=enc.patch_size, window_size=enc.window_size,
                                      num_stages=len(enc.layers), embed_dim=enc.embed_dim, cache=False,
                                      group_size=group_size))
    return out


def _grown(plan, cap, k):
    """``cap`` with k more groups in every partition (both alike where a stage has one)."""
    return tuple((a + k, b + k) for (a, b), st in zip(cap, plan.stages))


def _loss_and_grads(model, img, plan):
    model.zero_grad(set_to_none=True)
    loss = model(img, plan)[0]
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _assert_same(a, b, exact=False):
    """Equal losses and gradients. ``exact`` (the kernels, which skip padding groups): bit for
    bit, but for the bias tables' gradients, whose float32 sum over groups the backward splits
    by the number of groups (so within its rounding). Otherwise to float64 rounding (torch's CPU
    matmuls block their sums by the slot count)."""
    (la, ga), (lb, gb) = a, b
    assert ga.keys() == gb.keys()
    for name, x, y in [("loss", la, lb)] + [(n, ga[n], gb[n]) for n in ga]:
        if not exact:
            torch.testing.assert_close(x, y, rtol=1e-11, atol=1e-15, msg=name)
        elif name.endswith("relative_position_bias_table"):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6 * x.abs().max().item(), msg=name)
        else:
            assert torch.equal(x, y), name


@pytest.mark.parametrize("per_sample", [None, 3])
@pytest.mark.parametrize("group_size", [-1, 0])
def test_padding_changes_nothing_on_the_cpu(per_sample, group_size):
    gen = torch.Generator().manual_seed(11 + (per_sample or 0) + group_size)
    model = _model(torch.float64)
    plans = _plans(model, per_sample, 6, gen, group_size)
    cap = _grown(plans[0], greenmim.group_capacity(plans, margin=0.25), 2)
    B = per_sample or 2
    img = torch.randn(B, 3, 224, 224, dtype=torch.float64, generator=gen)
    for p in plans[:2]:
        q = p.padded(cap)
        assert q.group_counts() == cap
        # the padding: whole groups of -1 gathers and windows after the plan's own slots
        for sp, sq in zip(p.stages, q.stages):
            for pp, pq in zip(sp.partitions, sq.partitions):
                n = pp.gather.numel()
                assert torch.equal(pq.gather[:n], pp.gather) and torch.equal(pq.scatter, pp.scatter)
                assert (pq.gather[n:] == -1).all() and (pq.slot_window[n:] == -1).all() and (pq.slot_coord[n:] == 0).all()
            if sp.merge is not None:
                assert torch.equal(sp.merge, sq.merge)
            assert torch.equal(sp.position, sq.position)
        _assert_same(_loss_and_grads(model, img, p), _loss_and_grads(model, img, q))


@pytest.mark.parametrize("per_sample", [None, 2])
def test_padding_changes_nothing_on_the_kernels(per_sample):
    """The CUDA path's Python and kernels, on the emulator: groups of padding only are skipped by
    partition, attention forward and backward (dbias included) and unpartition."""
    gen = torch.Generator().manual_seed(5 + (per_sample or 0))
    model = _model(torch.float32)
    plans = _plans(model, per_sample, 4, gen)
    cap = _grown(plans[0], greenmim.group_capacity(plans), 3)
    img = torch.randn(per_sample or 2, 3, 224, 224, generator=gen)
    with greenmim.emulate_cuda():
        _assert_same(_loss_and_grads(model, img, plans[0]), _loss_and_grads(model, img, plans[0].padded(cap)),
                     exact=True)


@pytest.mark.parametrize("per_sample", [None, 4])
def test_plans_padded_to_one_capacity_are_interchangeable(per_sample):
    """Equal shape keys, equal arena sizes and view offsets; a plan copied into another's arena
    (what a replayed graph reads) computes what the copied plan computes."""
    gen = torch.Generator().manual_seed(21 + (per_sample or 0))
    model = _model(torch.float64)
    plans = _plans(model, per_sample, 12, gen)
    cap = greenmim.group_capacity(plans)
    padded = [p.padded(cap) for p in plans]
    key = padded[0].shape_key()
    assert all(q.shape_key() == key for q in padded)
    offsets = lambda q: [t.data_ptr() - q.arena.data_ptr() for st in q.stages for p in st.partitions
                         for t in (p.gather, p.scatter, p.slot_window, p.slot_coord)]
    assert all(offsets(q) == offsets(padded[0]) for q in padded)
    static = greenmim.MaskPlan(padded[0].arena.clone(), padded[0].layout)
    img = torch.randn(per_sample or 2, 3, 224, 224, dtype=torch.float64, generator=gen)
    for q in padded[1:4]:
        assert static.copy_(q) is static
        _assert_same(_loss_and_grads(model, img, static), _loss_and_grads(model, img, q))


def test_group_capacity_bounds_the_plans_it_saw():
    gen = torch.Generator().manual_seed(3)
    model = _model(torch.float32)
    plans = _plans(model, 8, 16, gen)
    counts = [p.group_counts() for p in plans]
    exact = greenmim.group_capacity(plans, margin=0)
    assert exact == tuple(tuple(max(c[s][j] for c in counts) for j in range(2)) for s in range(len(exact)))
    cap = greenmim.group_capacity(plans, margin=0.1)
    for s, (e, c) in enumerate(zip(exact, cap)):
        for j in range(2):
            varied = len({x[s][j] for x in counts}) > 1
            assert c[j] >= e[j] and (c[j] > e[j]) == varied
    with pytest.raises(GreenmimError, match="no plans"):
        greenmim.group_capacity([])
    with pytest.raises(GreenmimError, match="margin"):
        greenmim.group_capacity(plans, margin=-0.1)


def test_bad_capacities_are_refused_and_padded_plans_travel():
    gen = torch.Generator().manual_seed(8)
    model = _model(torch.float32)
    p, = _plans(model, None, 1, gen)
    have = p.group_counts()
    assert p.padded(have) is p                     # nothing to pad: the plan itself
    short = list(have)
    short[0] = (have[0][0] - 1, have[0][1])
    with pytest.raises(GreenmimError, match="stage 1's plain windows take"):
        p.padded(short)
    with pytest.raises(GreenmimError, match="pairs for a plan of"):
        p.padded(have[:-1])
    with pytest.raises(GreenmimError, match="one tuple of group counts per stage"):
        p.padded([1, 2, 3, 4])
    last = len(have) - 1                            # the 7x7 last stage: one window, one partition
    assert p.stages[last].partitions[0] is p.stages[last].partitions[1]
    uneven = list(have)
    uneven[last] = (have[last][0], have[last][1] + 1)
    with pytest.raises(GreenmimError, match="must agree"):
        p.padded(uneven)
    big = tuple((a + 3, b + 3) if s < last else (a, b) for s, (a, b) in enumerate(have))
    q = p.padded(big)
    r = pickle.loads(pickle.dumps(q))               # DataLoader workers pickle plans
    assert r.shape_key() == q.shape_key() and torch.equal(r.arena, q.arena)
    with pytest.raises(GreenmimError, match="differ in shape"):
        greenmim.MaskPlan(p.arena.clone(), p.layout).copy_(q)


TWINS_NANO = "green_mim_twins_nano_patch4_dec128b1"


@pytest.mark.parametrize("per_sample", [None, 2])
def test_twins_plans_pad_and_interchange(per_sample):
    """Twins' plans (one LSA partition per stage) padded to a capacity: the same loss and
    gradients as unpadded, on the CPU (float64) and on the kernels under the emulator (float32,
    bias-free LSA: bit for bit); plans of different masks padded alike share every shape, and one
    copied into another's arena computes what it computes."""
    from greenmim.pretrain import data
    gen = torch.Generator().manual_seed(40 + (per_sample or 0))
    torch.manual_seed(0)
    model = greenmim.create_model(TWINS_NANO).double()
    geo = data.Geometry(model, fixed_groups=True)
    plans = [geo.plan(model.random_masks(per_sample, generator=gen)) for _ in range(6)]
    cap = tuple((c + 2,) for (c,) in greenmim.group_capacity(plans))
    padded = [p.padded(cap) for p in plans]
    assert all(q.group_counts() == cap and q.shape_key() == padded[0].shape_key() for q in padded)
    B = per_sample or 2
    img = torch.randn(B, 3, 224, 224, dtype=torch.float64, generator=gen)
    _assert_same(_loss_and_grads(model, img, plans[0]), _loss_and_grads(model, img, padded[0]))
    static = type(padded[0])(padded[0].arena.clone(), padded[0].layout)
    _assert_same(_loss_and_grads(model, img, static.copy_(padded[1])), _loss_and_grads(model, img, plans[1]))
    model = model.float()
    with greenmim.emulate_cuda():
        _assert_same(_loss_and_grads(model, img.float(), plans[2]), _loss_and_grads(model, img.float(), padded[2]),
                     exact=True)


def test_shape_keys_ignore_timings_costs_and_budget_flags():
    """Plans interchange on their shapes alone: the planner's timings, costs and whether its
    budget ran out change no view; the group counts do."""
    gen = torch.Generator().manual_seed(12)
    model = _model(torch.float32)
    p, = _plans(model, None, 1, gen)
    flipped = tuple(st._replace(partitions=tuple(q._replace(budget_exhausted=not q.budget_exhausted, cost=q.cost + 1.0,
                                                            lower_bound=q.lower_bound * 2, plan_us=q.plan_us + 3.0)
                                                 for q in st.partitions)) for st in p.layout.stages)
    other = greenmim.MaskPlan(p.arena.clone(), p.layout._replace(build_us=123.0, stages=flipped))
    assert other.shape_key() == p.shape_key()
    bigger = _grown(p, p.group_counts(), 1)
    assert p.padded(bigger).shape_key() != p.shape_key()
