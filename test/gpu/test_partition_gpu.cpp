// GPU tests of partition/unpartition (gather/scatter) and of the device-side index building
// (CUB), against the host builders of include/greenmim/partition.hpp.
#include "gpu_test_util.hpp"

#include <cstdint>
#include <vector>

#include "../../kernels/detail/copy_grid.hpp"

namespace {

using namespace gm_test;
using greenmim::index_t;

//! The first `count` elements of a device buffer (those a kernel wrote; the rest may be unset).
template <class T>
std::vector<T> download_first(const dbuf<T>& d, index_t count) {
  REQUIRE(count >= 0);
  REQUIRE(static_cast<std::size_t>(count) <= d.n);
  std::vector<T> h(static_cast<std::size_t>(count));
  if (count > 0)
    REQUIRE(cudaMemcpy(h.data(), d.p, h.size() * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  return h;
}

void check_round_trip(const problem& prob, gm_dtype dt, std::int64_t C, std::int64_t lead, std::mt19937_64& rng) {
  const std::int64_t B = prob.batch, N = prob.part.num_tokens;
  const std::int64_t S = static_cast<std::int64_t>(prob.part.group_size) * prob.part.num_groups;
  INFO(prob.name << " dtype " << gm_dtype_name(dt) << " C " << C << " lead " << lead);
  const std::size_t es = gm_dtype_size(dt);
  // x: [B, N, C] contiguous after `lead` elements; y: [B, S, C] with one extra element per row
  htensor hx(dt, static_cast<std::size_t>(lead + B * N * C));
  std::normal_distribution<float> nd(0.f, 1.f);
  for (std::size_t i = 0; i < hx.size(); ++i) hx.set(i, nd(rng));
  dbuf<unsigned char> x = to_device(hx.bytes);
  const std::int64_t ys = C + 1;
  dbuf<unsigned char> y(static_cast<std::size_t>(B * S * ys) * es);
  y.fill_bytes(0xFF);
  device_partition dp(prob.part);
  gm_partition_args a{};
  a.dtype = dt;
  a.x = make_tensor(x.p + lead * static_cast<std::int64_t>(es), {B, N, C}, {N * C, C, 1});
  a.y = make_tensor(y.p, {B, S, C}, {S * ys, ys, 1});
  a.part = dp.c();
  GM_CHECK_CUDA(gm_partition_can_implement(&a));
  GM_CHECK_CUDA(gm_partition_tokens(&a, nullptr));
  GM_CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<unsigned char> yb = y.download();
  // every row of y: the gathered token row, or zeros for padding; the extra element untouched
  std::int64_t wrong = 0, pad_nonzero = 0, margin = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t s = 0; s < S; ++s) {
      const index_t t = prob.part.gather[static_cast<std::size_t>(s)];
      const unsigned char* row = yb.data() + static_cast<std::size_t>((b * S + s) * ys) * es;
      if (t < 0) {
        for (std::size_t k = 0; k < static_cast<std::size_t>(C) * es; ++k) pad_nonzero += row[k] != 0;
      } else {
        const unsigned char* src = hx.bytes.data() + static_cast<std::size_t>(lead + (b * N + t) * C) * es;
        wrong += std::memcmp(row, src, static_cast<std::size_t>(C) * es) != 0;
      }
      for (std::size_t k = 0; k < es; ++k) margin += row[static_cast<std::size_t>(C) * es + k] != 0xFF;
    }
  CHECK(wrong == 0);
  CHECK(pad_nonzero == 0);
  CHECK(margin == 0);
  // unpartition back into a poisoned x2: bit-exact round trip
  dbuf<unsigned char> x2(static_cast<std::size_t>(B * N * C) * es);
  x2.fill_bytes(0xFF);
  a.x = make_tensor(x2.p, {B, N, C}, {N * C, C, 1});
  GM_CHECK_CUDA(gm_unpartition_tokens(&a, nullptr));
  GM_CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<unsigned char> xb = x2.download();
  CHECK(std::memcmp(xb.data(), hx.bytes.data() + lead * static_cast<std::int64_t>(es), xb.size()) == 0);
}

}  // namespace

TEST_CASE("gpu partition/unpartition: vectorized and tail paths, padding zeroed, bit-exact round trip") {
  GM_SKIP_WITHOUT_DEVICE();
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const problem shared = shared_mask_problem(rng, 56, 7, 3, 3);
  const problem per_sample = per_sample_problem(rng, 28, 7, 0, 4, 0.3);
  for (gm_dtype dt : {GM_FLOAT32, GM_FLOAT16, GM_BFLOAT16})
    for (std::int64_t C : {128, 100, 37, 1, 1024}) {
      check_round_trip(shared, dt, C, 0, rng);
      check_round_trip(per_sample, dt, C, 0, rng);
    }
  check_round_trip(shared, GM_BFLOAT16, 128, 3, rng);  // misaligned base: narrow path
}

TEST_CASE("partition launch shape (host): rows and chunks covered, one wave when it fits, balanced passes") {
  using greenmim::detail::cuda::copy_grid;
  using greenmim::detail::cuda::plan_copy_grid;
  constexpr int threads = greenmim::detail::cuda::k_copy_threads;
  constexpr int vectors = greenmim::detail::cuda::k_copy_vectors;
  constexpr int resident = greenmim::detail::cuda::k_resident_ctas;
  int n = 0;
  for (std::int64_t rows : {1, 7, 12, 48, 192, 784, 5000, 100000})
    for (std::int64_t chunks : {1, 2, 3, 16, 25, 32, 37, 64, 100, 128, 256, 1000})
      for (std::int64_t batch : {1, 2, 3, 8, 11, 81, 128, 1000, 1000000})
        for (int sms : {1, 2, 108, 132}) {
          const copy_grid g = plan_copy_grid(rows, chunks, batch, sms);
          INFO("rows " << rows << " chunks " << chunks << " batch " << batch << " sms " << sms);
          const std::int64_t tpr = std::int64_t{1} << g.tpr_log2;
          REQUIRE(g.tpr_log2 >= 0);
          REQUIRE(g.tpr_log2 <= 5);
          CHECK((tpr >= chunks || tpr == 32));          // a team covers the row, or is a full warp
          CHECK((tpr == 1 || tpr / 2 < chunks));        // and is no wider than needed
          const std::int64_t per_lane = (chunks + tpr - 1) / tpr;
          CHECK((g.k == 1 || g.k == 2 || g.k == 4 || g.k == 8));
          CHECK((g.k >= per_lane || g.k == vectors));
          CHECK((g.k == 1 || g.k / 2 < per_lane));
          CHECK(g.spt >= 1);
          CHECK(g.spt * g.k <= vectors);
          CHECK(g.gx * threads >= rows * tpr);         // every row has a team
          CHECK((g.gx - 1) * threads < rows * tpr);
          CHECK(g.gy >= 1);
          CHECK(g.gy <= 65535);
          CHECK(g.gy <= (batch + g.spt - 1) / g.spt);  // no CTA row without samples
          const std::int64_t wave = std::int64_t{sms} * resident;
          if (g.gx <= wave) CHECK(g.gx * g.gy <= wave);  // never a partial second wave
          if (g.gx * ((batch + vectors / g.k - 1) / (vectors / g.k)) <= wave) {
            CHECK(g.gx * ((batch + g.spt - 1) / g.spt) <= wave);  // the whole batch in one wave
            if (g.spt > 1) CHECK(g.gx * ((batch + g.spt - 2) / (g.spt - 1)) > wave);  // with the fewest samples per thread
          }
          ++n;
        }
  CHECK(n > 0);
  // the Swin-B stage shapes on an H100 (132 SMs), batch 128, bf16, 16-byte chunks
  const copy_grid s1 = plan_copy_grid(784, 16, 128, 132), s3 = plan_copy_grid(48, 64, 128, 132);
  CHECK(s1.k == 1);
  CHECK(s1.spt == 8);  // 2 passes of 8 samples, 49 x 8 CTAs
  CHECK(s1.gy == 8);
  CHECK(s3.k == 2);
  CHECK(s3.spt == 2);  // the whole stage-3 copy in flight at once: 6 x 64 CTAs
  CHECK(s3.gy == 64);
}

TEST_CASE("gpu partition/unpartition: every launch shape (samples per thread, passes, chunks per lane, tiny row counts)") {
  GM_SKIP_WITHOUT_DEVICE();
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  // Batches chosen for a 132-SM device (H100, and the emulator): see plan_copy_grid. On other
  // devices the shapes differ, the results must not.
  problem s1 = shared_mask_problem(rng, 56, 7, 3, 1);  // ~784 rows
  problem s3 = shared_mask_problem(rng, 14, 7, 0, 1);  // ~48 rows
  problem tiny = shared_mask_problem(rng, 7, 7, 0, 1);  // one window: ~12 rows
  const problem flat = per_sample_problem(rng, 56, 7, 0, 8, 0.3);  // B = 1, thousands of rows
  auto with_batch = [](problem p, std::int64_t b) {
    p.batch = b;
    return p;
  };
  check_round_trip(with_batch(s1, 11), GM_BFLOAT16, 128, 0, rng);   // 2 samples per thread, one wave
  check_round_trip(with_batch(s1, 83), GM_BFLOAT16, 128, 0, rng);   // 8 per pass, 2 passes, partial last pass
  check_round_trip(with_batch(s3, 96), GM_BFLOAT16, 512, 0, rng);   // 2 chunks per lane, 2 samples
  check_round_trip(with_batch(s3, 5), GM_BFLOAT16, 1000, 0, rng);   // 4 chunks per lane (125 chunks)
  check_round_trip(with_batch(s3, 3), GM_FLOAT32, 1024, 0, rng);    // 8 chunks per lane, 1 sample
  check_round_trip(with_batch(s3, 2), GM_FLOAT32, 1100, 0, rng);    // 275 chunks: two chunk passes per lane
  check_round_trip(with_batch(s3, 40), GM_BFLOAT16, 37, 0, rng);    // odd C: 2-byte chunks, 2 per lane
  check_round_trip(with_batch(s1, 20), GM_FLOAT16, 100, 0, rng);    // 8-byte chunks, 25 per row
  check_round_trip(with_batch(s1, 20), GM_BFLOAT16, 128, 1, rng);   // misaligned base, many samples
  check_round_trip(with_batch(tiny, 1), GM_BFLOAT16, 128, 0, rng);  // tiny row count
  check_round_trip(with_batch(tiny, 700), GM_BFLOAT16, 8, 0, rng);  // one chunk per row, 700 samples
  check_round_trip(flat, GM_BFLOAT16, 256, 0, rng);                 // B = 1, more row tiles than a wave
}

namespace {

//! Device pipeline: mask -> select -> token windows -> (host plan) -> build; compared with the host.
void check_index_building(const std::vector<std::uint8_t>& mask, index_t num_masks, index_t grid, index_t window,
                          index_t shift, greenmim::strategy strat) {
  const greenmim::window_geometry g = greenmim::make_window_geometry(grid, grid, window, shift);
  INFO("masks " << num_masks << " grid " << grid << " p " << g.window << " shift " << g.shift);
  // host
  std::vector<index_t> cu, coords;
  REQUIRE(greenmim::keep_mask_coords(greenmim::span<const std::uint8_t>(mask), num_masks, grid, grid, cu, coords) ==
          greenmim::status::success);
  greenmim::window_list wl;
  REQUIRE(greenmim::build_windows_per_sample(g, greenmim::span<const index_t>(cu), greenmim::span<const index_t>(coords),
                                             wl) == greenmim::status::success);
  if (num_masks == 1) {  // the shared-mask builder gives the same list
    greenmim::window_list w1;
    REQUIRE(greenmim::build_windows(g, greenmim::span<const index_t>(coords), w1) == greenmim::status::success);
    CHECK(w1.tokens == wl.tokens);
    CHECK(w1.offsets == wl.offsets);
  }
  const std::vector<index_t> sizes = wl.sizes();
  greenmim::plan plan;
  greenmim::planner_options opt;
  opt.strat = strat;
  REQUIRE(greenmim::make_plan(greenmim::span<const index_t>(sizes), opt, 128, plan) == greenmim::status::success);
  greenmim::partition_indices host;
  REQUIRE(greenmim::build_partition(plan, wl, host) == greenmim::status::success);

  // device: select
  const index_t cap = static_cast<index_t>(mask.size());
  dbuf<std::uint8_t> dmask = to_device(mask);
  dbuf<index_t> positions(static_cast<std::size_t>(cap)), count(1);
  std::size_t tmp_bytes = 0;
  GM_CHECK_CUDA(gm_select_visible(nullptr, &tmp_bytes, dmask.p, num_masks, grid, grid, positions.p, count.p, nullptr));
  dbuf<unsigned char> tmp(tmp_bytes + 256);
  GM_CHECK_CUDA(gm_select_visible(tmp.p, &tmp_bytes, dmask.p, num_masks, grid, grid, positions.p, count.p, nullptr));
  // token windows and sizes
  const index_t nw = num_masks * g.num_windows();
  dbuf<index_t> dcoords(static_cast<std::size_t>(cap)), dwin(static_cast<std::size_t>(cap)), dsizes(static_cast<std::size_t>(nw));
  dsizes.fill_bytes(0x7F);  // must be zeroed by the call
  GM_CHECK_CUDA(gm_token_windows(positions.p, count.p, cap, num_masks, greenmim::kernels::to_geometry(g), dcoords.p,
                                 dwin.p, dsizes.p, nullptr));
  GM_CHECK_CUDA(cudaDeviceSynchronize());
  const index_t n = count.download()[0];
  REQUIRE(n == static_cast<index_t>(coords.size()));
  REQUIRE(n <= cap);
  // dcoords and dwin have room for `cap` tokens but only the first n are written: download those
  // (the whole buffer would read unwritten memory, which compute-sanitizer initcheck reports)
  std::vector<index_t> got_coords = download_first(dcoords, n);
  CHECK(got_coords == coords);
  CHECK(dsizes.download() == sizes);
  // plan table, then build
  std::vector<index_t> wgroup, woff;
  REQUIRE(greenmim::kernels::window_slot_table(plan, greenmim::span<const index_t>(sizes), wgroup, woff) ==
          greenmim::status::success);
  dbuf<index_t> dgroup = to_device(wgroup), doff = to_device(woff);
  const std::size_t slots = static_cast<std::size_t>(host.num_slots());
  dbuf<index_t> gather(slots), scatter(static_cast<std::size_t>(n)), slot_window(slots), slot_coord(slots);
  gather.fill_bytes(0x55);
  scatter.fill_bytes(0x55);
  slot_window.fill_bytes(0x55);
  slot_coord.fill_bytes(0x55);
  std::size_t build_bytes = 0;
  GM_CHECK_CUDA(gm_build_partition(nullptr, &build_bytes, dcoords.p, dwin.p, n, dsizes.p, nw, dgroup.p, doff.p,
                                   host.group_size, host.num_groups, gather.p, scatter.p, slot_window.p, slot_coord.p,
                                   nullptr));
  dbuf<unsigned char> btmp(build_bytes);
  btmp.fill_bytes(0xFF);
  GM_CHECK_CUDA(gm_build_partition(btmp.p, &build_bytes, dcoords.p, dwin.p, n, dsizes.p, nw, dgroup.p, doff.p,
                                   host.group_size, host.num_groups, gather.p, scatter.p, slot_window.p, slot_coord.p,
                                   nullptr));
  GM_CHECK_CUDA(cudaDeviceSynchronize());
  CHECK(gather.download() == host.gather);
  CHECK(scatter.download() == host.scatter);
  CHECK(slot_window.download() == host.slot_window);
  CHECK(slot_coord.download() == host.slot_coord);

  // Tokens in no window (id -1, e.g. from a position outside the grid) interleaved with the real
  // ones: they must be left out (scatter = pad) without moving any real token.
  if (n == 0) return;
  std::vector<index_t> win = download_first(dwin, n), crd = got_coords;
  std::vector<index_t> win2, crd2, new_of_old(static_cast<std::size_t>(n));
  for (index_t t = 0; t < n; ++t) {
    if (t % 3 == 0) {  // an outsider before every third real token
      win2.push_back(-1);
      crd2.push_back(0);
    }
    new_of_old[static_cast<std::size_t>(t)] = static_cast<index_t>(win2.size());
    win2.push_back(win[static_cast<std::size_t>(t)]);
    crd2.push_back(crd[static_cast<std::size_t>(t)]);
  }
  const index_t n2 = static_cast<index_t>(win2.size());
  std::vector<index_t> want_gather = host.gather, want_scatter(static_cast<std::size_t>(n2), greenmim::pad_index);
  for (index_t& t : want_gather)
    if (t >= 0) t = new_of_old[static_cast<std::size_t>(t)];
  for (index_t t = 0; t < n; ++t) want_scatter[new_of_old[static_cast<std::size_t>(t)]] = host.scatter[static_cast<std::size_t>(t)];
  dbuf<index_t> dwin2 = to_device(win2), dcrd2 = to_device(crd2), scatter2(static_cast<std::size_t>(n2));
  scatter2.fill_bytes(0x55);
  gather.fill_bytes(0x55);
  std::size_t bytes2 = 0;
  GM_CHECK_CUDA(gm_build_partition(nullptr, &bytes2, dcrd2.p, dwin2.p, n2, dsizes.p, nw, dgroup.p, doff.p,
                                   host.group_size, host.num_groups, gather.p, scatter2.p, slot_window.p, slot_coord.p,
                                   nullptr));
  dbuf<unsigned char> btmp2(bytes2);
  GM_CHECK_CUDA(gm_build_partition(btmp2.p, &bytes2, dcrd2.p, dwin2.p, n2, dsizes.p, nw, dgroup.p, doff.p,
                                   host.group_size, host.num_groups, gather.p, scatter2.p, slot_window.p, slot_coord.p,
                                   nullptr));
  GM_CHECK_CUDA(cudaDeviceSynchronize());
  CHECK(gather.download() == want_gather);
  CHECK(scatter2.download() == want_scatter);
  CHECK(slot_window.download() == host.slot_window);
}

}  // namespace

TEST_CASE("gpu index building equals the host builders (shared and per-sample masks)") {
  GM_SKIP_WITHOUT_DEVICE();
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  // shared mask of the paper: a 7x7 unit mask expanded to the token grid of each stage
  greenmim::mask_config cfg;
  const std::vector<std::uint8_t> units = greenmim::random_mask(cfg, rng(), 0);
  for (index_t grid : {56, 28, 14, 7}) {
    const index_t u = grid / cfg.grid();
    std::vector<std::uint8_t> m(static_cast<std::size_t>(grid) * grid);
    for (index_t h = 0; h < grid; ++h)
      for (index_t w = 0; w < grid; ++w) m[static_cast<std::size_t>(h) * grid + w] = units[(h / u) * cfg.grid() + w / u];
    for (index_t shift : {0, 3}) check_index_building(m, 1, grid, 7, shift, greenmim::strategy::fast);
  }
  // per-sample arbitrary keep sets
  for (index_t samples : {1, 3, 8}) {
    std::vector<std::uint8_t> m(static_cast<std::size_t>(samples) * 28 * 28);
    std::bernoulli_distribution bern(0.35);
    for (auto& x : m) x = bern(rng) ? 1 : 0;
    m[0] = 1;
    check_index_building(m, samples, 28, 7, 3, greenmim::strategy::fast);
    check_index_building(m, samples, 28, 14, 7, greenmim::strategy::per_window);
  }
}
