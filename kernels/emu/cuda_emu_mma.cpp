//! \file cuda_emu_mma.cpp
//! The emulator's ldmatrix.x4 (plain and .trans) and mma.sync m16n8k16 (fp16, bf16; fp32
//! accumulate), written from the PTX ISA's fragment tables, independently of the kernels' own
//! lane maps (kernels/detail/mma_layout.hpp): warp collectives over warp_exchange.
#include "cuda_emu.hpp"
#include "emu_state.hpp"

#include <chrono>
#include <cstddef>
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

float half_inf_nan_to_float(std::uint16_t h) {  // as the CUDA headers convert them
  __half x;
  std::memcpy(static_cast<void*>(&x), &h, 2);
  return __half2float(x);
}

template <bool BF16>
inline float half_bits_to_float(std::uint16_t h) {
  if (BF16) {
    const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16, exp = (h >> 10) & 31u, man = h & 0x3ffu;
  if (exp == 31) return half_inf_nan_to_float(h);
  float f;
  if (exp == 0) {  // zero and subnormals: man * 2^-24, exact
    f = static_cast<float>(man) * 5.9604644775390625e-8f;
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    u |= sign;
    std::memcpy(&f, &u, 4);
  } else {  // normal: rebias the exponent (15 -> 127), widen the mantissa
    const std::uint32_t u = sign | ((exp + 112u) << 23) | (man << 13);
    std::memcpy(&f, &u, 4);
  }
  return f;
}

// A (16x16, row-major): a_i holds rows g (i = 0, 2) or g+8 (i = 1, 3), columns 2t, 2t+1 (i < 2)
// or 2t+8, 2t+9 (i >= 2), with g = lane / 4, t = lane % 4; the lower column in the low half.
// B (16x8, "col"): b_0 holds rows (k) 2t, 2t+1 and b_1 rows 2t+8, 2t+9, of column n = g.
// C/D (16x8): c_0, c_1 at row g, c_2, c_3 at row g+8, columns 2t, 2t+1.
// Each lane decodes the two rows of A and two columns of B its outputs need (the emulator's
// hottest function in the attention tests: no more than that).
template <bool BF16>
void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  mma_in in;
  std::memcpy(in.a, a, sizeof in.a);
  in.b[0] = b0;
  in.b[1] = b1;
  const unsigned char* all = warp_exchange(k_mma, 0xffffffffu, &in, sizeof in);
  // register `reg` of lane `owner`'s a[] (at = 0) or b[] (at = offsetof(mma_in, b))
  auto word = [&](int owner, std::size_t at, int reg) {
    unsigned w;
    std::memcpy(&w, all + static_cast<std::size_t>(owner) * slot_bytes + at + 4 * static_cast<std::size_t>(reg), 4);
    return w;
  };
  const int l = lane_id(), g = l / 4, t = l % 4;
  float arow[2][16], bcol[2][16];  // rows g, g + 8 of A; columns 2t, 2t + 1 of B
  for (int q = 0; q < 4; ++q)      // k = 2q, 2q + 1 (low, high half) and k + 8
    for (int hi_k = 0; hi_k < 2; ++hi_k) {
      const int k = 8 * hi_k + 2 * q;
      for (int r = 0; r < 2; ++r) {
        const unsigned w = word(4 * g + q, 0, r + 2 * hi_k);
        arow[r][k] = half_bits_to_float<BF16>(static_cast<std::uint16_t>(w & 0xffffu));
        arow[r][k + 1] = half_bits_to_float<BF16>(static_cast<std::uint16_t>(w >> 16));
      }
      for (int c = 0; c < 2; ++c) {
        const unsigned w = word(4 * (2 * t + c) + q, offsetof(mma_in, b), hi_k);
        bcol[c][k] = half_bits_to_float<BF16>(static_cast<std::uint16_t>(w & 0xffffu));
        bcol[c][k + 1] = half_bits_to_float<BF16>(static_cast<std::uint16_t>(w >> 16));
      }
    }
  for (int e = 0; e < 4; ++e) {
    const float* ar = arow[e >= 2 ? 1 : 0];
    const float* bc = bcol[e & 1];
    double s = 0.0;  // products of 16-bit floats are exact in fp32; the sum is rounded once
    for (int k = 0; k < 16; ++k) s += static_cast<double>(ar[k]) * static_cast<double>(bc[k]);
    d[e] = static_cast<float>(static_cast<double>(d[e]) + s);
  }
}
}  // namespace

void mma_m16n8k16_bf16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  mma_m16n8k16<true>(d, a, b0, b1);
}
void mma_m16n8k16_f16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  mma_m16n8k16<false>(d, a, b0, b1);
}

}  // namespace gm_emu
