// PEG backward split micro-bench (throwaway; the kernels are kernels/depthwise_conv.cu, included):
// the dweight/dbias partial + reduce kernels under different cuts of (tokens x samples) into pieces,
// against the current cut (dw_grad_split_for) and the dx pass, Twins-L bf16, 25% visible 32-px
// units, block-major tokens, per-sample (B = 1) and shared (B = 64) layouts. CUDA graphs of 20
// launches, median of 15 replays, us per launch. dweight / dbias of each cut are compared to the
// current cut's (max relative difference; the sums' order differs).
// Build: nvcc -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -arch=sm_90 -Iinclude -Ikernels/include
//        -Ikernels peg_bwd_split.cu kernels/common.cu -o peg_bwd_split
#include "depthwise_conv.cu"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <greenmim/twins_plan.hpp>

using namespace greenmim;
using namespace greenmim::detail::cuda;
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("CUDA error %s at %d\n", cudaGetErrorString(e_), __LINE__); std::exit(1); } } while (0)

template <class F>
float time_graph(F&& body) {
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g; cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < 20; ++i) body(s);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, s));
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < 15; ++r) {
    CK(cudaEventRecord(a, s)); CK(cudaGraphLaunch(ge, s)); CK(cudaEventRecord(b, s)); CK(cudaEventSynchronize(b));
    float ms; CK(cudaEventElapsedTime(&ms, a, b)); t.push_back(ms * 1000.f / 20.f);
  }
  std::sort(t.begin(), t.end());
  CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g)); CK(cudaStreamDestroy(s));
  return t[t.size() / 2];
}


