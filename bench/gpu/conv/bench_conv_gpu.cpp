// greenmim_conv_gpu_bench: times the convolutions on visible tokens (kernels/conv.cu) at Twins-L
// shapes (224 px, mask ratio 0.75, batch 64 by default; one shared mask, or with --per-sample a mask
// per sample packed on one token axis, B = 1, as the package's trainer runs them; tokens block-major
// as greenmim.plan_twins orders them): PEG (depthwise 3x3,
// forward and backward with dweight/dbias) at stages 1-4, GSA sub-sampling (block conv sr 8/4/2,
// C -> C) at stages 1-3 and patch embedding (block conv s 2, C_i -> C_{i+1}) between stages,
// forward and backward. Per row: median time (cudaEvent around each launch queued behind a 50 us
// GPU spin, warm-up first), the bytes each call must move at least (inputs read once, outputs
// written once) and the bandwidth over them, and multiply-adds x 2 per second. With cuBLAS (16-bit
// dtypes), each block conv is followed by its peer, the same GEMMs on dense operands timed the
// same way: `cublas_fwd` (Y = A W'^T, M = B * N_next, N = C_out, K = s*s*C_in) and `cublas_bwd`
// (dA = dY W', dW = dY^T A in fp32), and `ratio` rows: cuBLAS's time / ours (1.0 = cuBLAS's rate).
//
// Usage: greenmim_conv_gpu_bench [--batch 64] [--reps 20] [--warmup 3] [--dtype bf16|fp16|fp32]
//                                [--seed 0] [--per-sample]
// Figures: docs/perf/NVIDIA_H200_* (run by bench/gpu/run.sh); on the CPU emulator it runs at toy
// sizes as a harness check (ctest conv_gpu_bench_emulated), where timings mean nothing.
#include <cuda_runtime_api.h>
#ifdef GM_BENCH_HAVE_CUBLAS
#include <cublas_v2.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <greenmim/kernels.h>

#include <greenmim/random_masks.hpp>
#include <greenmim/models.hpp>
#include <greenmim/twins_plan.hpp>

#include "../bench_util.hpp"

namespace {

using greenmim::index_t;
using namespace gm_bench;

void print_row(const char* op, int stage, std::int64_t B, std::int64_t N, std::int64_t C, std::int64_t Co,
               double ms, double bytes, double macs) {
  std::printf("%-16s %5d %6lld %7lld %6lld %6lld %10.4f %10.1f %10.1f\n", op, stage, static_cast<long long>(B),
              static_cast<long long>(N), static_cast<long long>(C), static_cast<long long>(Co), ms,
              bytes / (ms * 1e-3) / 1e9, 2 * macs / (ms * 1e-3) / 1e9);
}

#ifdef GM_BENCH_HAVE_CUBLAS
//! The block conv's GEMMs on dense operands (row-major A [M, K], W' [N, K], Y [M, N]): forward
//! Y = A W'^T, backward dA = dY W' and dW = dY^T A (fp32 out). Times (ms) of the forward and of
//! the backward's two, or -1 where cuBLAS fails.
struct cublas_peer {
  cublasHandle_t h = nullptr;
  cublas_peer() {
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) h = nullptr;
  }
  ~cublas_peer() {
    if (h) cublasDestroy(h);
  }
  std::pair<double, double> time(std::int64_t M, std::int64_t N, std::int64_t K, gm_dtype dt, int warmup, int reps) {
    if (!h || dt == GM_FLOAT32) return {-1, -1};
    const cudaDataType_t t = dt == GM_BFLOAT16 ? CUDA_R_16BF : CUDA_R_16F;
    dmem a = random_buffer(static_cast<std::size_t>(M * K), dt, 11), w = random_buffer(static_cast<std::size_t>(N * K), dt, 12);
    dmem y = random_buffer(static_cast<std::size_t>(M * N), dt, 13), da(static_cast<std::size_t>(M * K) * 2),
         dw(static_cast<std::size_t>(N * K) * 4);
    const float one = 1.f, zero = 0.f;
    const int m = static_cast<int>(M), n = static_cast<int>(N), k = static_cast<int>(K);
    bool ok = true;
    // column-major views: Y^T [N x M] = W' [N x K] (stored K x N: transposed) * A^T [K x M]
    auto fwd = [&](int) {
      ok = ok && cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, w.p, t, k, a.p, t, k, &zero, y.p, t, n,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
    };
    // dA^T [K x M] = W'^T [K x N] * dY^T [N x M]; dW^T [K x N] = A^T [K x M] * dY [M x N]
    auto bwd = [&](int) {
      ok = ok && cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, k, m, n, &one, w.p, t, k, y.p, t, n, &zero, da.p, t, k,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
      ok = ok && cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, k, n, m, &one, a.p, t, k, y.p, t, n, &zero, dw.p, CUDA_R_32F, k,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
    };
    const double f = median_ms(fwd, warmup, reps), b = median_ms(bwd, warmup, reps);
    return ok ? std::make_pair(f, b) : std::make_pair(-1.0, -1.0);
  }
};
#endif

}  // namespace

