//! \file cuda_emu_mma.cpp
//! The emulator's ldmatrix.x4 (plain and .trans) and mma.sync m16n8k16 (fp16, bf16; fp32
//! accumulate), written from the PTX ISA's fragment tables, independently of the kernels' own
//! lane maps (kernels/detail/mma_layout.hpp): warp collectives over warp_exchange.
#include "cuda_emu.hpp"
#include "emu_state.hpp"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace gm_emu {
using namespace internal;

// ---- ldmatrix / mma.sync (PTX ISA: "Warp-level matrix load instruction: ldmatrix" and "Matrix
// Fragments for mma.m16n8k16 with floating point type") ------------------------------------------
void ldmatrix_x4(unsigned (&r)[4], const void* p, bool trans) {
  const char* smem = static_cast<const char*>(g_smem.user);
  const char* a = static_cast<const char*>(p);
  if (smem == nullptr || a < smem || a + 16 > smem + g_smem_bytes)
    fault("ldmatrix row address outside the dynamic shared memory");
  if (reinterpret_cast<std::uintptr_t>(a) % 16 != 0) fault("ldmatrix row address not 16-byte aligned");
  const unsigned char* all = warp_exchange(k_ldmatrix, 0xffffffffu, &p, sizeof(p));
  auto row_ptr = [&](int src_lane) {
    const void* q;
    std::memcpy(&q, all + static_cast<std::size_t>(src_lane) * slot_bytes, sizeof(q));
    return static_cast<const unsigned char*>(q);
  };
  const int l = lane_id();
  for (int i = 0; i < 4; ++i) {  // matrix i: rows from lanes 8i .. 8i+7
    std::uint16_t lo, hi;
    if (!trans) {  // thread l holds row l/4, columns 2(l%4), 2(l%4)+1
      const unsigned char* row = row_ptr(8 * i + l / 4);
      std::memcpy(&lo, row + 2 * (2 * (l % 4)), 2);
      std::memcpy(&hi, row + 2 * (2 * (l % 4) + 1), 2);
    } else {  // transposed: thread l holds column l/4 of rows 2(l%4), 2(l%4)+1
      std::memcpy(&lo, row_ptr(8 * i + 2 * (l % 4)) + 2 * (l / 4), 2);
      std::memcpy(&hi, row_ptr(8 * i + 2 * (l % 4) + 1) + 2 * (l / 4), 2);
    }
    r[i] = static_cast<unsigned>(lo) | (static_cast<unsigned>(hi) << 16);
  }
}

namespace {
struct mma_in {
  unsigned a[4];
  unsigned b[2];
};

float half_bits_to_float(std::uint16_t h, bool bf16) {
  if (bf16) {
    const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  __half x;
  std::memcpy(static_cast<void*>(&x), &h, 2);
  return __half2float(x);
}

// A (16x16, row-major): a_i holds rows g (i = 0, 2) or g+8 (i = 1, 3), columns 2t, 2t+1 (i < 2)
// or 2t+8, 2t+9 (i >= 2), with g = lane / 4, t = lane % 4; the lower column in the low half.
// B (16x8, "col"): b_0 holds rows (k) 2t, 2t+1 and b_1 rows 2t+8, 2t+9, of column n = g.
// C/D (16x8): c_0, c_1 at row g, c_2, c_3 at row g+8, columns 2t, 2t+1.
void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1, bool bf16) {
  mma_in in;
  std::memcpy(in.a, a, sizeof in.a);
  in.b[0] = b0;
  in.b[1] = b1;
  const unsigned char* all = warp_exchange(k_mma, 0xffffffffu, &in, sizeof in);
  auto lane_in = [&](int l) {
    mma_in x;
    std::memcpy(&x, all + static_cast<std::size_t>(l) * slot_bytes, sizeof x);
    return x;
  };
  auto half_of = [](unsigned w, int hi) { return static_cast<std::uint16_t>(hi ? w >> 16 : w & 0xffffu); };
  auto A = [&](int row, int k) {
    const int owner = 4 * (row % 8) + (k % 8) / 2;
    const int reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
    return half_bits_to_float(half_of(lane_in(owner).a[reg], k % 2), bf16);
  };
  auto B = [&](int k, int n) {
    const int owner = 4 * n + (k % 8) / 2;
    return half_bits_to_float(half_of(lane_in(owner).b[k >= 8 ? 1 : 0], k % 2), bf16);
  };
  const int l = lane_id(), g = l / 4, t = l % 4;
  for (int e = 0; e < 4; ++e) {
    const int row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
    double s = 0.0;  // products of 16-bit floats are exact in fp32; the sum is rounded once
    for (int k = 0; k < 16; ++k) s += static_cast<double>(A(row, k)) * static_cast<double>(B(k, col));
    d[e] = static_cast<float>(static_cast<double>(d[e]) + s);
  }
}
}  // namespace

void mma_m16n8k16_bf16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  mma_m16n8k16(d, a, b0, b1, true);
}
void mma_m16n8k16_f16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  mma_m16n8k16(d, a, b0, b1, false);
}

}  // namespace gm_emu
