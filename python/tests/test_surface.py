"""The public surface: a short ``greenmim.__all__``, the registry that builds every model, the old
names working for one release with a DeprecationWarning, and each model preset stated once (the
C++ CLI's copy in include/greenmim/models.hpp agrees with it)."""
import importlib
import os
import re
import sys
import warnings

import pytest
import torch

import greenmim
from greenmim import mim


def test_all_is_short_and_every_name_is_public_and_resolves():
    assert len(greenmim.__all__) <= 24, len(greenmim.__all__)
    assert len(set(greenmim.__all__)) == len(greenmim.__all__)
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # none of them is a deprecated alias
        for name in greenmim.__all__:
            assert not name.startswith("_") and getattr(greenmim, name) is not None, name
    assert set(greenmim.__all__).isdisjoint(greenmim._MOVED)


@pytest.mark.parametrize("name", sorted(greenmim._MOVED))
def test_old_names_warn_and_are_the_new_ones(name):
    module, attr = greenmim._MOVED[name]
    with pytest.warns(DeprecationWarning, match=f"greenmim.{name} is deprecated"):
        old = getattr(greenmim, name)
    assert old is getattr(importlib.import_module(f"greenmim.{module}"), attr)


def test_old_module_indices_warns_and_still_works():
    sys.modules.pop("greenmim.indices", None)
    with pytest.warns(DeprecationWarning, match="greenmim.indices is deprecated"):
        indices = importlib.import_module("greenmim.indices")
    plan = indices.plan_masks(indices.random_masks(generator=torch.Generator().manual_seed(0)), cache=False)
    assert isinstance(plan, greenmim.MaskPlan)
    part = indices.stage_partition(plan.stages[0].visible[0], 7, 3, 128, cache=False)
    assert torch.equal(part.gather, plan.stages[0].partitions[1].gather)


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        greenmim.nope


def test_registry_builds_encoders_as_their_factories_did():
    names = greenmim.model_names(encoders=True)
    assert set(mim.ENCODERS) <= set(names) and set(greenmim.model_names()) == set(mim._ARCHS) | set(mim.FCMAE_ARCHS)
    assert not set(mim.ENCODERS) & set(greenmim.model_names())     # the trainer's --model list is unchanged
    kw = dict(depths=(1, 1, 1, 1), img_size=64, window_size=2)     # small: the classes and presets are the subject
    for name, (cls, preset, _) in mim.ENCODERS.items():
        model = greenmim.create_model(name, **kw)
        assert type(model) is cls, name
        for k, v in preset.items():
            got = getattr(model, k, None)
            if got is not None and k not in kw:
                assert tuple(got) == tuple(v) if isinstance(v, tuple) else got == v, (name, k)
        with pytest.warns(DeprecationWarning):
            factory = getattr(greenmim, name)
        old = factory(**kw)
        assert [(k, v.shape) for k, v in old.state_dict().items()] == \
               [(k, v.shape) for k, v in model.state_dict().items()], name
    with pytest.raises(greenmim.GreenmimError, match="did you mean"):
        greenmim.create_model("swin_base_patch4_window7_22")


def _cli_presets():
    """include/greenmim/models.hpp's builtin_models and builtin_twins_models, parsed."""
    src = os.environ.get("GREENMIM_SOURCE_DIR") or os.path.join(os.path.dirname(__file__), "..", "..")
    path = os.path.join(src, "include", "greenmim", "models.hpp")
    if not os.path.exists(path):
        pytest.skip("models.hpp not found (set GREENMIM_SOURCE_DIR)")
    text = open(path).read()
    quad = r"\{\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+)\s*\}"
    swin = {m[0]: dict(channels=tuple(map(int, m[1:5])), heads=tuple(map(int, m[5:9])), depths=tuple(map(int, m[9:13])),
                       head_dim=int(m[13]), image=int(m[14]), patch=int(m[15]), window=int(m[16]))
            for m in re.findall(r'\{"([\w-]+)",\s*' + r",\s*".join([quad] * 3) + r",\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+)\}",
                                text)}
    twins = {m[0]: dict(channels=tuple(map(int, m[1:5])), heads=tuple(map(int, m[5:9])), depths=tuple(map(int, m[9:13])),
                        sr=tuple(map(int, m[13:17])), mlp=int(m[17]), image=int(m[18]), patch=int(m[19]),
                        window=int(m[20]))
             for m in re.findall(r'\{"([\w-]+)",\s*' + r",\s*".join([quad] * 4) + r",\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+)\}",
                                 text)}
    return swin, twins


def test_python_presets_agree_with_the_cli_copy():
    swin, twins = _cli_presets()
    assert len(swin) == 9 and len(twins) == 2, (sorted(swin), sorted(twins))
    py = {n: p for n, (_, p, _) in mim.ENCODERS.items()}
    py.update({n: a[1] for n, a in mim._ARCHS.items()})
    pairs = {"swin-b": "swin_base_patch4_window7_224", "swin-l": "swin_large_patch4_window7_224",
             "swin-b-w14": "green_mim_swin_base_patch4_win14_dec512b1",
             "swin-l-w14": "green_mim_swin_large_patch4_win14_dec512b1",
             "swin-b-192w6": "green_mim_swin_base_patch4_window6_192_dec512b1",
             "swin-l-192w6": "green_mim_swin_large_patch4_window6_192_dec512b1",
             **{n: n for n in swin if n.startswith("swinv2_")}}
    assert set(pairs) == set(swin)
    for cli, name in pairs.items():
        c, p = swin[cli], py[name]
        assert c["channels"] == tuple(p["embed_dim"] << s for s in range(4)), cli
        assert (c["heads"], c["depths"], c["image"], c["window"]) == \
               (tuple(p["num_heads"]), tuple(p["depths"]), p["img_size"], p["window_size"]), cli
        assert c["patch"] == p.get("patch_size", 4) and c["head_dim"] * c["heads"][0] == c["channels"][0], cli
    for cli, names in {"twins-b": ["twins_svt_base"],
                       "twins-l": ["twins_svt_large", "green_mim_twins_large_patch4_dec512b1"]}.items():
        c = twins[cli]
        for name in names:
            p = {"sr_ratios": (8, 4, 2, 1), "wss": (7, 7, 7, 7), "mlp_ratios": (4, 4, 4, 4), "img_size": 224,
                 **py[name]}                        # VisibleTwins' defaults where the preset says nothing
            assert (c["channels"], c["heads"], c["depths"], c["sr"]) == \
                   (tuple(p["embed_dims"]), tuple(p["num_heads"]), tuple(p["depths"]), tuple(p["sr_ratios"])), name
            assert (c["window"], c["image"], c["mlp"]) == (p["wss"][0], p["img_size"], p["mlp_ratios"][0]), name


@pytest.mark.parametrize("old,new", [("_eager", "_dispatch"), ("_backend", "_attention_abi"),
                                     ("_conv_backend", "_conv_abi")])
def test_renamed_layers_warn_and_are_the_new_modules(old, new):
    """The private layers took names that say what they are; the old module names are aliases of
    the new modules (the same object: patching either patches both) for one release."""
    sys.modules.pop(f"greenmim.{old}", None)
    with pytest.warns(DeprecationWarning, match=f"greenmim.{old} is deprecated"):
        mod = importlib.import_module(f"greenmim.{old}")
    assert mod is importlib.import_module(f"greenmim.{new}")