int main(int argc, char** argv) {
  int batch = 64, reps = 20, warmup = 3;
  std::uint64_t seed = 0;
  bool per_sample = false;
  gm_dtype dt = GM_BFLOAT16;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", a.c_str()); std::exit(2); }
      return argv[++i];
    };
    if (a == "--batch") batch = std::atoi(next().c_str());
    else if (a == "--reps") reps = std::atoi(next().c_str());
    else if (a == "--warmup") warmup = std::atoi(next().c_str());
    else if (a == "--seed") seed = std::strtoull(next().c_str(), nullptr, 10);
    else if (a == "--per-sample") per_sample = true;
    else if (a == "--dtype") {
      const std::string d = next();
      dt = d == "fp32" ? GM_FLOAT32 : d == "fp16" ? GM_FLOAT16 : d == "bf16" ? GM_BFLOAT16 : static_cast<gm_dtype>(-1);
      if (dt != GM_FLOAT32 && dt != GM_FLOAT16 && dt != GM_BFLOAT16) { std::fprintf(stderr, "--dtype: fp32, fp16 or bf16\n"); return 2; }
    } else { std::fprintf(stderr, "unknown argument '%s'\n", a.c_str()); return 2; }
  }
  if (batch < 1 || reps < 1 || warmup < 0) { std::fprintf(stderr, "--batch, --reps >= 1, --warmup >= 0\n"); return 2; }
  const greenmim::twins_shape& m = *greenmim::find_twins_model("twins-l");
  greenmim::mask_config cfg;
  const int masks = per_sample ? batch : 1;
  std::vector<std::uint8_t> units;  // [masks, 7, 7]
  for (int b = 0; b < masks; ++b) {
    const auto u = greenmim::random_mask(cfg, seed, static_cast<std::uint64_t>(b));
    units.insert(units.end(), u.begin(), u.end());
  }
  // the tables greenmim.plan_twins makes (tokens block-major): the PEG's neighbours, GSA's keys and
  // the patch embeddings, per stage, in one arena
  greenmim::twins_plan plan;
  greenmim::twins_planner planner;
  greenmim::check(planner.run(greenmim::span<const std::uint8_t>(units), masks, cfg.grid(), cfg.grid(), per_sample,
                              greenmim::twins_geometry{}, greenmim::encoder_plan_options{}, plan));
  auto table = [&](const greenmim::arena_range& r) {
    return std::vector<index_t>(plan.arena.begin() + r.offset, plan.arena.begin() + r.offset + r.size);
  };
  const double es = static_cast<double>(gm_dtype_size(dt));
  std::printf("greenmim_conv_gpu_bench: twins-l, %s, batch %d, %s (seed %llu), tokens block-major, median of %d\n",
              gm_dtype_name(dt), batch, per_sample ? "a mask per sample, packed (B = 1)" : "shared mask",
              static_cast<unsigned long long>(seed), reps);
  std::printf("%-16s %5s %6s %7s %6s %6s %10s %10s %10s\n", "op", "stage", "B", "N", "C", "C_out", "ms", "GB/s",
              "GFLOP/s");
  const std::int64_t B = per_sample ? 1 : batch;  // the packed layout: every sample's tokens on one axis
#ifdef GM_BENCH_HAVE_CUBLAS
  cublas_peer peer;
