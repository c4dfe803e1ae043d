// GPU tests of both conv entry points (kernels/depthwise_conv.cu, kernels/block_conv.cu): the
// refusals before any launch and, on the CPU emulator, bitwise identical results under every
// thread schedule. Each kernel's own cases: test_depthwise_conv_gpu.cpp, test_block_conv_gpu.cpp.
#include "conv_test_util.hpp"

using namespace gm_test;
using namespace gm_conv_test;
using greenmim::index_t;
using greenmim::make_view;
using greenmim::span;

TEST_CASE("gpu conv entry points refuse bad arguments before launching") {
  // no device needed: every refusal happens on the host
  std::vector<float> host(64);
  float* p = host.data();
  gm_depthwise_conv_args a{};
  a.dtype = GM_FLOAT32;
  a.x = make_tensor(p, {1, 2, 4}, {8, 4, 1});
  a.y = make_tensor(p + 16, {1, 2, 4}, {8, 4, 1});
  const index_t nbr[18] = {};
  a.nbr = nbr;
  a.weight = p + 32;
  a.kernel = 3;
  CHECK(gm_depthwise_conv_fwd_can_implement(&a) == cudaSuccess);
  a.kernel = 9;  // beyond the kernels' stencils (test_depthwise_k_gpu.cpp: every k)
  CHECK(gm_depthwise_conv_fwd_can_implement(&a) == cudaErrorInvalidValue);
  CHECK(std::string(gm_last_refusal()).find("kernel") != std::string::npos);
  a.kernel = 3;
  a.y = make_tensor(p + 4, {1, 2, 4}, {8, 4, 1});  // overlaps x
  CHECK(gm_depthwise_conv_fwd(&a, nullptr) == cudaErrorInvalidValue);
  a.y = make_tensor(p + 16, {1, 3, 4}, {12, 4, 1});
  CHECK(gm_depthwise_conv_fwd(&a, nullptr) == cudaErrorInvalidValue);
  a.y = make_tensor(p + 16, {1, 2, 4}, {8, 4, 1});
  a.nbr = nullptr;
  CHECK(gm_depthwise_conv_fwd(&a, nullptr) == cudaErrorInvalidValue);
  a.nbr = nbr;
  a.dtype = static_cast<gm_dtype>(7);
  CHECK(gm_depthwise_conv_fwd(&a, nullptr) == cudaErrorInvalidValue);
  a.dtype = GM_FLOAT32;
  a.dy = make_tensor(p + 16, {1, 2, 4}, {8, 4, 1});
  a.dx = make_tensor(p + 40, {1, 2, 4}, {8, 4, 1});
  a.dweight = p + 56;
  std::size_t bytes = 0;
  CHECK(gm_depthwise_conv_bwd_workspace_size(&a, &bytes) == cudaSuccess);
  CHECK(bytes == 4 * 10 * sizeof(float));
  CHECK(gm_depthwise_conv_bwd(&a, nullptr, 0, nullptr) == cudaErrorInvalidValue);  // workspace too small
  CHECK(std::string(gm_last_refusal()).find("workspace") != std::string::npos);
  CHECK(gm_depthwise_conv_bwd_workspace_size(nullptr, &bytes) == cudaErrorInvalidValue);

  gm_block_conv_args b{};
  b.dtype = GM_FLOAT16;
  b.x = make_tensor(p, {1, 4, 2}, {8, 2, 1});
  b.y = make_tensor(p + 16, {1, 1, 3}, {3, 3, 1});
  const index_t g4[4] = {0, 1, 2, 3};
  b.gather = g4;
  b.stride = 2;
  b.weight = p + 32;
  CHECK(gm_block_conv_fwd_can_implement(&b) == cudaSuccess);
  b.stride = 0;
  CHECK(gm_block_conv_fwd(&b, nullptr, 0, nullptr) == cudaErrorInvalidValue);
  b.stride = 2;
  b.gather = nullptr;
  CHECK(gm_block_conv_fwd(&b, nullptr, 0, nullptr) == cudaErrorInvalidValue);
  b.gather = g4;
  b.x = make_tensor(p, {1, 4, 2}, {8, 1, 2});  // last stride not 1
  CHECK(gm_block_conv_fwd(&b, nullptr, 0, nullptr) == cudaErrorInvalidValue);
  CHECK(gm_block_conv_bwd(nullptr, nullptr, 0, nullptr) == cudaErrorInvalidValue);
  std::size_t ws_bytes = 0;
  CHECK(gm_block_conv_fwd_workspace_size(&b, &ws_bytes) == cudaErrorInvalidValue);  // the bad x, again
  CHECK(gm_block_conv_bwd_workspace_size(nullptr, &ws_bytes) == cudaErrorInvalidValue);
  {  // more channels than the depthwise grid's channel blocks can hold (65535 x 32)
    gm_depthwise_conv_args big = a;
    big.x = make_tensor(p, {1, 1, 3000000}, {3000000, 3000000, 1});
    CHECK(gm_depthwise_conv_fwd_can_implement(&big) == cudaErrorInvalidValue);
    CHECK(std::string(gm_last_refusal()).find("too many channels") != std::string::npos);
  }
  {  // 2^30 samples (x's sample stride 0: no memory behind them): the forward's sample index
    // b + grid.z could pass int range
    gm_depthwise_conv_args big = a;
    big.x = make_tensor(p, {std::int64_t(1) << 30, 2, 4}, {0, 4, 1});
    big.y = make_tensor(p + 16, {std::int64_t(1) << 30, 2, 4}, {8, 4, 1});
    CHECK(gm_depthwise_conv_fwd_can_implement(&big) == cudaErrorInvalidValue);
    CHECK(std::string(gm_last_refusal()).find("B < 2^30") != std::string::npos);
  }
  {  // s = 1, C_in = 2^31 - 8: s*s*C_in + 1 (the dbias column) fits an int, rounded up to 8 not
    gm_block_conv_args big = b;
    big.stride = 1;
    big.x = make_tensor(p, {1, 1, 0x7ffffff8}, {0x7ffffff8, 0x7ffffff8, 1});
    big.dy = make_tensor(p, {1, 1, 3}, {3, 3, 1});
    CHECK(gm_block_conv_bwd_can_implement(&big) == cudaErrorInvalidValue);
    CHECK(std::string(gm_last_refusal()).find("s * s * C_in + 1") != std::string::npos);
  }
}

