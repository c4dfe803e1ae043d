// greenmim_gpu_bench: times the greenmim CUDA kernels on Swin-B stage 1-3 shapes (batch 128 by
// default, bf16, window 7, plain and shifted blocks) and on the stage 1 of two large-window models
// (Swin-B window 14 at 224 px; Swin V2-B window 16 at 256 px: groups of 64 < G <= 256, the
// tensor-core forward's query tiles), next to the two ceilings measured on the
// same device: a large device-to-device cudaMemcpy (bandwidth, bytes read + written) and, when
// cuBLAS is available, a large bf16 GEMM (tensor-core rate).
//
// Per stage and shift it reports the median time (cudaEvent around each launch, queued behind
// a 50 us GPU spin so the host's launch latency is not timed, warm-up first, input sets
// rotated so that they do not sit in L2) of: forward (AUTO = tensor-core path when
// possible, and the SIMT path), backward (dq/dk/dv + deterministic dbias: the tensor-core
// path where it applies, and the SIMT path), partition (gather) and unpartition (scatter) of
// [B, N, C] features; the bytes each must move at least (each input
// read once, each output written once), the achieved bandwidth over those bytes, and the floor
// = max(bytes / copy bandwidth, useful FLOPs / GEMM rate). It also writes each window-7 stage's
// partition as JSON for bench/gpu/torch_bench.py, so that the PyTorch paths run on the same groups.
//
// Usage: greenmim_gpu_bench [--batch 128] [--reps 30] [--warmup 5] [--seed N] [--csv FILE]
//                           [--json-dir DIR] [--stages 1,2,3] [--windows 7,14,16] [--copy-mb 1024]
// (--windows 14 and 16 have a stage 1 only; the emulated build's default is 7,16, plain blocks only
// for 16)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <greenmim/kernels.h>
#include <greenmim/kernels.hpp>

#include <greenmim/geometry.hpp>
#include <greenmim/random_masks.hpp>
#include <greenmim/partition.hpp>
#include <greenmim/planner.hpp>

#include "bench_util.hpp"
#include "../../kernels/detail/fwd_tuning.hpp"  // heads per CTA of the tensor-core forward (A/B row)

#ifdef GM_BENCH_HAVE_CUBLAS
#include <cublas_v2.h>
#endif

namespace {

using greenmim::index_t;
using namespace gm_bench;

struct options {
  int batch = 128, reps = 30, warmup = 5;
  int copy_mb = 1024;  // size of the copy-bandwidth ceiling's buffers
  std::uint64_t seed = 0;
  std::string csv, json_dir;
  std::vector<int> stages = {1, 2, 3};
#if defined(GREENMIM_CUDA_EMULATION)
  // the emulated build is a harness check (ctest gpu_bench_emulated, CI time): one large window,
  // its plain block only (see the shift loop)
  std::vector<int> windows = {7, 16};
#else
  std::vector<int> windows = {7, 14, 16};
#endif
};

options parse(int argc, char** argv) {
  options o;
  o.seed = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value after %s\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--batch") o.batch = std::atoi(next().c_str());
    else if (a == "--reps") o.reps = std::atoi(next().c_str());
    else if (a == "--warmup") o.warmup = std::atoi(next().c_str());
    else if (a == "--seed") o.seed = std::strtoull(next().c_str(), nullptr, 10);
    else if (a == "--csv") o.csv = next();
    else if (a == "--json-dir") o.json_dir = next();
    else if (a == "--copy-mb") o.copy_mb = std::atoi(next().c_str());
    else if (a == "--stages") {
      o.stages.clear();
      const std::string s = next();
      for (char c : s)
        if (c >= '1' && c <= '3') o.stages.push_back(c - '0');
    } else if (a == "--windows") {
      o.windows.clear();
      const std::string s = next();
      for (std::size_t at = 0; at < s.size();) {
        const std::size_t end = std::min(s.find(',', at), s.size());
        o.windows.push_back(std::atoi(s.substr(at, end - at).c_str()));
        at = end + 1;
      }
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      std::exit(2);
    }
  }
  if (o.reps < 1) o.reps = 1;
  if (o.warmup < 0) o.warmup = 0;
  if (o.batch < 1 || o.copy_mb < 1) {
    std::fprintf(stderr, "--batch and --copy-mb must be >= 1\n");
    std::exit(2);
  }
  return o;
}

//! Device-to-device copy bandwidth in bytes/s (bytes read + bytes written).
double copy_bandwidth(std::size_t bytes, int reps) {
  dmem a(bytes), b(bytes);
  BENCH_CHECK(bench_fill_random(a.p, bytes / 4, 0, 1, 1.f, nullptr));
  const double ms = median_ms([&](int) { BENCH_CHECK(cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice)); }, 3, reps);
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3);
}

