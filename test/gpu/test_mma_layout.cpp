// Host emulation of the tensor-core forward's data movement (runs without a GPU): ldmatrix.x4
// (plain and .trans) and mma.sync.m16n8k16 are emulated from the PTX ISA fragment tables, and
// driven with the lane addressing of kernels/detail/mma_layout.hpp, the very functions the kernel
// calls. S = Q K^T of a 16-row tile against 64 keys and O = P V must equal plain matrix products.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "../../kernels/detail/mma_layout.hpp"
#include "gpu_test_util.hpp"

namespace {

namespace L = greenmim::detail::cuda::mma_layout;
using gm_test::bf16_to_f32;
using gm_test::f32_to_bf16;

//! A shared-memory tile of 16-bit values with a padded row stride, as the kernel lays it out.
struct smem16 {
  int rows = 0, ld = 0;
  std::vector<std::uint16_t> v;
  smem16(int r, int ld_) : rows(r), ld(ld_), v(static_cast<std::size_t>(r) * ld_, 0) {}
  mutable int out_of_bounds = 0;
  std::uint16_t at(int r, int c) const {
    if (r < 0 || r >= rows || c < 0 || c >= ld) {
      ++out_of_bounds;
      return 0;
    }
    return v[static_cast<std::size_t>(r) * ld + c];
  }
  float f(int r, int c) const { return bf16_to_f32(at(r, c)); }
};

using regs4 = std::uint32_t[32][4];

//! ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: lanes 8i..8i+7 give the addresses (row,
//! col offset into `m`) of the 8 rows of matrix i; register i of lane T receives, without
//! .trans, elements (T/4, 2(T%4)) and (T/4, 2(T%4)+1) of matrix i; with .trans, elements
//! (2(T%4), T/4) and (2(T%4)+1, T/4). The first element goes to the low 16 bits.
void ldmatrix_x4(const smem16& m, const int (&row)[32], const int (&col)[32], bool trans, regs4& out) {
  for (int i = 0; i < 4; ++i)
    for (int t = 0; t < 32; ++t) {
      std::uint16_t e0, e1;
      if (!trans) {
        const int src = 8 * i + t / 4, c = 2 * (t % 4);
        e0 = m.at(row[src], col[src] + c);
        e1 = m.at(row[src], col[src] + c + 1);
      } else {
        const int r0 = 8 * i + 2 * (t % 4), c = t / 4;
        e0 = m.at(row[r0], col[r0] + c);
        e1 = m.at(row[r0 + 1], col[r0 + 1] + c);
      }
      out[t][i] = static_cast<std::uint32_t>(e0) | (static_cast<std::uint32_t>(e1) << 16);
    }
}

float lo(std::uint32_t r) { return bf16_to_f32(static_cast<std::uint16_t>(r & 0xffffu)); }
float hi(std::uint32_t r) { return bf16_to_f32(static_cast<std::uint16_t>(r >> 16)); }

//! mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, d = a * b + d. Fragments (PTX ISA):
//! A element a_j (j = 0..7, register j/2, half j%2): row = group + 8 * ((j >> 1) & 1),
//! col = 2 tig + (j & 1) + 8 * (j >= 4). B element b_j (j = 0..3): k = 2 tig + (j & 1) + 8 * (j >= 2),
//! n = group. C element c_j: row = group + 8 * (j >= 2), col = 2 tig + (j & 1).
void mma16816(const std::uint32_t (&a)[32][4], const std::uint32_t (&b0)[32], const std::uint32_t (&b1)[32],
              float (&d)[32][4]) {
  float A[16][16] = {}, B[16][8] = {};
  for (int t = 0; t < 32; ++t) {
    const int g = t >> 2, q = t & 3;
    for (int j = 0; j < 8; ++j) {
      const std::uint32_t r = a[t][j / 2];
      A[g + 8 * ((j >> 1) & 1)][2 * q + (j & 1) + (j >= 4 ? 8 : 0)] = (j & 1) ? hi(r) : lo(r);
    }
    for (int j = 0; j < 4; ++j) {
      const std::uint32_t r = j < 2 ? b0[t] : b1[t];
      B[2 * q + (j & 1) + (j >= 2 ? 8 : 0)][g] = (j & 1) ? hi(r) : lo(r);
    }
  }
  for (int t = 0; t < 32; ++t)
    for (int j = 0; j < 4; ++j) {
      const int row = (t >> 2) + (j >= 2 ? 8 : 0), c = 2 * (t & 3) + (j & 1);
      float acc = d[t][j];
      for (int k = 0; k < 16; ++k) acc += A[row][k] * B[k][c];
      d[t][j] = acc;
    }
}

std::uint32_t pack_bf16(float a, float b) {
  return static_cast<std::uint32_t>(f32_to_bf16(a)) | (static_cast<std::uint32_t>(f32_to_bf16(b)) << 16);
}

}  // namespace

