// greenmim_dw7_gpu_bench: times the 7 x 7 depthwise submanifold conv (kernels/depthwise_conv.cu
// over detail/dw_taps.cuh) at ConvNeXt V2's shapes as FCMAE runs them: 224 px, 60% of the 7 x 7
// mask units masked, a mask per sample, every sample's visible tokens packed on one axis (B = 1),
// row-major within a sample; stages 1-4 (token grids 56, 28, 14, 7; a unit is 8, 4, 2, 1 tokens a
// side). Per stage: the forward (with the block's residual off: ConvNeXt's dwconv has none) and
// the backward (dx, dweight, dbias), each the median of launches queued behind a GPU spin
// (bench_util.hpp's median_ms), against a device-to-device copy of the same features (read once,
// written once) timed the same way. `of_copy` = the copy's time / the op's time for the bytes each
// must move at least (the forward: x read once, y written once, which is what the copy moves; the
// backward: x and dy read, dx written, 1.5 copies): 1.0 = a copy's bandwidth. The device
// goal is the forward at >= 0.6 of a copy.
//
// Usage: greenmim_dw7_gpu_bench [--model base] [--batch 64] [--reps 20] [--warmup 3]
//                               [--dtype bf16|fp16|fp32] [--seed 0] [--kernel 7]
// --model: atto, femto, pico, nano, tiny, base, large, huge (convnextv2_*'s stage widths).
// Figures: none yet (no device in the session that wrote it); on the CPU emulator it runs at toy
// sizes as a harness check (ctest dw7_gpu_bench_emulated), where timings mean nothing.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <greenmim/kernels.h>

#include <greenmim/random_masks.hpp>
#include <greenmim/sparse_conv.hpp>

#include "../bench_util.hpp"

namespace {

using greenmim::index_t;
using namespace gm_bench;

struct convnext_width {
  const char* name;
  std::int64_t dims[4];
};

// timm's convnextv2_* stage widths
constexpr convnext_width k_widths[] = {
    {"atto", {40, 80, 160, 320}},      {"femto", {48, 96, 192, 384}},    {"pico", {64, 128, 256, 512}},
    {"nano", {80, 160, 320, 640}},     {"tiny", {96, 192, 384, 768}},    {"base", {128, 256, 512, 1024}},
    {"large", {192, 384, 768, 1536}},  {"huge", {352, 704, 1408, 2816}},
};

}  // namespace

