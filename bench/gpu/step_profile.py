"""Where a training step's time goes, by category, from a torch.profiler run (train_step.py --trace).

``categories(prof, steps, wall_ms)`` sums the profiler's events of ``steps`` steps into the
categories below, per step, on the host (each event's self CPU time, on every thread: the
forward's thread and autograd's) and on the GPU (each kernel's and copy's duration):

- ``launches``: the CUDA runtime's launch, copy and memset calls (cudaLaunchKernel, ...);
- ``sync``: host waits on the device (cudaStreamSynchronize, cudaDeviceSynchronize, ...);
- ``allocator``: tensor allocation and freeing (aten::empty*, new_empty, resize_, cudaMalloc);
- ``GEMM``: matrix products and convolutions (aten::mm/addmm/bmm/linear/convolution; cuBLAS,
  CUTLASS and cuDNN kernels);
- ``attention (torch)``: torch's fused attention (scaled_dot_product_attention; flash and
  memory-efficient kernels): the baselines' attention;
- ``norm``: layer, batch and group norms;
- ``optimizer``: the optimizer step (Optimizer.step, fused or foreach AdamW and its kernels);
- ``casts``: dtype conversions and copies (aten::to, _to_copy, copy_; direct_copy kernels);
- ``greenmim ops``: greenmim's ops, eager fast path (its autograd Functions, named after the ops,
  and their backward nodes), custom-op path (greenmim::*) and kernels (greenmim::detail::*);
- ``other ops``: every other event (elementwise, reductions, autograd bookkeeping, ...);
- ``untracked host``: the host's wall time not inside any event (Python between ops), and on the
  GPU ``idle``: wall time with no kernel running.

An event's self time excludes the events it encloses, so no time is counted twice on one thread;
the backward's host time runs on autograd's thread on CUDA, beside the forward thread's wait,
which makes the host column add up to more than the wall time there.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

CATEGORIES = ("launches", "sync", "allocator", "GEMM", "attention (torch)", "norm", "optimizer", "casts",
              "greenmim ops", "other ops")

_GREENMIM_OPS = ("attention_fwd", "attention_bwd", "attention_packed_fwd", "attention_packed_bwd", "partition",
                 "unpartition", "depthwise_conv3x3_fwd", "depthwise_conv3x3_bwd", "block_conv_fwd", "block_conv_bwd")
# the eager fast path's autograd Functions are named "_<op>" (greenmim/_dispatch.py), their nodes "_<op>Backward"
_GREENMIM_NAMES = {f"_{n}" for n in _GREENMIM_OPS} | {f"_{n}Backward" for n in _GREENMIM_OPS}

_HOST_RULES: List[Tuple[str, Tuple[str, ...]]] = [
    ("sync", ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaStreamWaitEvent")),
    ("launches", ("cudaLaunch", "cuLaunch", "cudaMemcpy", "cudaMemset", "cudaGraphLaunch", "cudaEventRecord")),
    ("allocator", ("aten::empty", "aten::new_empty", "aten::resize_", "aten::zeros", "aten::new_zeros",
                   "cudaMalloc", "cudaFree", "[memory]")),
    ("optimizer", ("Optimizer.step", "Optimizer.zero_grad", "_fused_adam", "aten::_foreach", "adamw")),
    ("attention (torch)", ("scaled_dot_product", "flash_attention", "efficient_attention", "_flash_attention")),
    ("GEMM", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
              "aten::convolution", "aten::_convolution", "aten::cudnn_convolution", "aten::conv",
              "aten::mkldnn_convolution", "aten::convolution_backward", "aten::_scaled_mm")),
    ("norm", ("layer_norm", "batch_norm", "group_norm", "rms_norm")),
]
_CASTS = {"aten::to", "aten::_to_copy", "aten::copy_", "aten::type_as"}     # exact names (aten::topk is no cast)
_GPU_RULES: List[Tuple[str, Tuple[str, ...]]] = [
    ("greenmim ops", ("greenmim",)),
    ("optimizer", ("adam", "multi_tensor_apply", "foreach")),
    ("attention (torch)", ("flash", "fmha", "attention", "mem_eff")),
    ("GEMM", ("gemm", "cutlass", "xmma", "cublas", "sm90_", "sm80_", "cudnn", "conv", "nvjet", "ampere_", "hopper_")),
    ("norm", ("layer_norm", "layernorm", "batch_norm", "group_norm", "rms_norm")),
    ("casts", ("direct_copy", "copy_kernel", "cast")),
    ("launches", ("memcpy", "memset")),
]


def host_category(name: str) -> str:
    base = name.rsplit(": ", 1)[-1]          # "autograd::engine::evaluate_function: <node>"
    if base in _GREENMIM_NAMES or base.startswith("greenmim::"):
        return "greenmim ops"
    if name in _CASTS:
        return "casts"
    for cat, keys in _HOST_RULES:
        if any(k in name for k in keys):
            return cat
    return "other ops"


def gpu_category(name: str) -> str:
    low = name.lower()
    for cat, keys in _GPU_RULES:
        if any(k in low for k in keys):
            return cat
    return "other ops"


def categories(prof, steps: int, wall_ms: float) -> Dict[str, Dict[str, float]]:
    """{"host": {category: ms per step}, "gpu": {...}} (gpu empty without device events), with
    "untracked host" and "idle" from ``wall_ms``, the wall time of the ``steps`` profiled steps."""
    host = {c: 0.0 for c in CATEGORIES}
    gpu = {c: 0.0 for c in CATEGORIES}
    busy: List[Tuple[int, int]] = []
    seen_gpu = False
    for e in prof.events():
        dev = str(getattr(e, "device_type", "CPU")).rsplit(".", 1)[-1]
        if dev == "CPU":
            host[host_category(e.name)] += e.self_cpu_time_total / 1e3
        else:
            seen_gpu = True
            gpu[gpu_category(e.name)] += e.time_range.elapsed_us() / 1e3
            busy.append((e.time_range.start, e.time_range.end))
    out = {"host": {c: v / steps for c, v in host.items()}, "gpu": {}}
    out["host"]["untracked host"] = max(0.0, wall_ms - sum(host.values())) / steps
    if seen_gpu:
        merged, last = 0, None               # GPU busy time: the union of the kernels' intervals
        for s, t in sorted(busy):
            if last is None or s > last[1]:
                if last is not None:
                    merged += last[1] - last[0]
                last = [s, t]
            else:
                last[1] = max(last[1], t)
        if last is not None:
            merged += last[1] - last[0]
        out["gpu"] = {c: v / steps for c, v in gpu.items()}
        out["gpu"]["idle"] = max(0.0, wall_ms - merged / 1e3) / steps
    return out


def table(cats: Dict[str, Dict[str, float]], wall_ms_per_step: float) -> str:
    """Markdown: one row per category, host and GPU ms per step and their share of the wall time."""
    rows = ["| category | host ms/step | host % of wall | GPU ms/step | GPU % of wall |", "|---|---|---|---|---|"]
    gpu = cats["gpu"]
    for c in (*CATEGORIES, "untracked host", "idle"):
        h = cats["host"].get(c)
        g = gpu.get(c)
        if h is None and g is None:
            continue
        hs = f"{h:.3f} | {100 * h / wall_ms_per_step:.1f}" if h is not None else "- | -"
        gs = f"{g:.3f} | {100 * g / wall_ms_per_step:.1f}" if g is not None else "- | -"
        rows.append(f"| {c} | {hs} | {gs} |")
    rows.append(f"| wall | {wall_ms_per_step:.3f} | 100 | {wall_ms_per_step:.3f} | 100 |" if gpu else
                f"| wall | {wall_ms_per_step:.3f} | 100 | - | - |")
    return "\n".join(rows)