#endif
  for (int s = 0; s < 4; ++s) {
    const greenmim::twins_stage& st = plan.stages[static_cast<std::size_t>(s)];
    const std::int64_t N = st.num_tokens, C = m.channels[s];
    // PEG
    const std::vector<index_t> nbr_table = table(st.neighbors);
    dmem nbr = upload(nbr_table);
    dmem x = random_buffer(static_cast<std::size_t>(B * N * C), dt, seed + 1), y(static_cast<std::size_t>(B * N * C * es));
    dmem dy = random_buffer(static_cast<std::size_t>(B * N * C), dt, seed + 2), dx(static_cast<std::size_t>(B * N * C * es));
    dmem w = random_buffer(static_cast<std::size_t>(C * 9), GM_FLOAT32, seed + 3), bias = random_buffer(static_cast<std::size_t>(C), GM_FLOAT32, seed + 4);
    dmem dw(static_cast<std::size_t>(C * 9 * 4)), db(static_cast<std::size_t>(C * 4));
    gm_depthwise_conv_args a{};
    a.dtype = dt;
    a.x = tensor3(x.p, B, N, C);
    a.y = tensor3(y.p, B, N, C);
    a.dy = tensor3(dy.p, B, N, C);
    a.dx = tensor3(dx.p, B, N, C);
    a.nbr = static_cast<const index_t*>(nbr.p);
    a.kernel = 3;
    a.weight = static_cast<const float*>(w.p);
    a.bias = static_cast<const float*>(bias.p);
    a.dweight = static_cast<float*>(dw.p);
    a.dbias = static_cast<float*>(db.p);
    a.residual = 1;
    std::size_t ws_bytes = 0;
    BENCH_CHECK(gm_depthwise_conv_bwd_workspace_size(&a, &ws_bytes));
    dmem ws(ws_bytes);
    const double feat = static_cast<double>(B * N * C) * es;
    const double ms_f = median_ms([&](int) { BENCH_CHECK(gm_depthwise_conv_fwd(&a, nullptr)); }, warmup, reps);
    print_row("peg_fwd", s + 1, B, N, C, C, ms_f, 2 * feat, 9.0 * B * N * C);
    const double ms_b = median_ms([&](int) { BENCH_CHECK(gm_depthwise_conv_bwd(&a, ws.p, ws_bytes, nullptr)); }, warmup, reps);
    print_row("peg_bwd", s + 1, B, N, C, C, ms_b, 3 * feat, 18.0 * B * N * C);
    // block convs: GSA sub-sampling (sr > 1) and the patch embedding into the next stage
    for (int which = 0; which < 2; ++which) {
      const index_t k = which == 0 ? m.sr_ratios[s] : 2;
      if (k <= 1 || (which == 1 && s == 3)) continue;
      const std::int64_t Co = which == 0 ? C : m.channels[s + 1];
      const std::vector<index_t> bt = table(which == 0 ? st.keys : st.embed);
      const std::int64_t Nn = static_cast<std::int64_t>(bt.size()) / (k * k);
      dmem gather = upload(bt);
      dmem by(static_cast<std::size_t>(B * Nn * Co * es));
      dmem bdy = random_buffer(static_cast<std::size_t>(B * Nn * Co), dt, seed + 5);
      dmem bw = random_buffer(static_cast<std::size_t>(Co * C * k * k), GM_FLOAT32, seed + 6);
      dmem bb = random_buffer(static_cast<std::size_t>(Co), GM_FLOAT32, seed + 7);
      dmem bdw(static_cast<std::size_t>(Co * C * k * k * 4)), bdb(static_cast<std::size_t>(Co * 4));
      gm_block_conv_args b{};
      b.dtype = dt;
      b.x = tensor3(x.p, B, N, C);
      b.y = tensor3(by.p, B, Nn, Co);
      b.dy = tensor3(bdy.p, B, Nn, Co);
      b.dx = tensor3(dx.p, B, N, C);
      b.gather = static_cast<const index_t*>(gather.p);
      b.stride = k;
      b.weight = static_cast<const float*>(bw.p);
      b.bias = static_cast<const float*>(bb.p);
      b.dweight = static_cast<float*>(bdw.p);
      b.dbias = static_cast<float*>(bdb.p);
      const double macs = static_cast<double>(B) * N * C * Co;  // each input once per output channel
      const double wbytes = static_cast<double>(Co * C * k * k) * 4;
      const double ybytes = static_cast<double>(B * Nn * Co) * es;
      const char* fwd = which == 0 ? "gsa_sr_fwd" : "embed_fwd";
      const char* bwd = which == 0 ? "gsa_sr_bwd" : "embed_bwd";
      std::size_t fwd_ws = 0, bwd_ws = 0;
      BENCH_CHECK(gm_block_conv_fwd_workspace_size(&b, &fwd_ws));
      BENCH_CHECK(gm_block_conv_bwd_workspace_size(&b, &bwd_ws));
      dmem bws(std::max(fwd_ws, bwd_ws));
      const double bf = median_ms([&](int) { BENCH_CHECK(gm_block_conv_fwd(&b, bws.p, fwd_ws, nullptr)); }, warmup, reps);
      print_row(fwd, s + 1, B, N, C, Co, bf, feat + wbytes + ybytes, macs);
      const double bb_ms =
          median_ms([&](int) { BENCH_CHECK(gm_block_conv_bwd(&b, bws.p, bwd_ws, nullptr)); }, warmup, reps);
      print_row(bwd, s + 1, B, N, C, Co, bb_ms, 2 * feat + ybytes + 2 * wbytes, 2 * macs);
#ifdef GM_BENCH_HAVE_CUBLAS
      const auto pt = peer.time(B * Nn, Co, static_cast<std::int64_t>(k) * k * C, dt, warmup, reps);
      if (pt.first > 0) {
        // the dense GEMMs do the block conv's multiply-adds (every output cell's block counted whole)
        const double gm = static_cast<double>(B * Nn) * Co * k * k * C;
        print_row("cublas_fwd", s + 1, B, N, C, Co, pt.first, 0, gm);
        print_row("cublas_bwd", s + 1, B, N, C, Co, pt.second, 0, 2 * gm);
        std::printf("%-16s %5d  ours at %.2f of cuBLAS's rate (fwd), %.2f (bwd), %.2f (fwd + bwd)\n",
                    which == 0 ? "ratio_gsa_sr" : "ratio_embed", s + 1, pt.first / bf, pt.second / bb_ms,
                    (pt.first + pt.second) / (bf + bb_ms));
      }
#endif
    }
  }
  return 0;
}
