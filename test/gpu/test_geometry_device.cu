// The index math of geometry.hpp evaluated by device threads equals the host evaluation: the
// kernels and the CPU reference share one definition (GREENMIM_HOST_DEVICE constexpr).
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdio>
#include <random>
#include <vector>

#include <greenmim/geometry.hpp>

namespace {

using greenmim::index_t;

struct geo_case {
  greenmim::window_geometry g;
  index_t ha, wa, hb, wb;
};

struct geo_result {
  index_t window_a, window_b, rel, slot_rel, packed, unpacked_h, unpacked_w;
  int attends;
};

__host__ __device__ geo_result evaluate(const geo_case& c) {
  geo_result r{};
  r.window_a = c.g.window_id(c.ha, c.wa);
  r.window_b = c.g.window_id(c.hb, c.wb);
  r.rel = greenmim::rel_pos_index(c.ha, c.wa, c.hb, c.wb, c.g.window);
  r.attends = greenmim::attends(r.window_a, r.window_b) ? 1 : 0;
  r.packed = greenmim::pack_coord(c.ha, c.wa);
  r.unpacked_h = greenmim::coord_h(r.packed);
  r.unpacked_w = greenmim::coord_w(r.packed);
  r.slot_rel = greenmim::slot_rel_pos_index(r.window_a, r.window_b, r.packed, greenmim::pack_coord(c.hb, c.wb),
                                            c.g.window);
  return r;
}

__global__ void evaluate_kernel(const geo_case* in, geo_result* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = evaluate(in[i]);
}

bool have_device() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}

}  // namespace

TEST_CASE("gpu geometry: device evaluation of geometry.hpp equals the host's") {
  if (!have_device()) {
    MESSAGE("SKIPPED (no CUDA device): gpu geometry");
    std::printf("[greenmim_gpu_tests] skipped: no CUDA device (gpu geometry)\n");
    return;
  }
  std::mt19937 rng(std::random_device{}());
  std::vector<geo_case> cases;
  for (int i = 0; i < 20000; ++i) {
    const index_t grid = 1 + static_cast<index_t>(rng() % 64);
    const index_t p = 1 + static_cast<index_t>(rng() % 14);
    const greenmim::window_geometry g = greenmim::make_window_geometry(grid, grid, p, (rng() & 1) ? p / 2 : 0);
    auto coord = [&] { return static_cast<index_t>(rng() % static_cast<unsigned>(grid)); };
    cases.push_back({g, coord(), coord(), coord(), coord()});
  }
  const int n = static_cast<int>(cases.size());
  geo_case* din = nullptr;
  geo_result* dout = nullptr;
  REQUIRE(cudaMalloc(&din, sizeof(geo_case) * n) == cudaSuccess);
  REQUIRE(cudaMalloc(&dout, sizeof(geo_result) * n) == cudaSuccess);
  REQUIRE(cudaMemcpy(din, cases.data(), sizeof(geo_case) * n, cudaMemcpyHostToDevice) == cudaSuccess);
  evaluate_kernel<<<(n + 255) / 256, 256>>>(din, dout, n);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  std::vector<geo_result> got(cases.size());
  REQUIRE(cudaMemcpy(got.data(), dout, sizeof(geo_result) * n, cudaMemcpyDeviceToHost) == cudaSuccess);
  cudaFree(din);
  cudaFree(dout);
  int mismatches = 0;
  for (int i = 0; i < n; ++i) {
    const geo_result want = evaluate(cases[static_cast<size_t>(i)]);
    const geo_result& g = got[static_cast<size_t>(i)];
    mismatches += want.window_a != g.window_a || want.window_b != g.window_b || want.rel != g.rel ||
                  want.slot_rel != g.slot_rel || want.packed != g.packed ||
                  want.unpacked_h != g.unpacked_h || want.unpacked_w != g.unpacked_w || want.attends != g.attends;
  }
  CHECK(mismatches == 0);
}
