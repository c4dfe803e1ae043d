"""Dispatch of greenmim's ops (this file was ``_eager.py``): their registration as custom ops and
the eager fast path, the same Python implementations and autograd formulas as the custom
ops, called without the dispatcher when nothing needs it.

Each op is a ``torch.library.custom_op`` (ops.py, conv_ops.py), which is what ``torch.compile``,
fake tensors, ``FlopCounterMode``, ``torch.func`` and tensor subclasses (FSDP2's DTensor) see.
A custom op call costs its dispatch, though: on the CPU that trains next to a GPU, a
partition + attention + unpartition block spent about 0.65 ms of host time in it, forward only,
against a few microseconds for a plain torch op (``bench/op_overhead.py``). That was more than the
kernels' time at Swin-B's and Twins-L's shapes (docs/perf/NVIDIA_H200_2026-11-26).

:func:`call` therefore runs an op's implementation directly, with its registered autograd as a
``torch.autograd.Function``. It does so only in plain eager mode: not while compiling or
tracing (jit, FX), with no dispatch or function mode active (FlopCounterMode, FakeTensorMode,
...), no functorch transform, and plain tensors or parameters only. Anything else goes through
``torch.ops.greenmim``, as before. With grad mode off (a normal backward, ``no_grad``, inference)
every op runs its implementation alone; with it on, a forward op runs through its Function and a
backward op (no autograd of its own) goes to the custom op, so a double backward still reaches the
custom op and its error. Both paths run the same code, so they agree bit for bit
(tests/test_ops.py). The host time per call is ``bench/op_overhead.py``'s (docs/perf/kernel-journal.md). ``GREENMIM_EAGER_DISPATCH=1`` in
the environment sends every call through the dispatcher (an A/B switch for benchmarks, and an
escape hatch).
"""
from __future__ import annotations

import contextlib
import os
from typing import Callable, Dict

import torch
import torch.fx._symbolic_trace as _fx

LIB = "greenmim"

_impls: Dict[str, Callable] = {}                          # op name -> its Python implementation
_functions: Dict[str, type] = {}                          # forward op name -> autograd.Function
_PLAIN = (torch.Tensor, torch.nn.Parameter)


class _State:
    """Process-wide, not per thread: backward ops run on autograd's device threads."""
    off = False
    calls = 0


_state = _State()
_fx_tracing = getattr(_fx, "is_fx_symbolic_tracing", None) or (lambda: getattr(_fx, "_is_fx_tracing_flag", False))
# torch.jit.is_tracing() outside TorchScript is this call (its is_scripting() test is False there)
_jit_tracing = getattr(torch._C, "_is_tracing", torch.jit.is_tracing)
_ALWAYS_DISPATCH = os.environ.get("GREENMIM_EAGER_DISPATCH", "0") not in ("", "0")


def op(name: str):
    """``@op("attention_fwd")``: ``torch.library.custom_op("greenmim::attention_fwd")``, keeping
    the undecorated function for the fast path."""
    def wrap(fn: Callable):
        _impls[name] = fn
        return torch.library.custom_op(f"{LIB}::{name}", mutates_args=())(fn)
    return wrap


def register_autograd(name: str, backward: Callable, setup_context: Callable) -> None:
    """``torch.library.register_autograd`` for the custom op, and the same formulas as the fast
    path's autograd.Function. ``backward`` returns gradients shaped as the op's inputs (a list of
    Nones for a list input): the Function gives a single None for such an input."""
    torch.library.register_autograd(f"{LIB}::{name}", backward, setup_context=setup_context)
    impl = _impls[name]

    def fn_forward(ctx, *args):  # forward(ctx, ...): a separate setup_context costs a signature bind per call
        out = impl(*args)
        setup_context(ctx, args, out)
        return out

    def fn_backward(ctx, *grads):
        return tuple(None if isinstance(g, list) else g for g in backward(ctx, *grads))

    cls = type(f"_{name}", (torch.autograd.Function,), {
        "forward": staticmethod(fn_forward),
        "backward": staticmethod(fn_backward),
    })
    _functions[name] = cls
    _appliers[name] = _c_apply.__get__(None, cls)


# torch.autograd.Function.apply is Python: it binds default arguments (for a Function with a
# separate setup_context: these have none) and unwraps functorch's dead wrappers (a pytree walk
# over the arguments) before the C apply, a few us per call. :func:`call` takes the fast path
# only for plain tensors that no functorch wrapper holds (with no transform active, a wrapped
# tensor is a dead one: those go through the dispatcher, which unwraps them), where both steps do
# nothing, so it calls the C apply (``_FunctionBase.apply``, what Function.apply ends in) directly.
_c_apply = torch._C._FunctionBase.__dict__["apply"]
_appliers: Dict[str, Callable] = {}                       # forward op name -> its C apply
_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
_Tensor = torch.Tensor


