// Model shapes (models.hpp): the presets, make_model_shape's validation (one place, used by the
// CLI), Swin's small-stage rule, the CUDA kernels' limits, and planning, partition and merging on
// the geometries where windows and mask units do not line up (SimMIM's 192 px / window 6, Swin
// V2's 256 px / window 8 and 16).
#include <doctest/doctest.h>

#include <greenmim/greenmim.hpp>
#include <greenmim/kernel_limits.hpp>

#include <cstdio>
#include <set>
#include <string>
#include <vector>

using namespace greenmim;

namespace {

const model_shape& preset(const char* name) {
  const model_shape* m = find_model(name);
  REQUIRE(m != nullptr);
  return *m;
}

//! make_model_shape on `arch` at `g` must fail with `want`, a one-line reason holding `needle`,
//! and leave `out` untouched.
void check_refused(const model_shape& arch, model_geometry g, status want, const std::string& needle) {
  model_shape out = preset("swin-l");
  std::string why;
  CHECK(make_model_shape(arch, g, out, &why) == want);
  INFO(why);
  CHECK(why.find(needle) != std::string::npos);
  CHECK(why.find('\n') == std::string::npos);
  CHECK(std::string(out.name) == "swin-l");  // untouched
  CHECK(out.image_size == 224);
}

}  // namespace

TEST_CASE("presets: SimMIM's and timm's Swin V2 shapes, every one valid") {
  for (const auto& m : builtin_models) {
    std::string why;
    INFO(m.name);
    CHECK(validate_model_shape(m, &why) == status::success);
    CHECK(why.empty());
    CHECK(m.unit_size() == 32);
  }
  const model_shape& b6 = preset("swin-b-192w6");
  CHECK(b6.image_size == 192);
  CHECK(b6.window == 6);
  CHECK(b6.grid(0) == 48);
  const model_shape& l6 = preset("swin-l-192w6");
  CHECK(l6.channels[0] == 192);
  CHECK(l6.window == 6);
  for (const char* name : {"swinv2_base_window8_256", "swinv2_base_window16_256"}) {
    const model_shape& v2 = preset(name);
    CHECK(v2.image_size == 256);
    CHECK(v2.channels[0] == 128);
    for (int s = 0; s < 4; ++s) CHECK(v2.heads[s] == 4 << s);
    CHECK(v2.depths[2] == 18);
    CHECK(v2.head_dim == 32);
  }
  CHECK(preset("swinv2_base_window8_256").window == 8);
  CHECK(preset("swinv2_base_window16_256").window == 16);
  const model_shape& v2l = preset("swinv2_large_window12_192");
  CHECK(v2l.image_size == 192);
  CHECK(v2l.window == 12);
  CHECK(v2l.channels[0] == 192);
  for (int s = 0; s < 4; ++s) CHECK(v2l.heads[s] == 6 << s);
  // the old presets are unchanged
  const model_shape& b = preset("swin-b");
  CHECK(b.image_size == 224);
  CHECK(b.window == 7);
  CHECK(b.grid(2) == 14);
  CHECK(find_model("swin-b-192") == nullptr);
}