int main(int argc, char** argv) {
  int batch = 64, reps = 20, warmup = 3, kernel = 7;
  std::uint64_t seed = 0;
  std::string model = "base";
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
    else if (a == "--model") model = next();
    else if (a == "--kernel") kernel = std::atoi(next().c_str());
    else if (a == "--dtype") {
      const std::string d = next();
      dt = d == "fp32" ? GM_FLOAT32 : d == "fp16" ? GM_FLOAT16 : d == "bf16" ? GM_BFLOAT16 : static_cast<gm_dtype>(-1);
      if (dt != GM_FLOAT32 && dt != GM_FLOAT16 && dt != GM_BFLOAT16) { std::fprintf(stderr, "--dtype: fp32, fp16 or bf16\n"); return 2; }
    } else { std::fprintf(stderr, "unknown argument '%s'\n", a.c_str()); return 2; }
  }
  if (batch < 1 || reps < 1 || warmup < 0) { std::fprintf(stderr, "--batch, --reps >= 1, --warmup >= 0\n"); return 2; }
  const convnext_width* width = nullptr;
  for (const auto& w : k_widths)
    if (model == w.name) width = &w;
  if (!width) { std::fprintf(stderr, "--model: atto, femto, pico, nano, tiny, base, large or huge\n"); return 2; }
  greenmim::mask_config cfg;
  cfg.ratio = 0.6;
  std::vector<std::vector<std::uint8_t>> units;
  for (int b = 0; b < batch; ++b) units.push_back(greenmim::random_mask(cfg, seed, static_cast<std::uint64_t>(b)));
  const double es = static_cast<double>(gm_dtype_size(dt));
  std::printf("greenmim_dw7_gpu_bench: convnextv2_%s, %dx%d depthwise, %s, batch %d packed (B = 1), mask ratio 0.6 "
              "per sample (seed %llu), median of %d\n",
              width->name, kernel, kernel, gm_dtype_name(dt), batch, static_cast<unsigned long long>(seed), reps);
  std::printf("%-10s %5s %8s %6s %10s %10s %8s\n", "op", "stage", "N", "C", "ms", "GB/s", "of_copy");
  for (int s = 0; s < 4; ++s) {
    const index_t grid = 56 >> s;
    std::vector<index_t> cu{0}, coords;
    for (int b = 0; b < batch; ++b) {
      std::vector<index_t> c;
      greenmim::check(greenmim::visible_coords(greenmim::span<const std::uint8_t>(units[static_cast<std::size_t>(b)]),
                                               cfg.grid(), grid, c));
      coords.insert(coords.end(), c.begin(), c.end());
      cu.push_back(static_cast<index_t>(coords.size()));
    }
    greenmim::neighbor_table t;
    greenmim::check(greenmim::build_neighbor_table_per_sample(grid, grid, kernel, greenmim::span<const index_t>(cu),
                                                              greenmim::span<const index_t>(coords), t));
    const std::int64_t N = t.num_tokens, C = width->dims[s], K = static_cast<std::int64_t>(kernel) * kernel;
    dmem nbr = upload(t.nbr);
    dmem x = random_buffer(static_cast<std::size_t>(N * C), dt, seed + 1), y(static_cast<std::size_t>(N * C * es));
    dmem dy = random_buffer(static_cast<std::size_t>(N * C), dt, seed + 2), dx(static_cast<std::size_t>(N * C * es));
    dmem w = random_buffer(static_cast<std::size_t>(C * K), GM_FLOAT32, seed + 3);
    dmem bias = random_buffer(static_cast<std::size_t>(C), GM_FLOAT32, seed + 4);
    dmem dw(static_cast<std::size_t>(C * K * 4)), db(static_cast<std::size_t>(C * 4));
    gm_depthwise_conv_args a{};
    a.dtype = dt;
    a.x = tensor3(x.p, 1, N, C);
    a.y = tensor3(y.p, 1, N, C);
    a.dy = tensor3(dy.p, 1, N, C);
    a.dx = tensor3(dx.p, 1, N, C);
    a.nbr = static_cast<const index_t*>(nbr.p);
    a.kernel = kernel;
    a.weight = static_cast<const float*>(w.p);
    a.bias = static_cast<const float*>(bias.p);
    a.dweight = static_cast<float*>(dw.p);
    a.dbias = static_cast<float*>(db.p);
    a.residual = 0;  // ConvNeXt's dwconv: the block's residual comes after the MLP
    std::size_t ws_bytes = 0;
    BENCH_CHECK(gm_depthwise_conv_bwd_workspace_size(&a, &ws_bytes));
    dmem ws(ws_bytes);
    const double feat = static_cast<double>(N * C) * es;
    const double ms_copy = median_ms(
        [&](int) { BENCH_CHECK(cudaMemcpyAsync(y.p, x.p, static_cast<std::size_t>(feat), cudaMemcpyDeviceToDevice, nullptr)); },
        warmup, reps);
    std::printf("%-10s %5d %8lld %6lld %10.4f %10.1f %8.2f\n", "copy", s + 1, static_cast<long long>(N),
                static_cast<long long>(C), ms_copy, 2 * feat / (ms_copy * 1e-3) / 1e9, 1.0);
    const double ms_f = median_ms([&](int) { BENCH_CHECK(gm_depthwise_conv_fwd(&a, nullptr)); }, warmup, reps);
    std::printf("%-10s %5d %8lld %6lld %10.4f %10.1f %8.2f\n", "dw_fwd", s + 1, static_cast<long long>(N),
                static_cast<long long>(C), ms_f, 2 * feat / (ms_f * 1e-3) / 1e9, ms_copy / ms_f);
    const double ms_b = median_ms([&](int) { BENCH_CHECK(gm_depthwise_conv_bwd(&a, ws.p, ws_bytes, nullptr)); }, warmup, reps);
    std::printf("%-10s %5d %8lld %6lld %10.4f %10.1f %8.2f\n", "dw_bwd", s + 1, static_cast<long long>(N),
                static_cast<long long>(C), ms_b, 3 * feat / (ms_b * 1e-3) / 1e9, 1.5 * ms_copy / ms_b);
  }
  return 0;
}
