"""From masks to stage plans: token counts, partition invariants, merge indices, caching, errors."""
import pytest
import torch

import greenmim
from greenmim import GreenmimError
from conftest import random_stage_mask, token_coords


def _check_partition(part, mask):
    """Every token in exactly one slot, padding consistent, coordinates = the mask's visible
    positions in row-major order (sample-major with per-sample masks), windows as geometry."""
    M = mask.shape[0] if mask.dim() == 3 else 1
    m = mask if mask.dim() == 3 else mask.unsqueeze(0)
    pos = torch.nonzero(m)                      # (b, h, w) row-major, sample-major
    assert part.num_tokens == pos.shape[0]
    g, s = part.gather.long(), part.scatter.long()
    assert torch.equal(g[s], torch.arange(part.num_tokens))
    pad = g < 0
    assert torch.equal(pad, part.slot_window < 0)
    assert int((~pad).sum()) == part.num_tokens
    h, w = token_coords(part)
    assert torch.equal(h, pos[:, 1]) and torch.equal(w, pos[:, 2])
    off = (part.window - part.shift) % part.window
    H, W = m.shape[1:]
    nww = (W - 1 + off) // part.window + 1
    nwh = (H - 1 + off) // part.window + 1
    want_window = pos[:, 0] * (nwh * nww) + ((h + off) // part.window) * nww + (w + off) // part.window
    assert torch.equal(part.token_window.long(), want_window)
    assert torch.equal(part.slot_window.long()[s], want_window)
    fills = (~pad).view(part.num_groups, part.group_size).sum(1)
    assert int(fills.max()) <= part.group_size
    assert part.cost >= part.lower_bound > 0


@pytest.mark.parametrize("per_sample", [False, True])
def test_plan_masks_swin_b(per_sample):
    vis = greenmim.random_masks(4 if per_sample else None)
    plan = greenmim.plan_masks(vis, cache=False)
    assert plan.per_sample == per_sample and len(plan.stages) == 4
    units = vis.view(-1, 49).sum(1)
    for s, st in enumerate(plan.stages):
        per_unit = (8 >> s) ** 2
        assert st.num_tokens == int(units.sum()) * per_unit if per_sample else int(units[0]) * per_unit
        for part in st.partitions:
            _check_partition(part, st.visible if per_sample else st.visible[0])
        if per_sample:
            counts = st.visible.flatten(1).sum(1)
            assert torch.equal(st.cu_seqlens[1:] - st.cu_seqlens[:-1], counts)
    # stage 4 (7x7 grid, window 7): one window, no shift
    assert plan.stages[3].partitions[1].shift == 0 and plan.stages[3].partitions[1].window == 7


def test_merge_indices_follow_swin_order():
    for batch in (None, 3):
        m = random_stage_mask(28, 4, batch)
        merge = greenmim.testing.merge_indices(m)
        m3 = m if batch else m.unsqueeze(0)
        pos = torch.nonzero(m3)
        nxt = torch.nonzero(m3[:, ::2, ::2])
        assert merge.shape == (nxt.shape[0], 4)
        for k, (dh, dw) in enumerate(((0, 0), (1, 0), (0, 1), (1, 1))):
            src = pos[merge[:, k]]
            assert torch.equal(src[:, 0], nxt[:, 0])
            assert torch.equal(src[:, 1], 2 * nxt[:, 1] + dh) and torch.equal(src[:, 2], 2 * nxt[:, 2] + dw)


def test_cache_hits_and_distinguishes():
    greenmim.clear_cache()
    m = random_stage_mask(28, 4)
    a = greenmim.testing.stage_partition(m, 7, 3, 128)
    assert greenmim.testing.stage_partition(m.clone(), 7, 3, 128) is a
    assert greenmim.testing.stage_partition(m, 7, 0, 128) is not a
    m2 = m.clone()
    m2[0:4, 0:4] = ~m2[0:4, 0:4]
    assert greenmim.testing.stage_partition(m2, 7, 3, 128) is not a


def test_fixed_group_size_and_strategies():
    m = random_stage_mask(56, 8)
    base = greenmim.testing.stage_partition(m, 7, 0, 128, cache=False)
    for strat in ("paper", "per-window", "single"):
        p = greenmim.testing.stage_partition(m, 7, 0, 128, strategy=strat, cache=False)
        _check_partition(p, m)
        if strat == "paper":
            assert base.cost <= p.cost + 1e-6          # ours is never costlier than Algorithm 1
    fixed = greenmim.testing.stage_partition(m, 7, 0, 128, group_size=64, cache=False)
    assert fixed.group_size == 64
    _check_partition(fixed, m)


def test_errors():
    with pytest.raises(GreenmimError, match="bool"):
        greenmim.plan_masks(torch.ones(7, 7, dtype=torch.uint8))
    with pytest.raises(GreenmimError, match="no visible"):
        greenmim.plan_masks(torch.zeros(7, 7, dtype=torch.bool))
    with pytest.raises(GreenmimError, match="does not tile"):
        greenmim.plan_masks(torch.ones(5, 5, dtype=torch.bool))
    pixels = torch.rand(56, 56) < 0.5           # patch-resolution noise: 2x2 blocks partly visible
    with pytest.raises(GreenmimError, match="partly visible"):
        greenmim.plan_masks(pixels)
    with pytest.raises(GreenmimError, match="unknown strategy"):
        greenmim.testing.stage_partition(random_stage_mask(14, 7), 7, 0, 64, strategy="best")
    with pytest.raises(GreenmimError, match="group_size"):
        greenmim.testing.stage_partition(torch.ones(14, 14, dtype=torch.bool), 7, 0, 64, group_size=10, cache=False)
    with pytest.raises(GreenmimError, match="shift"):
        greenmim.testing.stage_partition(random_stage_mask(14, 7), 7, 7, 64)


def test_random_masks():
    g = torch.Generator().manual_seed(0)
    m = greenmim.random_masks(8, generator=g)
    assert m.shape == (8, 7, 7) and torch.all(m.view(8, -1).sum(1) == 12)
    assert greenmim.random_masks().sum() == 12


def test_window_geometry_small_stage_rule_and_refusal():
    assert greenmim.testing.window_geometry(56, 56, 7, 3) == (7, 3, 81)     # shifted: 9 x 9 windows
    assert greenmim.testing.window_geometry(56, 56, 7, 0) == (7, 0, 64)
    assert greenmim.testing.window_geometry(7, 7, 7, 3) == (7, 0, 1)         # grid <= window: one, no shift
    assert greenmim.testing.window_geometry(6, 6, 12, 6) == (6, 0, 1)
    with pytest.raises(GreenmimError, match="window geometry"):
        greenmim.testing.window_geometry(0, 5, 7, 0)


def _three_full_windows_and_a_few(grid, window, few):
    """A [grid, grid] mask of 2 x 2 windows: three fully visible, the fourth with `few` tokens.
    The planner's free optimum then packs the few tokens with a full window (G = p*p + few:
    three groups instead of four), above the tensor-core limit for p = 16."""
    m = torch.ones(grid, grid, dtype=torch.bool)
    fourth = torch.zeros(window * window, dtype=torch.bool)
    fourth[:few] = True
    m[window:, window:] = fourth.view(window, window)
    return m


@pytest.mark.parametrize("emulated", [False, True])
def test_max_group_size_keeps_window16_on_the_tensor_core_limit(emulated):
    m = _three_full_windows_and_a_few(32, 16, 10)
    ctx = greenmim.emulate_cuda() if emulated else torch.no_grad()
    with ctx:
        free = greenmim.testing.stage_partition(m, 16, 0, 256, max_group_size=0, cache=False)
        auto = greenmim.testing.stage_partition(m, 16, 0, 256, cache=False)          # default: capped at 256
        explicit = greenmim.testing.stage_partition(m, 16, 0, 256, max_group_size=256, cache=False)
    assert (free.group_size, free.num_groups) == (266, 3)
    assert (auto.group_size, auto.num_groups) == (256, 4)
    assert torch.equal(auto.gather, explicit.gather)
    _check_partition(auto, m)
    assert auto.cost > free.cost                      # the cap costs FLOPs here (free is exact: 4 windows)
    assert auto.cost >= auto.lower_bound >= free.lower_bound > 0   # both bounds tight (exact for <= 16 windows)
    # windows of 7 at C = 256: one group of all 161 tokens free (also the default: 161 <= 256);
    # under a cap of 64, the few tokens ride with a full window (G = 63, three groups)
    m7 = _three_full_windows_and_a_few(14, 7, 14)
    assert greenmim.testing.stage_partition(m7, 7, 0, 256, cache=False).group_size == 161
    capped = greenmim.testing.stage_partition(m7, 7, 0, 256, max_group_size=64, cache=False)
    assert (capped.group_size, capped.num_groups) == (63, 3)
    _check_partition(capped, m7)


def test_max_group_size_default_by_window_and_refusals():
    # windows above 16 (p*p > 256) are not capped by default: they need G > 256 anyway
    m = torch.ones(34, 34, dtype=torch.bool)
    assert greenmim.testing.stage_partition(m, 17, 0, 64, cache=False).group_size >= 289
    # a fixed group size is left alone by the default cap
    assert greenmim.testing.stage_partition(torch.ones(14, 14, dtype=torch.bool), 7, 0, 64, group_size=300,
                                    cache=False).group_size == 196
    # the cached plan of one cap is not served for another
    m16 = _three_full_windows_and_a_few(32, 16, 10)
    assert greenmim.testing.stage_partition(m16, 16, 0, 256).group_size == 256
    assert greenmim.testing.stage_partition(m16, 16, 0, 256, max_group_size=0).group_size == 266
    full = torch.ones(14, 14, dtype=torch.bool)
    with pytest.raises(GreenmimError, match="max_group_size 40"):
        greenmim.testing.stage_partition(full, 7, 0, 64, max_group_size=40, cache=False)   # a window of 49 > 40
    with pytest.raises(GreenmimError, match="max_group_size must be >= 0"):
        greenmim.testing.stage_partition(full, 7, 0, 64, max_group_size=-3, cache=False)
    with pytest.raises(GreenmimError, match="fast and paper"):
        greenmim.testing.stage_partition(full, 7, 0, 64, strategy="single", max_group_size=256, cache=False)
    with pytest.raises(GreenmimError, match="group_size 100 > max_group_size 64"):
        greenmim.testing.stage_partition(full, 7, 0, 64, group_size=100, max_group_size=64, cache=False)
    with greenmim.emulate_cuda(), pytest.raises(GreenmimError, match="max_group_size 40"):
        greenmim.testing.stage_partition(full, 7, 0, 64, max_group_size=40, cache=False)


@pytest.mark.parametrize("per_sample", [False, True])
@pytest.mark.parametrize("geometry", [(224, 7, 7), (192, 6, 6), (256, 16, 8)])
def test_plan_masks_equals_stage_partition(per_sample, geometry):
    """plan_masks (one call, one arena) builds what stage_partition builds stage by stage."""
    img, window, units = geometry
    vis = greenmim.random_masks(3 if per_sample else None, grid=units)
    plan = greenmim.plan_masks(vis, img_size=img, window_size=window, embed_dim=32, cache=False)
    covered = 0
    for s, st in enumerate(plan.stages):
        m = st.visible if per_sample else st.visible[0]
        for k, part in enumerate(st.partitions):
            want = greenmim.testing.stage_partition(m, window, k * (window // 2), 32 << s, cache=False)
            for name in ("gather", "scatter", "slot_window", "slot_coord", "token_window"):
                assert torch.equal(getattr(part, name), getattr(want, name)), (s, k, name)
            assert (part.group_size, part.num_groups, part.window, part.shift) == \
                (want.group_size, want.num_groups, want.window, want.shift)
            assert part.cost == pytest.approx(want.cost)
        if s + 1 < len(plan.stages):
            assert torch.equal(st.merge.long(), greenmim.testing.merge_indices(m))
        covered += st.position.numel()
    assert plan.patch_index.numel() == plan.stages[0].num_tokens
    assert plan.stages[-1].unit_rank.shape == (3 if per_sample else 1, units * units)


def test_mask_plan_pickles_moves_and_caches():
    import pickle
    greenmim.clear_cache()
    vis = greenmim.random_masks(4)
    plan = greenmim.plan_masks(vis)
    assert greenmim.plan_masks(vis.clone()) is plan                  # a hit: the same object
    assert greenmim.plan_masks(vis, max_group_size=0) is not plan    # other settings: another plan
    back = pickle.loads(pickle.dumps(plan))
    assert back is not plan and torch.equal(back.arena, plan.arena)
    for a, b in zip(back.stages, plan.stages):
        for pa, pb in zip(a.partitions, b.partitions):
            assert torch.equal(pa.gather, pb.gather) and pa.group_size == pb.group_size
        # every array is a view of the one arena
        assert a.partitions[0].gather.untyped_storage().data_ptr() == back.arena.untyped_storage().data_ptr()
    assert plan.to("cpu") is plan and plan.to("meta").device.type == "meta"
    vis[0, 0, 0] = ~vis[0, 0, 0]
    assert greenmim.plan_masks(vis) is not plan
    with pytest.raises(GreenmimError, match="max_group_size must be >= 0"):
        greenmim.plan_masks(vis, max_group_size=-1)
    with pytest.raises(GreenmimError, match="halve"):
        greenmim.plan_masks(torch.ones(3, 3, dtype=torch.bool), img_size=12, patch_size=1)


@pytest.mark.parametrize("kind", ["swin", "twins"])
def test_plan_views_are_made_on_first_use_and_equal_eager_ones(kind):
    """A plan's stages (its views of the arena) are made on first use: planning, group_counts,
    padded, shape_key and pickling (a DataLoader worker's whole use of a plan) make none, and
    the views made later are the arena's, equal to a plan that made them at once."""
    import pickle
    g = torch.Generator().manual_seed(11)
    masks = greenmim.random_masks(5, generator=g)
    make = (lambda m: greenmim.plan_masks(m, cache=False, group_size=-1)) if kind == "swin" else \
        (lambda m: greenmim.plan_twins(m, cache=False, group_size=-1))
    plan = make(masks)
    counts = plan.group_counts()
    wider = tuple(tuple(c + 1 for c in cs) for cs in counts)
    padded = plan.padded(wider)
    padded.shape_key()
    back = pickle.loads(pickle.dumps(padded))
    assert plan._stages is None and padded._stages is None and back._stages is None
    ref = make(masks)
    ref.stages                                               # made at once
    assert plan.stages is plan.stages                        # made once
    for a, b in zip(plan.stages, ref.stages):
        for pa, pb in zip(a.partitions, b.partitions):
            for name in ("gather", "scatter", "slot_window", "slot_coord"):
                ta, tb = getattr(pa, name), getattr(pb, name)
                assert torch.equal(ta, tb) and ta.untyped_storage().data_ptr() == plan.arena.untyped_storage().data_ptr()
            assert pa.num_groups == pb.num_groups
    assert torch.equal(plan.patch_index, ref.patch_index)
    assert back.group_counts() == wider and [p.num_groups for p in back.stages[0].partitions] == list(wider[0])