TEST_CASE("make_model_shape: the geometry a user asks for, refused with one clear line") {
  const model_shape& b = preset("swin-b");
  model_shape m;
  REQUIRE(make_model_shape(b, model_geometry{192, 0, 6, 0}, m) == status::success);
  CHECK(m.image_size == 192);
  CHECK(m.window == 6);
  CHECK(m.patch_size == 4);
  CHECK(m.channels[3] == 1024);
  CHECK(m.unit_size() == 32);
  REQUIRE(make_model_shape(b, model_geometry{256, 0, 16, 64}, m) == status::success);
  CHECK(m.unit_size() == 64);
  REQUIRE(make_model_shape(b, model_geometry{224, 2, 7, 0}, m) == status::success);  // patch 2: unit 16
  CHECK(m.unit_size() == 16);
  CHECK(m.grid(0) == 112);

  check_refused(b, {200, 0, 0, 0}, status::invalid_argument, "image 200 px is not a multiple of patch x 2^3 = 32 px");
  check_refused(b, {224, 3, 0, 0}, status::invalid_argument, "patch x 2^3 = 24 px");
  check_refused(b, {0, 0, 0, 24}, status::invalid_argument, "mask unit 24 px is not a multiple of the largest patch stride");
  check_refused(b, {0, 0, 0, 16}, status::invalid_argument, "mask unit 16 px");
  check_refused(b, {224, 0, 0, 64}, status::invalid_argument, "image 224 px is not a multiple of the mask unit 64 px");
  check_refused(b, {0, 0, 5, 0}, status::invalid_argument, "stage 1 grid 56 is not a multiple of window 5");
  check_refused(b, {0, 0, 12, 0}, status::invalid_argument, "stage 1 grid 56 is not a multiple of window 12");
  check_refused(b, {-32, 0, 0, 0}, status::invalid_argument, "positive");
  check_refused(b, {65536, 0, 0, 0}, status::overflow, "32768");

  model_shape odd = b;
  odd.channels[1] = 250;
  std::string why;
  CHECK(validate_model_shape(odd, &why) == status::invalid_argument);
  CHECK(why.find("stage 2: channels 250 != heads 8 x head_dim 32") != std::string::npos);
  CHECK(validate_model_shape(odd) == status::invalid_argument);  // no reason asked for
}

TEST_CASE("small stages: window = grid, no shift (timm's rule), said by the shape") {
  const model_shape& v16 = preset("swinv2_base_window16_256");  // grids 64, 32, 16, 8
  CHECK_FALSE(v16.shift_dropped(1));
  CHECK(v16.shift_dropped(2));  // grid 16 = window 16: one window, the shifted block is not shifted
  CHECK_FALSE(v16.window_shrunk(2));
  CHECK(v16.window_shrunk(3));  // grid 8 < 16: one 8 x 8 window
  const window_geometry g2 = v16.geometry(2, true), g3 = v16.geometry(3, true), g1 = v16.geometry(1, true);
  CHECK(g2.window == 16);
  CHECK(g2.shift == 0);
  CHECK(g2.num_windows() == 1);
  CHECK(g3.window == 8);
  CHECK(g3.shift == 0);
  CHECK(g1.shift == 8);
  CHECK(g1.num_windows() == 9);  // non-cyclic shift: 32 = 8 + 16 + 8
  const model_shape& b6 = preset("swin-b-192w6");  // grids 48, 24, 12, 6
  CHECK(b6.geometry(3, true).shift == 0);
  CHECK(b6.geometry(2, true).shift == 3);
}

TEST_CASE("the CUDA kernels' limits: window <= 32, G <= 1024, head_dim 32 or 64") {
  CHECK(cuda_attention_refusal(7, 49, 32).empty());
  CHECK(cuda_attention_refusal(16, 256, 32).empty());  // V2's 256 px / window 16 runs
  CHECK(cuda_attention_refusal(32, 1024, 64).empty());
  CHECK(cuda_attention_refusal(33, 64, 32) == "window 33 > GM_MAX_WINDOW 32");
  CHECK(cuda_attention_refusal(8, 1025, 32) == "group size 1025 > GM_SIMT_MAX_GROUP 1024");
  CHECK(cuda_attention_refusal(48, 2304, 48) ==
        "window 48 > GM_MAX_WINDOW 32; group size 2304 > GM_SIMT_MAX_GROUP 1024; head_dim 48 is not 32 or 64");
}