@contextlib.contextmanager
def disabled():
    """Within this context every op goes through ``torch.ops.greenmim``, in every thread (tests and
    benchmarks compare the paths; backward ops run on autograd's threads)."""
    old = _state.off
    _state.off = True
    try:
        yield
    finally:
        _state.off = old


def fast_calls() -> int:
    """How many calls took the fast path in this process (tests check that eager code takes it)."""
    return _state.calls


def _eager_only() -> bool:
    if torch.compiler.is_compiling() or _ALWAYS_DISPATCH or _state.off:
        return False
    return not (torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled()
                or torch._C._are_functorch_transforms_active() or _jit_tracing() or _fx_tracing())


def _plain(args) -> bool:
    """Every tensor argument (and those in list arguments) a plain tensor or parameter that no
    functorch wrapper holds."""
    for a in args:
        if isinstance(a, list):
            for t in a:
                if isinstance(t, _Tensor) and (type(t) not in _PLAIN or _wrapped(t)):
                    return False
        elif isinstance(a, _Tensor) and (type(a) not in _PLAIN or _wrapped(a)):
            return False
    return True


# Ops whose index argument (the partition's four tensors and the scalars after them) is an
# _attention_abi.Index on the fast path: the public function has looked it up (and its checks'
# entry, ``known``) once, and the implementation and the Function take it whole, instead of a list
# the implementation looks up again. The Function keeps the Index on its context (its tensors are
# not saved tensors: its backward checks their versions itself) and has one output, the op's first
# (the other, the attention's log-sum-exp, is a saved intermediate): see ops.py.
_ix_impls: Dict[str, Callable] = {}                       # op name -> implementation taking an Index
_ix_appliers: Dict[str, Callable] = {}                    # forward op name -> its Function's C apply


def indexed(name: str, impl: Callable, function: type = None) -> None:
    """The fast path of op ``name`` as ``impl(*tensors, ix, *rest)`` (the op's arguments with an
    Index for its index list and the scalars that :meth:`Index.op_args` gives), and for a forward
    op its ``function``: an autograd.Function of the same arguments that returns impl's first output."""
    _ix_impls[name] = impl
    if function is not None:
        _ix_appliers[name] = _c_apply.__get__(None, function)


def _indexed_fast(tensors: tuple, ix) -> bool:
    """The fast path's conditions, for index tensors that passed their checks unchanged as plain
    tensors (``ix.known.plain``)."""
    known = ix.known
    return known is not None and known.plain and type(tensors[0]) in _PLAIN and _eager_only() and _plain(tensors)


def forward_indexed(name: str, tensors: tuple, ix, *rest):
    """The first output of ``call(name, *tensors, *ix.op_args(), *rest)`` for a forward op
    registered with :func:`indexed`, taking ``ix`` whole on the fast path."""
    if _indexed_fast(tensors, ix):
        _state.calls += 1
        if not torch.is_grad_enabled():
            return _ix_impls[name](*tensors, ix, *rest)[0]
        return _ix_appliers[name](*tensors, ix, *rest)
    return call(name, *tensors, *ix.op_args(), *rest)[0]


def call_indexed(name: str, tensors: tuple, ix, *rest):
    """``call(name, *tensors, *ix.op_args(), *rest)`` for a backward op registered with
    :func:`indexed`: its implementation with ``ix`` whole where grad mode is off and the fast path
    applies; else :func:`call` decides (with grad mode on, the custom op: a double backward meets its
    error)."""
    if not torch.is_grad_enabled() and _indexed_fast(tensors, ix):
        _state.calls += 1
        return _ix_impls[name](*tensors, ix, *rest)
    return call(name, *tensors, *ix.op_args(), *rest)


def call(name: str, *args):
    """``torch.ops.greenmim.<name>(*args)``, or its implementation directly where that is the same:
    every tensor argument, and those in list arguments, a plain tensor or parameter (the first
    argument, the features, must be one: an FX proxy is not)."""
    if type(args[0]) in _PLAIN and _eager_only() and _plain(args):
        if not torch.is_grad_enabled():          # no graph to record (a backward, no_grad, inference):
            _state.calls += 1                    # the implementation alone (the Function would only
            return _impls[name](*args)           # make and fill a context nobody reads)
        f = _appliers.get(name)
        if f is not None:
            _state.calls += 1
            return f(*args)
    return getattr(torch.ops.greenmim, name)(*args)