TEST_CASE("mma layout (host emulation): S = Q K^T and O = P V through the kernel's fragment addressing") {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int D : {32, 64}) {
    INFO("head_dim " << D);
    const int LDS = D + 8, ROWS = 64, r0 = 16 * static_cast<int>(rng() % 4);  // a random warp's rows
    smem16 qs(ROWS, LDS), ks(ROWS, LDS), vs(ROWS, LDS);
    for (int r = 0; r < ROWS; ++r)
      for (int c = 0; c < D; ++c) {
        qs.v[static_cast<std::size_t>(r) * LDS + c] = f32_to_bf16(nd(rng));
        ks.v[static_cast<std::size_t>(r) * LDS + c] = f32_to_bf16(nd(rng));
        vs.v[static_cast<std::size_t>(r) * LDS + c] = f32_to_bf16(nd(rng));
      }
    // ---- S = Q K^T, as the kernel issues it ----
    float s[8][32][4] = {};
    for (int kk = 0; kk < D / 16; ++kk) {
      int arow[32], acol[32];
      for (int t = 0; t < 32; ++t) {
        arow[t] = r0 + L::a_ld_row(t);
        acol[t] = kk * 16 + L::a_ld_col(t);
      }
      regs4 a;
      ldmatrix_x4(qs, arow, acol, false, a);
      for (int np = 0; np < 4; ++np) {
        int brow[32], bcol[32];
        for (int t = 0; t < 32; ++t) {
          brow[t] = np * 16 + L::bk_ld_row(t);
          bcol[t] = kk * 16 + L::bk_ld_col(t);
        }
        regs4 bk;
        ldmatrix_x4(ks, brow, bcol, false, bk);
        std::uint32_t b0[32], b1[32], b2[32], b3[32];
        for (int t = 0; t < 32; ++t) {
          b0[t] = bk[t][0]; b1[t] = bk[t][1]; b2[t] = bk[t][2]; b3[t] = bk[t][3];
        }
        mma16816(a, b0, b1, s[2 * np]);
        mma16816(a, b2, b3, s[2 * np + 1]);
      }
    }
    int bad = 0;
    for (int nt = 0; nt < 8; ++nt)
      for (int t = 0; t < 32; ++t)
        for (int e = 0; e < 4; ++e) {
          const int row = r0 + L::acc_row(t, e), key = nt * 8 + L::acc_col(t, e);
          double ref = 0;
          for (int c = 0; c < D; ++c) ref += double(qs.f(row, c)) * ks.f(key, c);
          bad += std::abs(ref - s[nt][t][e]) > 1e-3 * (1 + std::abs(ref));
        }
    CHECK(bad == 0);

    // ---- O = P V with P taken from the accumulator layout (any P: use the S values) ----
    float o[8][32][4] = {};
    for (int kc = 0; kc < 4; ++kc) {
      std::uint32_t a[32][4];
      for (int t = 0; t < 32; ++t) {
        float lo_t[4], hi_t[4];
        for (int e = 0; e < 4; ++e) {
          lo_t[e] = s[2 * kc][t][e];
          hi_t[e] = s[2 * kc + 1][t][e];
        }
        unsigned frag[4];
        L::acc_to_a(lo_t, hi_t, frag, pack_bf16);
        for (int i = 0; i < 4; ++i) a[t][i] = frag[i];
      }
      for (int dp = 0; dp < D / 16; ++dp) {
        int vrow[32], vcol[32];
        for (int t = 0; t < 32; ++t) {
          vrow[t] = kc * 16 + L::bv_ld_row(t);
          vcol[t] = dp * 16 + L::bv_ld_col(t);
        }
        regs4 bv;
        ldmatrix_x4(vs, vrow, vcol, true, bv);
        std::uint32_t b0[32], b1[32], b2[32], b3[32];
        for (int t = 0; t < 32; ++t) {
          b0[t] = bv[t][0]; b1[t] = bv[t][1]; b2[t] = bv[t][2]; b3[t] = bv[t][3];
        }
        mma16816(a, b0, b1, o[2 * dp]);
        mma16816(a, b2, b3, o[2 * dp + 1]);
      }
    }
    // reference: P[row][key] = bf16(S) exactly as packed
    bad = 0;
    for (int dt = 0; dt < D / 8; ++dt)
      for (int t = 0; t < 32; ++t)
        for (int e = 0; e < 4; ++e) {
          const int row = L::acc_row(t, e), dim = dt * 8 + L::acc_col(t, e);
          double ref = 0;
          for (int key = 0; key < 64; ++key) {
            // find the lane/element holding P[row][key] in the accumulator layout
            const int nt = key / 8, kcol = key % 8;
            float pv = 0;
            for (int u = 0; u < 32; ++u)
              for (int f = 0; f < 4; ++f)
                if (L::acc_row(u, f) == row && L::acc_col(u, f) == kcol) pv = s[nt][u][f];
            ref += double(bf16_to_f32(f32_to_bf16(pv))) * vs.f(key, dim);
          }
          bad += std::abs(ref - o[dt][t][e]) > 1e-3 * (1 + std::abs(ref));
        }
    CHECK(bad == 0);
    CHECK(qs.out_of_bounds + ks.out_of_bounds + vs.out_of_bounds == 0);
  }
}

TEST_CASE("mma layout (host emulation): every accumulator element has a distinct (row, col)") {
  std::vector<int> seen(16 * 8, 0);
  for (int t = 0; t < 32; ++t)
    for (int e = 0; e < 4; ++e) ++seen[static_cast<std::size_t>(L::acc_row(t, e) * 8 + L::acc_col(t, e))];
  for (int x : seen) CHECK(x == 1);
}
