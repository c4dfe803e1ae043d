"""The package on a real GPU (bench/gpu/run.sh runs these; without CUDA they skip visibly)."""
import pytest
import torch

import greenmim
from conftest import oracle_attention, random_stage_mask

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("per_sample", [False, True])
def test_attention_fwd_bwd_against_float64_oracle(dtype, per_sample):
    m = random_stage_mask(56, 8, 4 if per_sample else None)
    part = greenmim.testing.stage_partition(m, 7, 3, 128, device="cuda", cache=False)
    B = 1 if per_sample else 3
    qkv = torch.randn(B, part.num_tokens, 3, 4, 32, device="cuda").to(dtype).requires_grad_()
    bias = torch.randn(169, 4, device="cuda", requires_grad=True)
    o = greenmim.group_window_attention_packed(qkv, bias, part)
    g = torch.randn_like(o)
    o.backward(g)
    cpu = greenmim.testing.stage_partition(m, 7, 3, 128, cache=False)
    qkv64 = qkv.detach().cpu().double().requires_grad_()
    b64 = bias.detach().cpu().double().requires_grad_()
    o64 = oracle_attention(*qkv64.unbind(2), b64, cpu, 7)
    o64.backward(g.cpu().double())
    # d(bias) sums dS over every pair of a bucket: a looser bound (factor 8)
    for got, want, slack in ((o, o64, 1), (qkv.grad, qkv64.grad, 1), (bias.grad, b64.grad, 8)):
        err = float((got.detach().cpu().double() - want.detach()).abs().max())
        assert err <= TOL[dtype] * max(1.0, float(want.detach().abs().max())) * slack


def test_device_index_building_equals_host():
    for per_sample in (False, True):
        m = random_stage_mask(56, 8, 8 if per_sample else None)
        d = greenmim.testing.stage_partition(m, 7, 3, 128, device="cuda", cache=False)
        h = greenmim.testing.stage_partition(m, 7, 3, 128, cache=False)
        for f in ("gather", "scatter", "slot_window", "slot_coord", "token_window"):
            assert torch.equal(getattr(d, f).cpu(), getattr(h, f)), f


def test_encoder_bf16_autocast_matches_fp32_and_compiles():
    torch._dynamo.reset()
    cfg = dict(embed_dim=64, depths=(2, 2, 2, 2), num_heads=(2, 4, 8, 16))
    model = greenmim.VisibleSwinTransformer(**cfg).cuda()
    x = torch.randn(4, 3, 224, 224, device="cuda")
    plan = model.plan(greenmim.random_masks(4), device="cuda")
    ref = model.forward_features(x, plan)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model.forward_features(x, plan)      # attention ran in bf16 (the final LayerNorm is float32)
    assert float((out.float() - ref).abs().max()) < 0.1 * float(ref.abs().max())
    step = torch.compile(lambda img, p: model.forward_features(img, p).float().square().mean(), fullgraph=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = step(x, plan)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_all_visible_equals_timm_on_gpu():
    timm = pytest.importorskip("timm")
    cfg = dict(img_size=224, patch_size=4, embed_dim=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8), window_size=7)
    ref = timm.models.swin_transformer.SwinTransformer(num_classes=0, **cfg).cuda().eval()
    ours = greenmim.VisibleSwinTransformer(**cfg).cuda().eval()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 224, 224, device="cuda")
    with torch.no_grad():
        got = ours.forward_features(x, ours.plan(torch.ones(7, 7, dtype=torch.bool), device="cuda"))
        want = ref.forward_features(x).reshape(2, 49, -1)
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)