//! bf16 GEMM rate in FLOP/s (m = n = k = 8192), 0 without cuBLAS.
double gemm_rate(int reps) {
#ifdef GM_BENCH_HAVE_CUBLAS
  const int n = 8192;
  dmem a(std::size_t(n) * n * 2), b(std::size_t(n) * n * 2), c(std::size_t(n) * n * 2);
  BENCH_CHECK(bench_fill_random(a.p, std::size_t(n) * n, 2, 2, 1.f, nullptr));
  BENCH_CHECK(bench_fill_random(b.p, std::size_t(n) * n, 2, 3, 1.f, nullptr));
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 0;
  const float alpha = 1.f, beta = 0.f;
  bool ok = true;
  const double ms = median_ms(
      [&](int) {
        ok = ok && cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.p, CUDA_R_16BF, n, b.p, CUDA_R_16BF, n,
                                &beta, c.p, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
                       CUBLAS_STATUS_SUCCESS;
      },
      3, reps);
  cublasDestroy(h);
  return ok ? 2.0 * n * double(n) * n / (ms * 1e-3) : 0.0;
#else
  (void)reps;
  return 0.0;
#endif
}

struct stage_shape {
  int stage, grid, channels, heads, window, image;  // image: pixels (mask units of 32 px)
};
constexpr stage_shape shapes[] = {
    {1, 56, 128, 4, 7, 224}, {2, 28, 256, 8, 7, 224}, {3, 14, 512, 16, 7, 224},  // Swin-B
    {1, 56, 128, 4, 14, 224},  // Swin-B window 14 (224 px), stage 1
    {1, 64, 128, 4, 16, 256},  // Swin V2-B window 16 (256 px), stage 1
};
constexpr int head_dim = 32;

struct row {
  std::string op;
  int stage = 0, window = 0, shift = 0, G = 0, groups = 0, tokens = 0;
  double ms = 0, bytes = 0, flops = 0, floor_ms = 0;
};

void write_json(const std::string& path, const stage_shape& s, int batch, const greenmim::partition_indices& p,
                const greenmim::window_geometry& g) {
  std::ofstream f(path);
  auto arr = [&](const char* name, const std::vector<index_t>& v) {
    f << "\"" << name << "\": [";
    for (std::size_t i = 0; i < v.size(); ++i) f << (i ? "," : "") << v[i];
    f << "]";
  };
  f << "{\"stage\": " << s.stage << ", \"grid\": " << s.grid << ", \"channels\": " << s.channels
    << ", \"heads\": " << s.heads << ", \"head_dim\": " << head_dim << ", \"window\": " << g.window
    << ", \"shift\": " << g.shift << ", \"batch\": " << batch << ", \"group_size\": " << p.group_size
    << ", \"num_groups\": " << p.num_groups << ", \"num_tokens\": " << p.num_tokens << ", ";
  arr("gather", p.gather);
  f << ", ";
  arr("scatter", p.scatter);
  f << ", ";
  arr("slot_window", p.slot_window);
  f << ", ";
  arr("slot_coord", p.slot_coord);
  f << "}\n";
}

}  // namespace

