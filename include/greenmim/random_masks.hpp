//! \file random_masks.hpp
//! Batch-wise random masks (the paper's Section 3.5): one mask-unit grid per micro-batch (or per
//! sample, see per-sample planning), reproducible from (seed, stream) with a portable generator,
//! and the visible token coordinates each stage of a hierarchical encoder sees.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "config.hpp"
#include "geometry.hpp"
#include "status.hpp"
#include "view.hpp"

namespace greenmim {

//! Portable 64-bit generator (splitmix64 seeding + xoshiro256**). Same stream on every platform,
//! unlike std:: distributions.
class rng {
 public:
  //! `stream` separates independent streams of one seed: e.g. the GPU rank of a data-parallel job,
  //! or the sample index for per-sample masks.
  explicit rng(std::uint64_t seed, std::uint64_t stream = 0) {
    std::uint64_t x = seed ^ (0x9E3779B97F4A7C15ull * (stream + 1));
    for (auto& si : s_) si = splitmix(x);
  }
  std::uint64_t next() {
    const std::uint64_t r = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0]; s_[3] ^= s_[1]; s_[1] ^= s_[2]; s_[0] ^= s_[3];
    s_[2] ^= t; s_[3] = rotl(s_[3], 45);
    return r;
  }
  //! Uniform integer in [0, n), n > 0, without modulo bias (Lemire's method).
  std::uint64_t below(std::uint64_t n) {
    for (;;) {
      const unsigned __int128 m = static_cast<unsigned __int128>(next()) * n;
      const std::uint64_t lo = static_cast<std::uint64_t>(m);
      if (lo >= n || lo >= (0 - n) % n) return static_cast<std::uint64_t>(m >> 64);
    }
  }
  //! Uniform double in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static std::uint64_t splitmix(std::uint64_t& x) {
    std::uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::uint64_t s_[4];
};

//! Masking set-up: image size, mask unit (32 px = the encoder's largest stride), mask ratio.
struct mask_config {
  index_t image_size = 224;
  index_t mask_unit = 32;
  double ratio = 0.75;

  //! Side of the mask-unit grid (7 for 224/32).
  index_t grid() const { return image_size / mask_unit; }
  index_t num_units() const { return grid() * grid(); }
  //! Visible units, `int(N * (1 - r))` as in the released code.
  index_t num_keep() const { return static_cast<index_t>(static_cast<double>(num_units()) * (1.0 - ratio)); }
  status validate() const {
    if (image_size <= 0 || mask_unit <= 0 || image_size % mask_unit != 0 || image_size > 32768)
      return status::invalid_argument;
    if (!(ratio >= 0.0 && ratio <= 1.0)) return status::invalid_argument;
    return status::success;
  }
};

//! Draws a random mask: `out[u] = 1` for the `num_keep()` visible units (chosen uniformly among
//! all subsets of that size), 0 for masked ones. `out.size()` must be `num_units()`.
//! O(num_units). Same (seed, stream) -> same mask on every platform.
inline status random_mask(const mask_config& cfg, std::uint64_t seed, std::uint64_t stream,
                          span<std::uint8_t> out) {
  if (status s = cfg.validate(); s != status::success) return s;
  const index_t n = cfg.num_units();
  if (out.size() != n) return status::shape_mismatch;
  std::vector<index_t> perm(static_cast<size_t>(n));
  for (index_t i = 0; i < n; ++i) perm[i] = i;
  rng g(seed, stream);
  const index_t keep = cfg.num_keep();
  for (index_t i = 0; i < keep; ++i) {  // partial Fisher-Yates: the first `keep` are the sample
    const index_t j = i + static_cast<index_t>(g.below(static_cast<std::uint64_t>(n - i)));
    const index_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
  }
  for (index_t i = 0; i < n; ++i) out[i] = 0;
  for (index_t i = 0; i < keep; ++i) out[perm[i]] = 1;
  return status::success;
}

//! Convenience: returns the mask by value (throws `greenmim::error` on bad configuration).
inline std::vector<std::uint8_t> random_mask(const mask_config& cfg, std::uint64_t seed,
                                             std::uint64_t stream = 0) {
  check(cfg.validate(), "mask_config");
  std::vector<std::uint8_t> m(static_cast<size_t>(cfg.num_units()));
  check(random_mask(cfg, seed, stream, span<std::uint8_t>(m)));
  return m;
}

//! Visible token coordinates of a stage whose token grid is `token_grid x token_grid`, given the
//! unit mask (`unit_grid x unit_grid`, row-major, nonzero = visible). Coordinates come out packed
//! (`pack_coord`) in row-major order of (h, w), as a trainer holds visible tokens.
//! `token_grid` must be a multiple of `unit_grid` (each unit covers token_grid/unit_grid tokens
//! per side). O(token_grid^2).
inline status visible_coords(span<const std::uint8_t> unit_mask, index_t unit_grid, index_t token_grid,
                             std::vector<index_t>& out) {
  out.clear();
  if (unit_grid <= 0 || token_grid <= 0 || token_grid > 32767) return status::invalid_argument;
  if (unit_mask.size() != static_cast<std::int64_t>(unit_grid) * unit_grid) return status::shape_mismatch;
  if (token_grid % unit_grid != 0) return status::misaligned;
  const index_t u = token_grid / unit_grid;
  for (index_t h = 0; h < token_grid; ++h)
    for (index_t w = 0; w < token_grid; ++w)
      if (unit_mask[(h / u) * unit_grid + w / u]) out.push_back(pack_coord(h, w));
  return status::success;
}

}  // namespace greenmim