namespace {

//! Every stage and both blocks of `m` over `masks` random masks: the windows cover the visible
//! tokens; the plan is valid and no better than its bound; the partition round-trips bit-exactly;
//! patch merging takes stage s's visible tokens to stage s+1's, 2x2 block by 2x2 block.
void check_geometry(const model_shape& m, int masks, double ratio = 0.75) {
  INFO(m.name << " image " << m.image_size << " window " << m.window << " unit " << m.unit_size());
  REQUIRE(validate_model_shape(m) == status::success);
  const mask_config cfg = make_mask_config(m, ratio);
  planner<flops_cost> pl;
  for (int k = 0; k < masks; ++k) {
    const auto units = random_mask(cfg, 11, static_cast<std::uint64_t>(k));
    std::vector<index_t> coords;
    REQUIRE(visible_coords(span<const std::uint8_t>(units), cfg.grid(), m.grid(0), coords) == status::success);
    for (int s = 0; s < 4; ++s) {
      const index_t grid = m.grid(s);
      const index_t per_unit = m.unit_size() / (m.patch_size << s);  // tokens per unit side
      CHECK(static_cast<std::int64_t>(coords.size()) ==
            static_cast<std::int64_t>(cfg.num_keep()) * per_unit * per_unit);
      for (int blk = 0; blk < 2; ++blk) {
        const window_geometry g = m.geometry(s, blk == 1);
        window_list wl;
        REQUIRE(build_windows(g, span<const index_t>(coords), wl) == status::success);
        const std::vector<index_t> sizes = wl.sizes();
        std::int64_t total = 0;
        for (std::size_t w = 0; w < sizes.size(); ++w) {
          total += sizes[w];
          CHECK(sizes[w] <= g.window * g.window);
        }
        CHECK(total == static_cast<std::int64_t>(coords.size()));
        pl = planner<flops_cost>(flops_cost{m.channels[s]});
        plan p;
        REQUIRE(pl.run(span<const index_t>(sizes), planner_options{}, p) == status::success);
        REQUIRE(validate_plan(span<const index_t>(sizes), p) == status::success);
        CHECK(p.cost >= p.lower_bound * (1 - 1e-12));
        partition_indices part;
        REQUIRE(build_partition(p, wl, part) == status::success);
        REQUIRE(validate_partition(part) == status::success);
        const index_t N = static_cast<index_t>(coords.size()), C = 3, S = part.num_slots();
        std::vector<float> x(static_cast<std::size_t>(N) * C), y(static_cast<std::size_t>(S) * C), back(x.size(), -1.f);
        for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) * 0.5f + 1.f;
        REQUIRE(partition_tokens<float>(part, make_view(static_cast<const float*>(x.data()), 1, N, C),
                                        make_view(y.data(), 1, S, C)) == status::success);
        // every real slot holds its token, and the token lies in the slot's window
        for (index_t slot = 0; slot < S; ++slot) {
          const index_t t = part.gather[static_cast<std::size_t>(slot)];
          if (t == pad_index) continue;
          CHECK(y[static_cast<std::size_t>(slot) * C] == x[static_cast<std::size_t>(t) * C]);
          const index_t c = coords[static_cast<std::size_t>(t)];
          CHECK(g.window_id(coord_h(c), coord_w(c)) == part.slot_window[static_cast<std::size_t>(slot)]);
        }
        REQUIRE(unpartition_tokens<float>(part, make_view(static_cast<const float*>(y.data()), 1, S, C),
                                          make_view(back.data(), 1, N, C)) == status::success);
        CHECK(back == x);
      }
      if (s == 3) break;
      std::vector<index_t> gather4, next, want;
      REQUIRE(merge_indices(grid, grid, span<const index_t>(coords), gather4, next) == status::success);
      REQUIRE(visible_coords(span<const std::uint8_t>(units), cfg.grid(), m.grid(s + 1), want) == status::success);
      CHECK(next == want);
      REQUIRE(gather4.size() == 4 * next.size());
      for (std::size_t j = 0; j < next.size(); ++j)
        for (index_t q = 0; q < 4; ++q) {
          const index_t c = coords[static_cast<std::size_t>(gather4[4 * j + q])];
          CHECK(coord_h(c) == 2 * coord_h(next[j]) + merge_dh(q));
          CHECK(coord_w(c) == 2 * coord_w(next[j]) + merge_dw(q));
        }
      coords = next;
    }
  }
}

}  // namespace