int main(int argc, char** argv) {
  const options opt = parse(argc, argv);
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("greenmim_gpu_bench: no CUDA device, nothing measured\n");
    return 2;
  }
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d, %d SMs, L2 %.0f MB, %.1f GB)\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, prop.l2CacheSize / 1048576.0, prop.totalGlobalMem / 1073741824.0);
  std::printf("seed %llu, batch %d, bf16, head_dim %d, windows 7 (stages 1-3), 14 and 16 (stage 1), %d reps (median), "
              "%d warm-up\n",
              static_cast<unsigned long long>(opt.seed), opt.batch, head_dim, opt.reps, opt.warmup);

  const double bw = copy_bandwidth(std::size_t(opt.copy_mb) << 20, 10);
  const double peak = gemm_rate(10);
  std::printf("ceilings: device-to-device copy %.0f GB/s (read + write); bf16 GEMM 8192^3 %s\n", bw / 1e9,
              peak > 0 ? (std::to_string(static_cast<long long>(peak / 1e12)) + " TFLOP/s").c_str() : "n/a (no cuBLAS)");

  std::vector<row> rows;
  std::mt19937_64 rng(opt.seed);
  const std::size_t es = 2;  // bf16
  const std::int64_t B = opt.batch;
  for (const stage_shape& s : shapes) {
    if (std::find(opt.stages.begin(), opt.stages.end(), s.stage) == opt.stages.end()) continue;
    if (std::find(opt.windows.begin(), opt.windows.end(), s.window) == opt.windows.end()) continue;
    // one mask per micro-batch (the paper), shared by both blocks of the stage
    greenmim::mask_config cfg;
    cfg.image_size = s.image;
    const std::vector<std::uint8_t> mask = greenmim::random_mask(cfg, rng(), 0);
    std::vector<index_t> coords;
    if (greenmim::visible_coords(greenmim::span<const std::uint8_t>(mask), cfg.grid(), s.grid, coords) !=
        greenmim::status::success) {
      std::fprintf(stderr, "visible_coords failed\n");
      return 1;
    }
    for (int shift : {0, s.window / 2}) {
#if defined(GREENMIM_CUDA_EMULATION)
      if (s.window > 7 && shift > 0) continue;
#endif
      const greenmim::window_geometry g = greenmim::make_window_geometry(s.grid, s.grid, s.window, shift);
      greenmim::window_list wl;
      greenmim::plan plan;
      greenmim::partition_indices part;
      if (greenmim::build_windows(g, greenmim::span<const index_t>(coords), wl) != greenmim::status::success) return 1;
      const std::vector<index_t> sizes = wl.sizes();
      greenmim::planner_options popt;
      if (greenmim::make_plan(greenmim::span<const index_t>(sizes), popt, s.channels, plan) != greenmim::status::success)
        return 1;
      if (s.window > 7 && plan.group_size > 256) {  // large windows: the tensor-core paths' G (<= 256)
        popt.group_size = 256;
        if (greenmim::make_plan(greenmim::span<const index_t>(sizes), popt, s.channels, plan) != greenmim::status::success)
          return 1;
      }
      if (greenmim::build_partition(plan, wl, part) != greenmim::status::success) return 1;
      if (!opt.json_dir.empty() && s.window == 7)  // torch_bench.py's partitions (its time budget)
        write_json(opt.json_dir + "/partition_stage" + std::to_string(s.stage) + "_shift" + std::to_string(g.shift) +
                       ".json",
                   s, opt.batch, part, g);
      double sum_w2 = 0;
      for (index_t w : sizes) sum_w2 += double(w) * w;
      const std::int64_t N = part.num_tokens, H = s.heads, D = head_dim, C = s.channels;
      const std::int64_t S = static_cast<std::int64_t>(part.group_size) * part.num_groups;
      const index_t R = (2 * g.window - 1) * (2 * g.window - 1);
      dmem gather = upload(part.gather), scatter = upload(part.scatter), sw = upload(part.slot_window),
           sc = upload(part.slot_coord);
      const greenmim::partition_view pv{gather.as<index_t>(), scatter.as<index_t>(), sw.as<index_t>(),
                                        sc.as<index_t>(), part.group_size, part.num_groups, part.num_tokens};
      const gm_partition cp = greenmim::kernels::to_partition(pv);

      // rotate input sets so that the working set exceeds L2 twice
      const std::size_t qkv_bytes = std::size_t(B * N * 3 * H * D) * es;
      const int sets = static_cast<int>(std::min<std::size_t>(8, std::max<std::size_t>(1, (2 * std::size_t(prop.l2CacheSize)) / qkv_bytes + 1)));
      std::vector<dmem> qkv, dout;
      for (int i = 0; i < sets; ++i) {
        qkv.emplace_back(qkv_bytes);
        dout.emplace_back(std::size_t(B * N * H * D) * es);
        BENCH_CHECK(bench_fill_random(qkv.back().p, qkv_bytes / es, 2, opt.seed + 17 * i, 1.f, nullptr));
        BENCH_CHECK(bench_fill_random(dout.back().p, std::size_t(B * N * H * D), 2, opt.seed + 17 * i + 5, 1.f, nullptr));
      }
      dmem o(std::size_t(B * N * H * D) * es), lse(std::size_t(B * N * H) * 4), dqkv(qkv_bytes);
      dmem bias(std::size_t(R * H) * 4), dbias(std::size_t(R * H) * 4);
      BENCH_CHECK(bench_fill_random(bias.p, std::size_t(R * H), 0, opt.seed + 99, 0.5f, nullptr));
      BENCH_CHECK(cudaMemset(dbias.p, 0, dbias.bytes));

      auto rows4 = [&](void* base, std::int64_t j, std::int64_t parts) {
        gm_tensor t{};
        t.data = static_cast<char*>(base) + j * H * D * es;
        t.rank = 4;
        t.extent[0] = B; t.extent[1] = N; t.extent[2] = H; t.extent[3] = D;
        t.stride[0] = N * parts * H * D; t.stride[1] = parts * H * D; t.stride[2] = D; t.stride[3] = 1;
        return t;
      };
      gm_tensor tlse{};
      tlse.data = lse.p;
      tlse.rank = 3;
      tlse.extent[0] = B; tlse.extent[1] = N; tlse.extent[2] = H;
      tlse.stride[0] = N * H; tlse.stride[1] = H; tlse.stride[2] = 1;
      gm_tensor tbias{}, tdbias{};
      tbias.data = bias.p;
      tbias.rank = 2;
      tbias.extent[0] = R; tbias.extent[1] = H; tbias.stride[0] = H; tbias.stride[1] = 1;
      tdbias = tbias;
      tdbias.data = dbias.p;

      auto fwd_args = [&](int set, gm_algo algo) {
        gm_attention_fwd_args a{};
        a.dtype = GM_BFLOAT16;
        a.q = rows4(qkv[set].p, 0, 3);
        a.k = rows4(qkv[set].p, 1, 3);
        a.v = rows4(qkv[set].p, 2, 3);
        a.o = rows4(o.p, 0, 1);
        a.lse = tlse;
        a.bias_table = tbias;
        a.part = cp;
        a.window = g.window;
        a.algo = algo;
        return a;
      };
      auto bwd_args = [&](int set, gm_algo algo) {
        gm_attention_bwd_args a{};
        a.dtype = GM_BFLOAT16;
        a.q = rows4(qkv[set].p, 0, 3);
        a.k = rows4(qkv[set].p, 1, 3);
        a.v = rows4(qkv[set].p, 2, 3);
        a.o = rows4(o.p, 0, 1);
        a.d_o = rows4(dout[set].p, 0, 1);
        a.lse = tlse;
        a.bias_table = tbias;
        a.dq = rows4(dqkv.p, 0, 3);
        a.dk = rows4(dqkv.p, 1, 3);
        a.dv = rows4(dqkv.p, 2, 3);
        a.d_bias_table = tdbias;
        a.part = cp;
        a.window = g.window;
        a.algo = algo;
        return a;
      };
      // o / lse for the backward: one forward on set 0 (the backward reuses them for every set:
      // the timing does not depend on the values)
      {
        const gm_attention_fwd_args a = fwd_args(0, GM_ALGO_AUTO);
        BENCH_CHECK(gm_attention_fwd(&a, nullptr));
      }
      std::size_t ws_bytes = 0;
      {
        const gm_attention_bwd_args a = bwd_args(0, GM_ALGO_AUTO);  // the same for every algo
        BENCH_CHECK(gm_attention_bwd_workspace_size(&a, &ws_bytes));
      }
      dmem ws(ws_bytes);

      const double row_bytes = double(B) * N * H * D * es;  // one [B, N, H, D] bf16 tensor
      const double lse_bytes = double(B) * N * H * 4;
      const double fwd_flops = 4.0 * B * H * D * sum_w2;
      const double bwd_flops = 2.5 * fwd_flops;
      auto floor_ms = [&](double bytes, double flops) {
        return 1e3 * std::max(bytes / bw, peak > 0 ? flops / peak : 0.0);
      };
      auto add = [&](const std::string& op, double ms, double bytes, double flops) {
        row r;
        r.op = op;
        r.stage = s.stage;
        r.window = g.window;
        r.shift = g.shift;
        r.G = part.group_size;
        r.groups = part.num_groups;
        r.tokens = static_cast<int>(N);
        r.ms = ms;
        r.bytes = bytes;
        r.flops = flops;
        r.floor_ms = floor_ms(bytes, flops);
        rows.push_back(r);
      };

      for (gm_algo algo : {GM_ALGO_AUTO, GM_ALGO_SIMT}) {
        const gm_attention_fwd_args probe = fwd_args(0, algo);
        if (gm_attention_fwd_can_implement(&probe) != cudaSuccess) continue;
        const double ms = median_ms(
            [&](int i) {
              const gm_attention_fwd_args a = fwd_args(i % sets, algo);
              BENCH_CHECK(gm_attention_fwd(&a, nullptr));
            },
            opt.warmup, opt.reps);
        add(algo == GM_ALGO_AUTO ? "forward (auto)" : "forward (simt)", ms, 4 * row_bytes + lse_bytes, fwd_flops);
      }
      {  // the tensor-core forward with two heads per CTA: the A/B of the automatic choice (one;
        // kernels/detail/fwd_tuning.hpp). G <= 64; above, the query-tile kernel always runs one.
        const gm_attention_fwd_args probe = fwd_args(0, GM_ALGO_MMA);
        if (part.group_size <= 64 && gm_attention_fwd_can_implement(&probe) == cudaSuccess) {
          greenmim::detail::cuda::fwd_tuning two_heads;
          two_heads.heads_per_cta = 2;
          const double ms = median_ms(
              [&](int i) {
                const gm_attention_fwd_args a = fwd_args(i % sets, GM_ALGO_MMA);
                BENCH_CHECK(greenmim::detail::cuda::attention_fwd(&a, two_heads, nullptr));
              },
              opt.warmup, opt.reps);
          add("forward (mma, 2 heads/CTA)", ms, 4 * row_bytes + lse_bytes, fwd_flops);
        }
      }
      // the tensor-core backward where it applies (G <= 256), and the SIMT one
      for (gm_algo algo : {GM_ALGO_MMA, GM_ALGO_SIMT}) {
        const gm_attention_bwd_args probe = bwd_args(0, algo);
        if (gm_attention_bwd_can_implement(&probe) != cudaSuccess) continue;
        const double ms = median_ms(
            [&](int i) {
              const gm_attention_bwd_args a = bwd_args(i % sets, algo);
              BENCH_CHECK(gm_attention_bwd(&a, ws.p, ws_bytes, nullptr));
            },
            opt.warmup, opt.reps);
        add(algo == GM_ALGO_MMA ? "backward (mma)" : "backward (simt)", ms, 8 * row_bytes + lse_bytes, bwd_flops);
      }
      // partition / unpartition of [B, N, C] features (the qkv buffer reinterpreted as features)
      {
        dmem y(std::size_t(B * S * C) * es);
        auto part_args = [&](int set) {
          gm_partition_args a{};
          a.dtype = GM_BFLOAT16;
          a.x.data = qkv[set].p;
          a.x.rank = 3;
          a.x.extent[0] = B; a.x.extent[1] = N; a.x.extent[2] = C;
          a.x.stride[0] = N * C; a.x.stride[1] = C; a.x.stride[2] = 1;
          a.y.data = y.p;
          a.y.rank = 3;
          a.y.extent[0] = B; a.y.extent[1] = S; a.y.extent[2] = C;
          a.y.stride[0] = S * C; a.y.stride[1] = C; a.y.stride[2] = 1;
          a.part = cp;
          return a;
        };
        const double gms = median_ms(
            [&](int i) {
              const gm_partition_args a = part_args(i % sets);
              BENCH_CHECK(gm_partition_tokens(&a, nullptr));
            },
            opt.warmup, opt.reps);
        add("partition (gather)", gms, double(B) * (N + S) * C * es, 0);
        const double sms = median_ms(
            [&](int i) {
              const gm_partition_args a = part_args(i % sets);
              BENCH_CHECK(gm_unpartition_tokens(&a, nullptr));
            },
            opt.warmup, opt.reps);
        add("unpartition (scatter)", sms, double(B) * 2 * N * C * es, 0);
      }
      BENCH_CHECK(cudaDeviceSynchronize());
    }
  }

  std::printf("\n| op | stage | window | shift | G | groups | tokens/sample | median ms | GB/s (min bytes) | %% of copy BW | TFLOP/s (useful) | floor ms | time / floor |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const row& r : rows) {
    const double gbs = r.bytes / (r.ms * 1e-3) / 1e9;
    std::printf("| %s | %d | %d | %d | %d | %d | %d | %.4f | %.0f | %.0f%% | %.1f | %.4f | %.2f |\n", r.op.c_str(), r.stage,
                r.window, r.shift, r.G, r.groups, r.tokens, r.ms, gbs, 100.0 * gbs * 1e9 / bw,
                r.flops / (r.ms * 1e-3) / 1e12, r.floor_ms, r.ms / r.floor_ms);
  }
  if (!opt.csv.empty()) {
    std::ofstream f(opt.csv);
    f << "device,op,stage,shift,G,groups,tokens,batch,median_ms,bytes,flops,copy_GBps,gemm_TFLOPs,floor_ms,window\n";
    for (const row& r : rows)
      f << '"' << prop.name << "\"," << '"' << r.op << "\"," << r.stage << ',' << r.shift << ',' << r.G << ',' << r.groups
        << ',' << r.tokens << ',' << opt.batch << ',' << r.ms << ',' << r.bytes << ',' << r.flops << ',' << bw / 1e9 << ','
        << peak / 1e12 << ',' << r.floor_ms << ',' << r.window << '\n';
    std::printf("\nwrote %s\n", opt.csv.c_str());
  }
  return 0;
}
