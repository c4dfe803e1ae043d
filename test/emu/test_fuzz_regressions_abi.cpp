// Findings of test/fuzz/fuzz_abi.cpp (the C ABI's argument checks), kept as regression tests on
// the emulator build (UBSan on the kernels' host code).
#include <doctest/doctest.h>

#include "gpu/gpu_test_util.hpp"

#include "cuda_emu.hpp"

#include <cstdint>
#include <vector>

namespace {

void* fake(std::uintptr_t k) { return reinterpret_cast<void*>((k + 1) * (std::uintptr_t{1} << 32)); }
template <class T = std::int32_t>
T* fake_at(std::uintptr_t k, std::uintptr_t byte_offset = 0) {
  return reinterpret_cast<T*>(static_cast<char*>(fake(k)) + byte_offset);
}

//! Refused with a reason, nothing launched.
void check_refused(cudaError_t e, std::uint64_t blocks_before) {
  CHECK(e == cudaErrorInvalidValue);
  CHECK(gm_last_refusal()[0] != '\0');
  CHECK(gm_emu::blocks_run() == blocks_before);
}

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

TEST_CASE("fuzz regression: gm_select_visible refuses too little temporary storage with a reason") {
  // fuzz_abi_index: one byte short of the queried size was refused by CUB itself
  // (cudaErrorInvalidValue) with an empty gm_last_refusal(); the entry now compares first.
  gm_test::dbuf<std::uint8_t> mask(2 * 3 * 4);
  gm_test::dbuf<std::int32_t> pos(2 * 3 * 4), num(1);
  std::size_t bytes = 0;
  REQUIRE(gm_select_visible(nullptr, &bytes, mask.p, 2, 3, 4, pos.p, num.p, nullptr) == cudaSuccess);
  REQUIRE(bytes > 0);
  gm_test::dbuf<unsigned char> tmp(bytes);
  std::size_t short_bytes = bytes - 1;
  const std::uint64_t before = gm_emu::blocks_run();
  check_refused(gm_select_visible(tmp.p, &short_bytes, mask.p, 2, 3, 4, pos.p, num.p, nullptr), before);
  CHECK(std::string(gm_last_refusal()).find("temporary storage") != std::string::npos);
  CHECK(gm_select_visible(tmp.p, &bytes, mask.p, 2, 3, 4, pos.p, num.p, nullptr) == cudaSuccess);
}

TEST_CASE("fuzz regression: misaligned int32 / float array pointers are refused, not dereferenced") {
  // fuzz_abi_index / fuzz_abi_conv: bare int32 and float pointers one byte off were accepted and
  // then read or written misaligned (UBSan in the emulated kernels and the CUB stand-ins; a
  // misaligned-address fault on a device): gm_select_visible's d_num_visible / d_positions,
  // gm_token_windows' d_num_positions, gm_build_partition's outputs, gm_block_conv_bwd's weight,
  // dweight and dbias. Every bare array pointer of the index builders and of both convolutions
  // is now checked for 4-byte alignment.
  const std::uint64_t before = gm_emu::blocks_run();
  std::size_t bytes = 0;
  REQUIRE(gm_select_visible(nullptr, &bytes, fake_at<std::uint8_t>(1), 1, 2, 2, fake_at(2), fake_at(3), nullptr) ==
          cudaSuccess);
  check_refused(gm_select_visible(fake(4), &bytes, fake_at<std::uint8_t>(1), 1, 2, 2, fake_at(2), fake_at(3, 1), nullptr),
                before);
  check_refused(gm_select_visible(fake(4), &bytes, fake_at<std::uint8_t>(1), 1, 2, 2, fake_at(2, 2), fake_at(3), nullptr),
                before);
  const gm_window_geometry g{4, 4, 2, 0};
  check_refused(gm_token_windows(fake_at(1), fake_at(2, 1), 8, 1, g, fake_at(3), fake_at(4), fake_at(5), nullptr), before);
  check_refused(gm_token_windows(fake_at(1), fake_at(2), 8, 1, g, fake_at(3), fake_at(4), fake_at(5, 3), nullptr), before);
  REQUIRE(gm_build_partition(nullptr, &bytes, fake_at(1), fake_at(2), 4, fake_at(3), 2, fake_at(4), fake_at(5), 4, 1,
                             fake_at(6), fake_at(7), fake_at(8), fake_at(9), nullptr) == cudaSuccess);
  check_refused(gm_build_partition(fake(10), &bytes, fake_at(1), fake_at(2), 4, fake_at(3), 2, fake_at(4), fake_at(5, 2), 4,
                                   1, fake_at(6), fake_at(7), fake_at(8), fake_at(9), nullptr),
                before);

  gm_block_conv_args b{};
  b.dtype = GM_FLOAT32;
  b.x = b.dx = gm_test::make_tensor(fake(1), {1, 4, 2}, {8, 2, 1});
  b.dx.data = fake(2);
  b.dy = gm_test::make_tensor(fake(3), {1, 1, 3}, {3, 3, 1});
  b.gather = fake_at(4);
  b.stride = 2;
  b.weight = fake_at<const float>(5);
  b.dbias = fake_at<float>(6, 1);
  check_refused(gm_block_conv_bwd(&b, nullptr, 0, nullptr), before);
  CHECK(gm_block_conv_bwd_can_implement(&b) == cudaErrorInvalidValue);
  b.dbias = fake_at<float>(6);
  CHECK(gm_block_conv_bwd_can_implement(&b) == cudaSuccess);
  b.gather = fake_at(4, 2);
  CHECK(gm_block_conv_bwd_can_implement(&b) == cudaErrorInvalidValue);

  gm_depthwise_conv_args d{};
  d.dtype = GM_FLOAT16;
  d.x = gm_test::make_tensor(fake(1), {1, 2, 8}, {16, 8, 1});
  d.y = gm_test::make_tensor(fake(2), {1, 2, 8}, {16, 8, 1});
  d.nbr = fake_at(3);
  d.kernel = 3;
  d.weight = fake_at<const float>(4);
  CHECK(gm_depthwise_conv_fwd_can_implement(&d) == cudaSuccess);
  d.weight = fake_at<const float>(4, 2);
  check_refused(gm_depthwise_conv_fwd(&d, nullptr), before);
}

TEST_CASE("fuzz regression: block conv extents whose products overflow int64 are refused, not UB") {
  // fuzz_abi_conv (with -use_value_profile=1; corpus regress_block_conv_extent_product_overflow):
  // check_block_args multiplied B * N_next and B * N * C_in of caller extents before any bound,
  // a signed overflow for extents near 2^62 (and B above int32 with empty tensors was truncated
  // to int). Products now saturate; every extent is bounded by int32 first.
  const std::int64_t B = std::int64_t{1} << 62;
  gm_block_conv_args b{};
  b.dtype = GM_FLOAT32;
  b.x = gm_test::make_tensor(fake(1), {B, 4, 2}, {0, 2, 1});
  b.y = gm_test::make_tensor(fake(2), {B, 12, 3}, {36, 3, 1});
  b.gather = fake_at(3);
  b.stride = 2;
  b.weight = fake_at<const float>(4);
  CHECK(gm_block_conv_fwd_can_implement(&b) == cudaErrorInvalidValue);
  b.x = gm_test::make_tensor(fake(1), {4, std::int64_t{1} << 40, std::int64_t{1} << 40}, {0, 0, 1});
  b.y = gm_test::make_tensor(fake(2), {4, 1, 3}, {3, 3, 1});
  CHECK(gm_block_conv_fwd_can_implement(&b) == cudaErrorInvalidValue);
  b.x = gm_test::make_tensor(fake(1), {std::int64_t{1} << 33, 0, 2}, {0, 2, 1});  // empty, batch beyond int32
  b.y = gm_test::make_tensor(fake(2), {std::int64_t{1} << 33, 0, 3}, {3, 3, 1});
  CHECK(gm_block_conv_fwd_can_implement(&b) == cudaErrorInvalidValue);
}

TEST_CASE("fuzz regression: gm_build_partition drops a window whose slot offset overflows int32") {
  // Found while writing fuzz_abi_index: place_tokens_kernel tested off + rank >= G with off read
  // from d_window_slot_offset (any int32): off = INT32_MAX and rank 1 overflowed (UBSan in the
  // emulated kernel; on a device it wraps negative, passes the test and writes gather[] out of
  // bounds). It now tests rank >= G - off: the window's tokens are dropped, as documented.
  const std::vector<std::int32_t> coords{0, 1}, token_window{0, 0}, sizes{2}, group{0}, offset{0x7fffffff};
  auto d_coords = gm_test::to_device(coords), d_tw = gm_test::to_device(token_window), d_sizes = gm_test::to_device(sizes);
  auto d_group = gm_test::to_device(group), d_off = gm_test::to_device(offset);
  const int G = 4, groups = 1;
  gm_test::dbuf<std::int32_t> gather(G * groups), scatter(2), slot_window(G * groups), slot_coord(G * groups);
  std::size_t bytes = 0;
  REQUIRE(gm_build_partition(nullptr, &bytes, d_coords.p, d_tw.p, 2, d_sizes.p, 1, d_group.p, d_off.p, G, groups, gather.p,
                             scatter.p, slot_window.p, slot_coord.p, nullptr) == cudaSuccess);
  gm_test::dbuf<unsigned char> tmp(bytes);
  REQUIRE(gm_build_partition(tmp.p, &bytes, d_coords.p, d_tw.p, 2, d_sizes.p, 1, d_group.p, d_off.p, G, groups, gather.p,
                             scatter.p, slot_window.p, slot_coord.p, nullptr) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(scatter.download() == std::vector<std::int32_t>{-1, -1});
  CHECK(gather.download() == std::vector<std::int32_t>(G * groups, -1));
}
