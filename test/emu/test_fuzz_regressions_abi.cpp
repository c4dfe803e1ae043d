// Findings of test/fuzz/fuzz_abi.cpp (the C ABI's argument checks), kept as regression tests on
// the emulator build (UBSan on the kernels' host code).
#include <doctest/doctest.h>

#include "gpu/gpu_test_util.hpp"

#include <cstdint>

namespace {

void* fake(std::uintptr_t k) { return reinterpret_cast<void*>((k + 1) * (std::uintptr_t{1} << 32)); }

}  // namespace

TEST_CASE("fuzz regression: extents whose product overflows int64 are refused, not UB") {
  // fuzz_abi: B = 2^40, N = 2^30 with consistent tensors made check_tensor's element count a signed
  // overflow (UBSan) in gm_attention_bwd_can_implement; the count now saturates and the span
  // test refuses the tensor.
  const std::int64_t B = std::int64_t{1} << 40, N = std::int64_t{1} << 30, H = 1, D = 32;
  auto rows = [&](std::uintptr_t k) { return gm_test::make_tensor(fake(k), {B, N, H, D}, {N * H * D, H * D, D, 1}); };
  gm_partition part{};
  part.gather = part.scatter = part.slot_window = part.slot_coord = static_cast<const std::int32_t*>(fake(20));
  part.group_size = 16;
  part.num_groups = 1;
  part.num_tokens = 1 << 30;
  gm_attention_bwd_args b{};
  b.dtype = GM_FLOAT32;
  b.q = rows(1), b.k = rows(2), b.v = rows(3), b.o = rows(4), b.d_o = rows(5);
  b.dq = rows(6), b.dk = rows(7), b.dv = rows(8);
  b.lse = gm_test::make_tensor(fake(9), {B, N, H}, {N * H, H, 1});
  b.part = part;
  CHECK(gm_attention_bwd_can_implement(&b) == cudaErrorInvalidValue);
  gm_attention_fwd_args f{};
  f.dtype = GM_FLOAT32;
  f.q = b.q, f.k = b.k, f.v = b.v, f.o = b.o, f.lse = b.lse, f.part = part;
  CHECK(gm_attention_fwd_can_implement(&f) == cudaErrorInvalidValue);
  gm_tensor huge = gm_test::make_tensor(fake(1), {B, N, std::int64_t{1} << 40, D}, {0, 0, 0, 1});
  f.q = f.k = f.v = huge;
  CHECK(gm_attention_fwd_can_implement(&f) == cudaErrorInvalidValue);
}