#if defined(GREENMIM_CUDA_EMULATION)
#include "cuda_emu.hpp"

TEST_CASE("emulated conv kernels: bitwise identical under every thread schedule (no races between barriers)") {
  struct restore {
    ~restore() {
      gm_emu::set_schedule(gm_emu::schedule::forward);
      gm_emu::set_cp_async_timing(gm_emu::cp_async_timing::at_wait);
    }
  } guard;
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed << " (GM_TEST_SEED)");
  auto run_all = [](std::uint64_t inputs) {
    std::mt19937_64 rng(inputs);
    std::vector<bytes> out;
    const auto c = unit_mask_coords(rng, 16, 4, 0.5);
    const std::vector<index_t> cu{0, static_cast<index_t>(c.size())};
    for (auto& b : depthwise_case("schedule", cu, c, 16, 2, 16, GM_BFLOAT16, true, rng)) out.push_back(b);
    for (auto& b : depthwise_case("schedule", cu, c, 16, 1, 3, GM_FLOAT32, false, rng)) out.push_back(b);
    for (auto& b : depthwise_case("schedule", cu, c, 16, 11, 16, GM_FLOAT16, true, rng)) out.push_back(b);
    for (auto& b : block_case("schedule", cu, c, 16, 4, 2, 12, 20, GM_FLOAT16, rng)) out.push_back(b);
    // C_in a multiple of 8: the forward's cp.async ring (gather_gemm_async). Here 4 steps per
    // split (the ring's slots reused) and 64 x 72 outputs, so every warp's outputs are real: a
    // warp that overwrote a slot another still reads would change the result
    for (auto& b : block_case("schedule", cu, c, 16, 2, 2, 64, 72, GM_BFLOAT16, rng)) out.push_back(b);
    for (auto& b : block_case("schedule", cu, c, 16, 4, 2, 64, 24, GM_BFLOAT16, rng)) out.push_back(b);
    return out;
  };
  std::mt19937_64 rng(seed);
  const std::uint64_t inputs = rng();
  const auto want = check_schedules_agree(run_all, inputs, rng);
  // cp.async landing when issued (the other end of its window): a copy into a ring slot that other
  // warps still read changes what they read where one warp runs ahead (greedy)
  gm_emu::set_cp_async_timing(gm_emu::cp_async_timing::at_issue);
  for (const auto& sch : {std::make_pair(gm_emu::schedule::forward, std::uint64_t(0)),
                          std::make_pair(gm_emu::schedule::greedy, std::uint64_t(0))}) {
    INFO("cp.async at issue, schedule " << static_cast<int>(sch.first));
    gm_emu::set_schedule(sch.first, sch.second);
    const auto got = run_all(inputs);
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == want[i]);
  }
}
#endif