TEST_CASE("planning, partition and merging on 192/w6, 256/w8, 256/w16 and 192/w12") {
  check_geometry(preset("swin-b-192w6"), 6);
  check_geometry(preset("swin-l-192w6"), 2);
  check_geometry(preset("swinv2_base_window8_256"), 4);
  check_geometry(preset("swinv2_base_window16_256"), 4);
  check_geometry(preset("swinv2_large_window12_192"), 3);
  model_shape wide;  // a 64 px mask unit, a 12-token window at 384 px
  REQUIRE(make_model_shape(preset("swin-b"), model_geometry{384, 0, 12, 64}, wide) == status::success);
  check_geometry(wide, 2, 0.6);
}

TEST_CASE("192/w6: a 32 px unit covers 8x8 stage-1 tokens, a window 6x6; windows straddle units") {
  const model_shape& m = preset("swin-b-192w6");
  REQUIRE(m.unit_size() / m.patch_size == 8);
  const mask_config cfg = make_mask_config(m);
  std::set<index_t> seen;
  for (int k = 0; k < 8; ++k) {
    const auto units = random_mask(cfg, 5, static_cast<std::uint64_t>(k));
    std::vector<index_t> coords;
    REQUIRE(visible_coords(span<const std::uint8_t>(units), cfg.grid(), m.grid(0), coords) == status::success);
    for (index_t w : window_sizes(m.geometry(0, false), span<const index_t>(coords))) seen.insert(w);
    // merging works although windows do not line up with units: every 2x2 block is whole
    std::vector<index_t> gather4, next;
    CHECK(merge_indices(m.grid(0), m.grid(0), span<const index_t>(coords), gather4, next) == status::success);
    CHECK(next.size() * 4 == coords.size());
  }
  // window sizes that are no multiple of a unit's share: partial windows (6 x 2, 6 x 4, 2 x 2 ...)
  bool partial = false;
  for (index_t w : seen) partial = partial || (w > 0 && w < 36);
  CHECK(partial);
  CHECK(seen.count(12) == 1);  // a 6 x 2 strip of a unit inside a window
  // an unaligned mask unit (not a multiple of patch * 8) would leave 2x2 blocks half visible:
  // that is what validate_model_shape refuses and merge_indices would refuse with `misaligned`
  const std::vector<index_t> half = {pack_coord(0, 0), pack_coord(1, 0)};
  std::vector<index_t> g4, nx;
  CHECK(merge_indices(4, 4, span<const index_t>(half), g4, nx) == status::misaligned);
}

TEST_CASE("docs/models.md: a geometry of your own, validated, and the path that can run it") {
  // example-begin make_model_shape
  model_shape m;  // Swin-B's widths at 384 px, window 12, 32 px mask units
  std::string why;
  if (make_model_shape(*find_model("swin-b"), model_geometry{/*image*/ 384, /*patch*/ 0, /*window*/ 12,
                                                             /*mask unit*/ 0},
                       m, &why) != status::success) {
    std::fprintf(stderr, "%s\n", why.c_str());  // e.g. "image 200 px is not a multiple of ..."
    return;
  }
  const mask_config cfg = make_mask_config(m, /*ratio=*/0.75);
  const std::vector<std::uint8_t> units = random_mask(cfg, /*seed=*/0);
  for (int s = 0; s < 4; ++s) {
    const window_geometry g = m.geometry(s, /*shifted=*/true);  // stage 4: grid 12 = window: not shifted
    std::vector<index_t> coords;
    check(visible_coords(span<const std::uint8_t>(units), cfg.grid(), m.grid(s), coords));
    plan p;
    check(make_plan(span<const index_t>(window_sizes(g, span<const index_t>(coords))), planner_options{},
                    m.channels[s], p));
    const std::string refusal = cuda_attention_refusal(g.window, p.group_size, m.head_dim);
    std::printf("stage %d: %d windows of %d, G %d: %s\n", s + 1, g.num_windows(), g.window, p.group_size,
                refusal.empty() ? "CUDA kernels or CPU reference" : ("CPU reference only: " + refusal).c_str());
    CHECK(refusal.empty());                   // (test)
    CHECK(g.shift == (s < 3 ? 6 : 0));        // (test)
  }
  // example-end make_model_shape
}
