//! \file gpu_test_util.hpp
//! Helpers of the GPU tests (host code, compiled by the C++ compiler): device detection with a
//! visible skip, RAII device buffers, host fp16/bf16 conversions, typed host tensors, random
//! problems (mask -> windows -> plan -> partition with the host builders), error norms.
#pragma once

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <greenmim/kernels.h>
#include <greenmim/kernels.hpp>

#include <greenmim/geometry.hpp>
#include <greenmim/random_masks.hpp>
#include <greenmim/partition.hpp>
#include <greenmim/plan.hpp>
#include <greenmim/planner.hpp>

namespace gm_test {

using greenmim::index_t;

//! True when a CUDA device is usable (cached). Never throws.
inline bool cuda_available() {
  static const bool ok = [] {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return n > 0;
  }();
  return ok;
}

//! Every device test case starts with this: without a device it prints a visible skip and returns.
#define GM_SKIP_WITHOUT_DEVICE()                                                       \
  do {                                                                                 \
    if (!::gm_test::cuda_available()) {                                                \
      MESSAGE("SKIPPED (no CUDA device): " << std::string(doctest::getContextOptions()->currentTest->m_name)); \
      std::printf("[greenmim_gpu_tests] skipped: no CUDA device (%s)\n",              \
                  doctest::getContextOptions()->currentTest->m_name);                 \
      return;                                                                          \
    }                                                                                  \
  } while (0)

#define GM_CHECK_CUDA(expr)                                                                        \
  do {                                                                                             \
    const cudaError_t gm_e_ = (expr);                                                              \
    INFO(#expr << " -> " << cudaGetErrorString(gm_e_) << " | refusal: " << gm_last_refusal());    \
    REQUIRE(gm_e_ == cudaSuccess);                                                                 \
  } while (0)

//! Seed for "fresh random inputs every run", printed so a failure can be replayed
//! (GM_TEST_SEED=<n> fixes it).
inline std::uint64_t fresh_seed() {
  if (const char* s = std::getenv("GM_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  std::random_device rd;
  return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
}

//! Owning device buffer (tests only: the library never allocates).
template <class T>
struct dbuf {
  T* p = nullptr;
  std::size_t n = 0;
  dbuf() = default;
  explicit dbuf(std::size_t count) : n(count) {
    if (count > 0) REQUIRE(cudaMalloc(reinterpret_cast<void**>(&p), count * sizeof(T)) == cudaSuccess);
  }
  dbuf(const dbuf&) = delete;
  dbuf& operator=(const dbuf&) = delete;
  dbuf(dbuf&& o) noexcept : p(o.p), n(o.n) { o.p = nullptr; o.n = 0; }
  dbuf& operator=(dbuf&& o) noexcept {
    std::swap(p, o.p);
    std::swap(n, o.n);
    return *this;
  }
  ~dbuf() {
    if (p) cudaFree(p);
  }
  void upload(const std::vector<T>& h) {
    REQUIRE(h.size() == n);
    if (n) REQUIRE(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  std::vector<T> download() const {
    std::vector<T> h(n);
    if (n) REQUIRE(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  }
  void fill_bytes(int byte) {
    if (n) REQUIRE(cudaMemset(p, byte, n * sizeof(T)) == cudaSuccess);
  }
};

template <class T>
dbuf<T> to_device(const std::vector<T>& h) {
  dbuf<T> d(h.size());
  d.upload(h);
  return d;
}

// ---- host fp16 / bf16 ------------------------------------------------------------------------------
inline std::uint16_t f32_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) return static_cast<std::uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
inline float bf16_to_f32(std::uint16_t h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline std::uint16_t f32_to_f16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t mant = x & 0x7fffffu;
  const int exp = static_cast<int>((x >> 23) & 0xffu);
  if (exp == 0xff) return static_cast<std::uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  const int e = exp - 112;
  if (e >= 31) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    if (exp == 0) return static_cast<std::uint16_t>(sign);  // float subnormals round to 0
    const int shift = 14 - e;
    if (shift > 24) return static_cast<std::uint16_t>(sign);
    mant |= 0x800000u;
    std::uint32_t h = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = (static_cast<std::uint32_t>(e) << 10) | (mant >> 13);
  const std::uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}
inline float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16;
  const int exp = (h >> 10) & 0x1f;
  const std::uint32_t mant = h & 0x3ffu;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -f : f;
  }
  std::uint32_t u;
  if (exp == 31) u = sign | 0x7f800000u | (mant << 13);
  else u = sign | (static_cast<std::uint32_t>(exp - 15 + 127) << 23) | (mant << 13);
  std::memcpy(&f, &u, 4);
  return f;
}

//! A host tensor of `dtype` elements stored as raw bytes (what goes to the device), with float
//! access. `rounded(x)` is what the device will see for x.
struct htensor {
  gm_dtype dtype = GM_FLOAT32;
  std::vector<unsigned char> bytes;
  htensor() = default;
  htensor(gm_dtype dt, std::size_t n) : dtype(dt), bytes(n * gm_dtype_size(dt)) {}
  std::size_t size() const { return bytes.size() / gm_dtype_size(dtype); }
  void set(std::size_t i, float x) {
    if (dtype == GM_FLOAT32) std::memcpy(&bytes[i * 4], &x, 4);
    else {
      const std::uint16_t h = dtype == GM_FLOAT16 ? f32_to_f16(x) : f32_to_bf16(x);
      std::memcpy(&bytes[i * 2], &h, 2);
    }
  }
  float get(std::size_t i) const {
    if (dtype == GM_FLOAT32) {
      float x;
      std::memcpy(&x, &bytes[i * 4], 4);
      return x;
    }
    std::uint16_t h;
    std::memcpy(&h, &bytes[i * 2], 2);
    return dtype == GM_FLOAT16 ? f16_to_f32(h) : bf16_to_f32(h);
  }
};

inline dbuf<unsigned char> to_device(const htensor& h) { return to_device(h.bytes); }

//! A C tensor descriptor over device memory.
inline gm_tensor make_tensor(void* data, std::initializer_list<std::int64_t> extent,
                             std::initializer_list<std::int64_t> stride) {
  gm_tensor t{};
  t.data = data;
  t.rank = static_cast<int>(extent.size());
  int i = 0;
  for (auto e : extent) t.extent[i++] = e;
  i = 0;
  for (auto s : stride) t.stride[i++] = s;
  return t;
}

//! ||a - b|| / ||b|| over the entries where `mask` (if given) is set; NaN anywhere in a -> inf.
inline double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline double tolerance(gm_dtype dt) { return dt == GM_FLOAT32 ? 1e-5 : 1e-2; }

// ---- random problems ----------------------------------------------------------------------------------

//! Host partition of one stage and what the kernels need to know about it.
struct problem {
  std::string name;
  greenmim::window_geometry geom{};
  greenmim::window_list windows;
  greenmim::plan plan;
  greenmim::partition_indices part;
  std::int64_t batch = 1;  //!< B of the attention tensors (1 for the per-sample flat layout)
};

//! Shared mask (the paper): a random 7x7 unit mask with `keep` visible units (released rule:
//! int(49 * (1 - 0.75)) = 12), token grid `grid`, window/shift, planned with `strat`.
//! The planner's plan for `sizes`, with G <= `max_g` when `max_g` > 0 (planner_options::
//! max_group_size: for tests of a path with a G limit, e.g. the one-pass tensor-core forward's
//! 64, since the planner may pick any G at or above the largest window, 65 included).
inline void plan_within(const std::vector<index_t>& sizes, greenmim::planner_options opt, index_t max_g,
                        greenmim::plan& out) {
  if (opt.group_size == 0) opt.max_group_size = max_g;
  REQUIRE(greenmim::make_plan(greenmim::span<const index_t>(sizes), opt, 128, out) == greenmim::status::success);
  if (max_g > 0) REQUIRE(out.group_size <= max_g);
}

inline problem shared_mask_problem(std::mt19937_64& rng, index_t grid, index_t window, index_t shift, std::int64_t batch,
                                   greenmim::strategy strat = greenmim::strategy::fast, index_t fixed_g = 0,
                                   index_t max_g = 0) {
  problem p;
  greenmim::mask_config cfg;  // 224 px, unit 32, ratio 0.75
  const std::vector<std::uint8_t> mask = greenmim::random_mask(cfg, rng(), 0);
  std::vector<index_t> coords;
  REQUIRE(greenmim::visible_coords(greenmim::span<const std::uint8_t>(mask), cfg.grid(), grid, coords) ==
          greenmim::status::success);
  p.geom = greenmim::make_window_geometry(grid, grid, window, shift);
  REQUIRE(greenmim::build_windows(p.geom, greenmim::span<const index_t>(coords), p.windows) == greenmim::status::success);
  const std::vector<index_t> sizes = p.windows.sizes();
  greenmim::planner_options opt;
  opt.strat = strat;
  opt.group_size = fixed_g;
  plan_within(sizes, opt, max_g, p.plan);
  REQUIRE(greenmim::build_partition(p.plan, p.windows, p.part) == greenmim::status::success);
  p.batch = batch;
  p.name = "shared grid " + std::to_string(grid) + " p" + std::to_string(p.geom.window) + " shift " +
           std::to_string(p.geom.shift) + " G " + std::to_string(p.part.group_size) + " groups " +
           std::to_string(p.part.num_groups);
  return p;
}

//! Per-sample keep sets (any pattern, ~`keep` of the grid) of `samples` samples, flattened token
//! axis, B = 1.
inline problem per_sample_problem(std::mt19937_64& rng, index_t grid, index_t window, index_t shift, index_t samples,
                                  double keep, greenmim::strategy strat = greenmim::strategy::fast,
                                  index_t max_g = 0) {
  problem p;
  std::vector<std::uint8_t> m(static_cast<std::size_t>(samples) * grid * grid);
  std::bernoulli_distribution bern(keep);
  for (auto& x : m) x = bern(rng) ? 1 : 0;
  m[0] = 1;  // at least one token
  std::vector<index_t> cu, coords;
  REQUIRE(greenmim::keep_mask_coords(greenmim::span<const std::uint8_t>(m), samples, grid, grid, cu, coords) ==
          greenmim::status::success);
  p.geom = greenmim::make_window_geometry(grid, grid, window, shift);
  REQUIRE(greenmim::build_windows_per_sample(p.geom, greenmim::span<const index_t>(cu), greenmim::span<const index_t>(coords),
                                             p.windows) == greenmim::status::success);
  const std::vector<index_t> sizes = p.windows.sizes();
  greenmim::planner_options opt;
  opt.strat = strat;
  plan_within(sizes, opt, max_g, p.plan);
  REQUIRE(greenmim::build_partition(p.plan, p.windows, p.part) == greenmim::status::success);
  p.batch = 1;
  p.name = "per-sample x" + std::to_string(samples) + " grid " + std::to_string(grid) + " p" +
           std::to_string(p.geom.window) + " G " + std::to_string(p.part.group_size) + " groups " +
           std::to_string(p.part.num_groups);
  return p;
}

//! The released 'masking' mode: one group over all tokens in their original order (windows
//! interleaved inside the group, not contiguous).
inline problem single_group_problem(std::mt19937_64& rng, index_t grid, index_t window, index_t shift,
                                    std::int64_t batch) {
  problem p = shared_mask_problem(rng, grid, window, shift, batch);
  REQUIRE(greenmim::build_single_group(p.windows, p.part) == greenmim::status::success);
  p.name = "single group (masking mode) grid " + std::to_string(grid) + " G " + std::to_string(p.part.group_size);
  return p;
}

//! Device copy of partition indices.
struct device_partition {
  dbuf<index_t> gather, scatter, slot_window, slot_coord;
  greenmim::partition_view view{};
  explicit device_partition(const greenmim::partition_indices& h)
      : gather(to_device(h.gather)), scatter(to_device(h.scatter)), slot_window(to_device(h.slot_window)),
        slot_coord(to_device(h.slot_coord)) {
    view = greenmim::partition_view{gather.p, scatter.p, slot_window.p, slot_coord.p, h.group_size, h.num_groups,
                                    h.num_tokens};
  }
  gm_partition c() const { return greenmim::kernels::to_partition(view); }
};

}  // namespace gm_test