int main() {
  using T = __nv_bfloat16;
  cudaDeviceProp pr; CK(cudaGetDeviceProperties(&pr, 0));
  std::printf("peg_bwd_split on %s: bf16, Twins-L, 25%% visible 32-px units, us per launch (median of 15 graph replays of 20)\n", pr.name);
  std::mt19937_64 rng(7);
  const int B_all = 64, units = 7, keep = 12;
  std::vector<std::vector<std::uint8_t>> vis(B_all, std::vector<std::uint8_t>(units * units, 0));
  for (auto& v : vis) {
    std::vector<int> idx(units * units);
    for (int i = 0; i < units * units; ++i) idx[i] = i;
    std::shuffle(idx.begin(), idx.end(), rng);
    for (int i = 0; i < keep; ++i) v[idx[i]] = 1;
  }
  for (int layout = 1; layout >= 0; --layout) {
    for (int s = 0; s < 4; ++s) {
      const index_t grid = 56 >> s, f = index_t{8} >> s, C = 128 << s;
      std::vector<index_t> cells;
      block_major_cells(grid, f, cells);
      std::vector<index_t> coords, cu{0};
      const int samples = layout == 0 ? 1 : B_all;
      for (int b = 0; b < samples; ++b) {
        for (index_t c : cells)
          if (vis[b][(coord_h(c) / f) * units + coord_w(c) / f]) coords.push_back(c);
        cu.push_back(static_cast<index_t>(coords.size()));
      }
      neighbor_table nt;
      if (build_neighbor_table_per_sample(grid, grid, 3, span<const index_t>(cu), span<const index_t>(coords), nt) != status::success) return 1;
      const int B = layout == 0 ? B_all : 1;
      const std::int64_t N = nt.num_tokens, n = B * N * C;
      T *x, *dy, *dx; index_t* nbr; float *w, *dw, *db, *part;
      CK(cudaMalloc(&x, n * 2)); CK(cudaMalloc(&dy, n * 2)); CK(cudaMalloc(&dx, n * 2));
      CK(cudaMalloc(&nbr, nt.nbr.size() * 4)); CK(cudaMalloc(&w, C * 9 * 4)); CK(cudaMalloc(&dw, C * 9 * 4)); CK(cudaMalloc(&db, C * 4));
      CK(cudaMalloc(&part, (std::size_t(1) << 20) * 10 * 4));
      CK(cudaMemcpy(nbr, nt.nbr.data(), nt.nbr.size() * 4, cudaMemcpyHostToDevice));
      { std::vector<T> h(n); std::normal_distribution<float> nx;
        for (auto& e : h) e = __float2bfloat16(nx(rng));
        CK(cudaMemcpy(x, h.data(), n * 2, cudaMemcpyHostToDevice));
        for (auto& e : h) e = __float2bfloat16(nx(rng));
        CK(cudaMemcpy(dy, h.data(), n * 2, cudaMemcpyHostToDevice));
        std::vector<float> hw(C * 9); for (auto& e : hw) e = nx(rng);
        CK(cudaMemcpy(w, hw.data(), C * 36, cudaMemcpyHostToDevice)); }
      gm_depthwise_conv_args a{};
      a.dtype = GM_BFLOAT16;
      auto t3 = [&](void* p) { gm_tensor t{}; t.data = p; t.rank = 3; t.extent[0] = B; t.extent[1] = N; t.extent[2] = C; t.stride[0] = N * C; t.stride[1] = C; t.stride[2] = 1; return t; };
      a.x = t3(x); a.dy = t3(dy); a.dx = t3(dx); a.y = t3(dx);
      a.nbr = nbr; a.kernel = 3; a.weight = w; a.dweight = dw; a.dbias = db; a.residual = 1;
      std::size_t wsb = 0; CK(gm_depthwise_conv_bwd_workspace_size(&a, &wsb));
      const float t_all = time_graph([&](cudaStream_t st) { CK(gm_depthwise_conv_bwd(&a, part, wsb, st)); });
      gm_depthwise_conv_args a_dx = a; a_dx.dweight = nullptr; a_dx.dbias = nullptr;
      const float t_dx = time_graph([&](cudaStream_t st) { CK(gm_depthwise_conv_bwd(&a_dx, nullptr, 0, st)); });
      const dw_grad_split cur = dw_grad_split_for(N, B, C);
      std::printf("%-10s stage %d B %2d N %6lld C %4lld: whole bwd %7.2f, dx alone %7.2f; current cut %d x %d (%lld parts)\n",
                  layout == 0 ? "shared" : "per-sample", s + 1, B, static_cast<long long>(N), static_cast<long long>(C), t_all, t_dx,
                  cur.tile, cur.chunk, static_cast<long long>(cur.parts()));
      std::vector<float> ref_w, ref_b;
      for (int tile : {32, 64, 128, 256, 512, 1024}) {
        for (int chunk : {1, 2, 4, 8, 16, 32, 64}) {
          if (chunk > B) continue;
          if (layout == 0 && tile > 128) continue;
          dw_grad_split sp;
          sp.tile = tile < N ? tile : static_cast<int>(N);
          sp.chunk = chunk;
          sp.tiles = static_cast<int>((N + tile - 1) / tile);
          sp.chunks = (B + chunk - 1) / chunk;
          if (sp.parts() * C > (std::int64_t(1) << 20)) continue;
          dw_grad_params g;
          g.x = x; g.dy = dy; g.x_s0 = N * C; g.x_s1 = C; g.dy_s0 = N * C; g.dy_s1 = C; g.nbr = nbr; g.partial = part;
          g.batch = B; g.tokens = static_cast<int>(N); g.channels = static_cast<int>(C); g.split = sp;
          g.gb = dw_block_groups((static_cast<int>(C) + 1) / 2);
          const int groups = static_cast<int>(C) / 2;
          const dim3 gr((groups + g.gb - 1) / g.gb, sp.tiles, sp.chunks);
          const std::int64_t outs = C * 10;
          auto run = [&](cudaStream_t st) {
            dw_grad_partial<T, 2><<<gr, k_dw_threads, 0, st>>>(g);
            dw_grad_reduce<<<(outs + 31) / 32, k_red_threads, 0, st>>>(part, sp.parts(), static_cast<int>(C), dw, db);
          };
          const float t = time_graph(run);
          const float tp = time_graph([&](cudaStream_t st) { dw_grad_partial<T, 2><<<gr, k_dw_threads, 0, st>>>(g); });
          CK(cudaDeviceSynchronize());
          std::vector<float> hw(C * 9), hb(C);
          CK(cudaMemcpy(hw.data(), dw, C * 36, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(hb.data(), db, C * 4, cudaMemcpyDeviceToHost));
          double md = 0, mx = 0;
          if (ref_w.empty()) { ref_w = hw; ref_b = hb; }
          for (std::size_t i = 0; i < hw.size(); ++i) { md = std::max(md, std::fabs(double(hw[i]) - ref_w[i])); mx = std::max(mx, std::fabs(double(ref_w[i]))); }
          for (std::size_t i = 0; i < hb.size(); ++i) { md = std::max(md, std::fabs(double(hb[i]) - ref_b[i])); mx = std::max(mx, std::fabs(double(ref_b[i]))); }
          std::printf("    cut %4d x %2d: %6lld parts, %5u CTAs: partial+reduce %7.2f (partial %7.2f)%s  max|d|/max %.1e\n", tile, chunk,
                      static_cast<long long>(sp.parts()), gr.x * gr.y * gr.z, t, tp,
                      (tile == cur.tile && chunk == cur.chunk) ? " <- current" : "", mx > 0 ? md / mx : 0.0);
        }
      }
      cudaFree(x); cudaFree(dy); cudaFree(dx); cudaFree(nbr); cudaFree(w); cudaFree(dw); cudaFree(db); cudaFree(part);
    }
  }
  return 0;
}