def _grads_close(model_a, model_b, rtol, atol):
    for (name, pa), pb in zip(model_a.named_parameters(), model_b.parameters()):
        if pa.grad is not None or pb.grad is not None:
            torch.testing.assert_close(pa.grad.cpu(), pb.grad.cpu(), rtol=rtol, atol=atol, msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("holes", [False, True])
def test_block_conv_gemm_path_and_fused_kernels_equal_the_reference(dtype, holes):
    """The block conv's CUDA default (a gather and cuBLAS) and its fused kernels (algo="fused")
    against the float64 CPU reference: output and every gradient, shared and per-sample masks,
    masks aligned to the blocks (no holes) or per token (holes)."""
    g = torch.Generator().manual_seed(21)
    for batch in (None, 3):
        B = 1 if batch is None else batch
        if holes:
            mask = torch.rand(B, 28, 28, generator=g) < 0.4
        else:
            mask = torch.stack([greenmim.random_masks(generator=g) for _ in range(B)]).repeat_interleave(4, 1) \
                .repeat_interleave(4, 2)
        mask = mask[0] if batch is None else mask
        for s, C, Co in ((2, 64, 96), (4, 24, 40)):
            bt = greenmim.conv_tables.block_table(mask, s, cache=False)
            assert bool(bt.holes) == holes
            x = torch.randn(2 if batch is None else 1, bt.num_inputs, C, dtype=torch.float64)
            w, b = torch.randn(Co, C, s, s, dtype=torch.float64) * 0.1, torch.randn(Co, dtype=torch.float64)
            ins = [t.clone().requires_grad_() for t in (x, w, b)]
            want = greenmim.conv_ops.block_conv(ins[0], bt, ins[1], ins[2], algo="reference")
            dy = torch.randn_like(want)
            want_g = torch.autograd.grad(want, ins, dy)
            btc = greenmim.conv_tables.block_table(mask.cuda(), s, cache=False)
            for algo in ("auto", "fused"):
                got_in = [x.to("cuda", dtype).requires_grad_(), w.float().cuda().requires_grad_(),
                          b.float().cuda().requires_grad_()]
                got = greenmim.conv_ops.block_conv(got_in[0], btc, got_in[1], got_in[2], algo=algo)
                got_g = torch.autograd.grad(got, got_in, dy.to("cuda", dtype))
                tol = TOL[dtype] * (4 if dtype != torch.float32 else 10)
                for name, a, e in (("y", got, want), *zip(("dx", "dw", "db"), got_g, want_g)):
                    torch.testing.assert_close(a.detach().double().cpu(), e.detach(), rtol=tol,
                                               atol=tol * float(e.abs().max()), msg=f"{algo} {name}")


@pytest.mark.parametrize("per_sample", [False, True])
def test_twins_on_cuda_equals_cpu(per_sample):
    """VisibleTwins through the CUDA kernels (LSA attention, PEG depthwise conv, GSA and patch
    embedding block convs) against the CPU path, fp32, features and every parameter's gradient."""
    import copy
    torch.manual_seed(0)
    cpu = greenmim.VisibleTwins(embed_dims=(32, 64, 128, 256), num_heads=(1, 2, 4, 8), depths=(2, 2, 2, 2)).eval()  # head_dim 32
    gpu = copy.deepcopy(cpu).cuda()
    masks = greenmim.random_masks(3 if per_sample else None)
    x = torch.randn(3, 3, 224, 224)
    outs = []
    for model, dev in ((cpu, "cpu"), (gpu, "cuda")):
        f = model.forward_features(x.to(dev), model.plan(masks, device=dev))
        f.square().mean().backward()
        outs.append(f.detach().cpu())
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-4)
    _grads_close(gpu, cpu, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("per_sample", [False, True])
def test_greenmim_loss_on_cuda_equals_cpu(per_sample):
    """The whole pretraining model (encoder, decoder, masked-unit loss) on CUDA equals the CPU."""
    import copy
    torch.manual_seed(0)
    cpu = greenmim.create_model("green_mim_swin_nano_patch4_dec128b1")
    gpu = copy.deepcopy(cpu).cuda()
    masks = greenmim.random_masks(4 if per_sample else None)
    x = torch.randn(4, 3, 224, 224)
    losses = []
    for model, dev in ((cpu, "cpu"), (gpu, "cuda")):
        loss, _, _ = model(x.to(dev), model.plan(masks, device=dev))
        loss.backward()
        losses.append(loss.detach().cpu())
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-5)
    _grads_close(gpu, cpu, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("name", ["green_mim_swin_nano_patch4_dec128b1", "green_mim_twins_nano_patch4_dec128b1"])
@pytest.mark.parametrize("per_sample", [False, True])
def test_cuda_graph_steps_equal_eager_steps(per_sample, name):
    """greenmim.pretrain --cuda_graphs' GraphedStep with a real CUDA graph (fused, capturable AdamW,
    a device-tensor learning rate, padded plans; one overflow) against eager steps of a twin
    model on the same batches, float32."""
    from greenmim.pretrain import data, graphs, optim
    pair = []
    for _ in range(2):
        torch.manual_seed(0)
        m = greenmim.create_model(name).cuda()
        pair.append((m, torch.optim.AdamW(optim.param_groups(m, 0.05), lr=1e-3, betas=(0.9, 0.95), fused=True,
                                          capturable=True)))
    (ref, ref_opt), (model, opt) = pair
    graphs.tensor_lr(ref_opt, torch.device("cuda"))
    graphs.tensor_lr(opt, torch.device("cuda"))
    B = 4
    geo = data.Geometry(model, fixed_groups=True)
    geo.capacity = geo.capacity_for(B, per_sample, 0.75, seed=3, samples=16)
    step = graphs.GraphedStep(model, lambda x, p: model(x, p)[0], opt, None, torch.device("cuda"), geo.capacity)
    gen = torch.Generator().manual_seed(5)
    over, held = 0, []
    for k in range(6):
        for o in (ref_opt, opt):
            optim.set_lr(o, 1e-3 * (1 - 0.1 * k))
        masks = ref.random_masks(B if per_sample else None, generator=gen)
        plan = model.plan(masks, cache=False) if k == 3 else geo.plan(masks)   # k = 3: G swept, not padded
        over += plan.group_counts() != geo.capacity
        img = torch.randn(B, 3, 224, 224, generator=gen).cuda()
        ref_opt.zero_grad(set_to_none=True)
        want = ref(img, plan.to("cuda"))[0]
        want.backward()
        ref_opt.step()
        got = step.step(img, plan.pin_memory())
        torch.testing.assert_close(got, want.detach(), rtol=1e-4, atol=1e-6)
        torch.cuda.synchronize()
        held.append(torch.cuda.memory_allocated())
    assert step.replays + step.overflows == 6 and step.overflows == over
    # the overflow (k = 3) keeps none of its gradients: what is allocated after it is what was before
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert held[3] - held[2] < grad_bytes // 4, (held, grad_bytes)
    for (n, p), q in zip(ref.named_parameters(), model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-3, atol=1e-5, msg=n)


@pytest.mark.parametrize("per_sample", [False, True])
def test_pretrain_cuda_graphs_replays_and_tracks_eager(tmp_path, per_sample):
    """The trainer's own --cuda_graphs path (loader workers, uint8 images normalised inside the
    graph, padded plans, the warm-up undone) captures without falling back, replays, and its
    losses follow an eager run of the same seed (float32, --amp off). A capture that fails only
    warns and trains on eagerly, so this test is what notices one (H100 2026-11-26d: a host copy
    in the normalisation did)."""
    pytest.importorskip("skimage")
    pytest.importorskip("torchvision")
    from greenmim.pretrain import args as pargs, dist, engine
    runs = {}
    for mode in ("eager", "graphs"):
        argv = ["--model", "green_mim_swin_nano_patch4_dec128b1", "--batch_size", "8", "--epochs", "2",
                "--warmup_epochs", "1", "--lr", "1e-3", "--max_steps", "8", "--num_workers", "1", "--amp", "off",
                "--vis_freq", "100", "--save_freq", "100", "--output_dir", str(tmp_path / mode), "--device", "cuda"]
        argv += ["--per_sample_masks"] * per_sample + (["--cuda_graphs"] if mode == "graphs" else ["--eager"])
        args = pargs.parser().parse_args(argv)
        pargs.validate(args)
        ctx = dist.setup(args.device, args.fsdp)
        try:
            runs[mode] = engine.run(args, ctx)
        finally:
            dist.teardown(ctx)
    g = runs["graphs"]
    assert g["graph_failure"] is None, g["graph_failure"]
    assert g["graph_replays"] >= 6 and g["graph_replays"] + g["graph_overflows"] == 8
    torch.testing.assert_close(torch.tensor(g["losses"]), torch.tensor(runs["eager"]["losses"]), rtol=1e-4, atol=1e-5)
