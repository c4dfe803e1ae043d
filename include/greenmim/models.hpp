//! \file models.hpp
//! Model shapes: built-in Swin presets (Swin-B/L at 224 px, window 7 or 14; SimMIM's 192 px,
//! window 6; timm's Swin V2 shapes), user-built geometries validated in one place
//! (`validate_model_shape`, `make_model_shape`), and Twins-B/L for the sparse-conv simulations.
//! What the CUDA kernels accept of a shape is theirs to say: <greenmim/kernel_limits.hpp>.
//! The presets are the CLI's copy of the PyTorch package's (python/greenmim/swin.py, swinv2.py,
//! twins.py, mim.py): python/tests/test_surface.py checks that the two agree, so change both.
#pragma once

#include <cstring>
#include <string>

#include "config.hpp"
#include "geometry.hpp"
#include "random_masks.hpp"
#include "status.hpp"

namespace greenmim {

//! A hierarchical (Swin-style, four stages, 2x2 patch merging between them) encoder's shape and
//! input geometry. Plain data: copy a preset (`find_model`) and change it, or fill one in, then
//! `validate_model_shape` it (or use `make_model_shape`). `mask_unit` 0 means the encoder's
//! largest stride, patch * 8 (32 px at patch 4), as GreenMIM and SimMIM mask.
struct model_shape {
  const char* name;
  index_t channels[4];
  index_t heads[4];
  index_t depths[4];
  index_t head_dim;
  index_t image_size;
  index_t patch_size;
  index_t window;
  index_t mask_unit = 0;

  //! Token grid side of stage `s` (0-based): image / (patch * 2^s).
  constexpr index_t grid(int s) const { return image_size / (patch_size << s); }
  //! Mask unit side in pixels (`mask_unit`, or patch * 8 when it is 0).
  constexpr index_t unit_size() const { return mask_unit > 0 ? mask_unit : patch_size * 8; }
  //! Window geometry of stage `s`, shifted or not (shift = p/2), with Swin's small-stage rule
  //! (timm's: a grid no larger than the window is one window of the grid's size, not shifted).
  constexpr window_geometry geometry(int s, bool shifted) const {
    return make_window_geometry(grid(s), grid(s), window, shifted ? window / 2 : 0);
  }
  //! True when stage `s` runs a smaller window than `window` (its grid is smaller).
  constexpr bool window_shrunk(int s) const { return grid(s) < window; }
  //! True when stage `s` is one window, so its "shifted" block is not shifted (grid <= window).
  constexpr bool shift_dropped(int s) const { return grid(s) <= window; }
};

inline constexpr model_shape builtin_models[] = {
    {"swin-b", {128, 256, 512, 1024}, {4, 8, 16, 32}, {2, 2, 18, 2}, 32, 224, 4, 7},
    {"swin-l", {192, 384, 768, 1536}, {6, 12, 24, 48}, {2, 2, 18, 2}, 32, 224, 4, 7},
    {"swin-b-w14", {128, 256, 512, 1024}, {4, 8, 16, 32}, {2, 2, 18, 2}, 32, 224, 4, 14},
    {"swin-l-w14", {192, 384, 768, 1536}, {6, 12, 24, 48}, {2, 2, 18, 2}, 32, 224, 4, 14},
    // SimMIM's pre-training recipe (simmim_pretrain__swin_base__img192_window6): 192 px, window 6;
    // 32 px mask units cover 8 x 8 stage-1 tokens, windows 6 x 6: they do not line up.
    {"swin-b-192w6", {128, 256, 512, 1024}, {4, 8, 16, 32}, {2, 2, 18, 2}, 32, 192, 4, 6},
    {"swin-l-192w6", {192, 384, 768, 1536}, {6, 12, 24, 48}, {2, 2, 18, 2}, 32, 192, 4, 6},
    // Swin V2 (timm's names; SwinV2-H/G were pre-trained with SimMIM). Same shapes and costs as
    // V1 on the kernels: cosine attention is q and k L2-normalised with the logit scale folded
    // into q (docs/models.md).
    {"swinv2_base_window8_256", {128, 256, 512, 1024}, {4, 8, 16, 32}, {2, 2, 18, 2}, 32, 256, 4, 8},
    {"swinv2_base_window16_256", {128, 256, 512, 1024}, {4, 8, 16, 32}, {2, 2, 18, 2}, 32, 256, 4, 16},
    {"swinv2_large_window12_192", {192, 384, 768, 1536}, {6, 12, 24, 48}, {2, 2, 18, 2}, 32, 192, 4, 12},
};

//! Looks a model up by name; null when unknown.
inline const model_shape* find_model(const char* name) {
  for (const auto& m : builtin_models)
    if (std::strcmp(m.name, name) == 0) return &m;
  return nullptr;
}

//! Checks that `m` can be planned as it is: positive sides, channels = heads * head_dim; the
//! image a multiple of patch * 2^3 (three patch mergings); the mask unit a multiple of the
//! largest patch stride patch * 8 (so a unit covers whole 2 x 2 merging blocks at every stage) and
//! dividing the image; every stage grid larger than the window a multiple of it (Swin pads such a
//! grid with tokens greenmim does not plan). A grid no larger than the window is fine: Swin (and
//! `geometry`) then runs one window of the grid's size, not shifted. Returns `invalid_argument`
//! (or `overflow` for sides beyond 32767 tokens or 32768 px) and, when `why` is given, one line
//! saying what is wrong; `success` leaves `why` untouched. O(1).
inline status validate_model_shape(const model_shape& m, std::string* why = nullptr) {
  auto fail = [why](status s, const std::string& text) {
    if (why) *why = text;
    return s;
  };
  const std::string img = std::to_string(m.image_size) + " px";
  if (m.image_size <= 0) return fail(status::invalid_argument, "image size must be positive");
  if (m.patch_size <= 0) return fail(status::invalid_argument, "patch size must be positive");
  if (m.window <= 0) return fail(status::invalid_argument, "window must be positive");
  if (m.mask_unit < 0) return fail(status::invalid_argument, "mask unit must be positive");
  if (m.image_size > 32768 || m.patch_size > 4096 || m.mask_unit > 32768)
    return fail(status::overflow, "image, patch or mask unit above 32768 px");
  if (m.window > 32767) return fail(status::overflow, "window above 32767 tokens");
  const index_t stride = m.patch_size * 8, unit = m.unit_size();
  if (m.image_size % stride != 0)
    return fail(status::invalid_argument, "image " + img + " is not a multiple of patch x 2^3 = " +
                                              std::to_string(stride) + " px (patch " + std::to_string(m.patch_size) +
                                              ", three patch mergings)");
  if (unit % stride != 0)
    return fail(status::invalid_argument,
                "mask unit " + std::to_string(unit) + " px is not a multiple of the largest patch stride, patch x 8 = " +
                    std::to_string(stride) + " px (patch merging needs whole 2x2 blocks visible or masked)");
  if (m.image_size % unit != 0)
    return fail(status::invalid_argument,
                "image " + img + " is not a multiple of the mask unit " + std::to_string(unit) + " px");
  for (int s = 0; s < 4; ++s) {
    if (m.channels[s] <= 0 || m.heads[s] <= 0 || m.depths[s] < 0 || m.head_dim <= 0)
      return fail(status::invalid_argument, "stage " + std::to_string(s + 1) + ": channels, heads and head_dim must be positive");
    if (static_cast<std::int64_t>(m.heads[s]) * m.head_dim != m.channels[s])
      return fail(status::invalid_argument, "stage " + std::to_string(s + 1) + ": channels " +
                                                std::to_string(m.channels[s]) + " != heads " + std::to_string(m.heads[s]) +
                                                " x head_dim " + std::to_string(m.head_dim));
    const index_t g = m.grid(s);
    if (g > 32767) return fail(status::overflow, "stage grid above 32767 tokens per side");
    if (g > m.window && g % m.window != 0)
      return fail(status::invalid_argument,
                  "stage " + std::to_string(s + 1) + " grid " + std::to_string(g) + " is not a multiple of window " +
                      std::to_string(m.window) + " (Swin would pad it with tokens that are not planned)");
  }
  return status::success;
}

//! Input geometry asked for on top of a model's architecture; 0 keeps the architecture's value
//! (mask unit 0: patch * 8).
struct model_geometry {
  index_t image_size = 0;
  index_t patch_size = 0;
  index_t window = 0;
  index_t mask_unit = 0;
};

//! `arch` (channels, heads, depths, head_dim, name) at geometry `g`, validated by
//! `validate_model_shape`: on success writes `out`; on failure leaves `out` untouched and, when
//! `why` is given, says why in one line. The name pointer is `arch`'s. O(1).
inline status make_model_shape(const model_shape& arch, const model_geometry& g, model_shape& out,
                               std::string* why = nullptr) {
  model_shape m = arch;
  if (g.image_size) m.image_size = g.image_size;
  if (g.patch_size) m.patch_size = g.patch_size;
  if (g.window) m.window = g.window;
  if (g.mask_unit) m.mask_unit = g.mask_unit;
  if (g.image_size < 0 || g.patch_size < 0 || g.window < 0 || g.mask_unit < 0) {
    if (why) *why = "image, patch, window and mask unit must be positive";
    return status::invalid_argument;
  }
  if (status s = validate_model_shape(m, why); s != status::success) return s;
  out = m;
  return status::success;
}

//! The masking set-up of `m` (a validated shape): its image size and mask unit, ratio `ratio`.
inline mask_config make_mask_config(const model_shape& m, double ratio = 0.75) {
  mask_config cfg;
  cfg.image_size = m.image_size;
  cfg.mask_unit = m.unit_size();
  cfg.ratio = ratio;
  return cfg;
}

//! Twins-SVT (alt_gvt) shapes: each stage alternates LSA (locally-grouped attention in
//! non-shifted p x p windows) and GSA (global attention against keys/values sub-sampled by a
//! kernel = stride = sr conv + LayerNorm; sr = 1 is plain global attention), a PEG (depthwise 3x3
//! conv, stride 1, padding 1, bias, + x) after the first block of each stage, and a patch
//! embedding conv (kernel = stride = patch size at stage 1, 2 afterwards) before each stage.
struct twins_shape {
  const char* name;
  index_t channels[4];
  index_t heads[4];
  index_t depths[4];
  index_t sr_ratios[4];  //!< GSA sub-sampling per stage
  index_t mlp_ratio;
  index_t image_size;
  index_t patch_size;
  index_t window;

  //! Token grid side of stage `s` (0-based): image / (patch * 2^s).
  constexpr index_t grid(int s) const { return image_size / (patch_size << s); }
  //! LSA window geometry of stage `s` (never shifted), with the small-stage rule.
  constexpr window_geometry geometry(int s) const { return make_window_geometry(grid(s), grid(s), window, 0); }
};

inline constexpr twins_shape builtin_twins_models[] = {
    {"twins-b", {96, 192, 384, 768}, {3, 6, 12, 24}, {2, 2, 18, 2}, {8, 4, 2, 1}, 4, 224, 4, 7},
    {"twins-l", {128, 256, 512, 1024}, {4, 8, 16, 32}, {2, 2, 18, 2}, {8, 4, 2, 1}, 4, 224, 4, 7},
};

//! Looks a Twins model up by name (twins-b = alt_gvt_base, twins-l = alt_gvt_large); null when
//! unknown.
inline const twins_shape* find_twins_model(const char* name) {
  for (const auto& m : builtin_twins_models)
    if (std::strcmp(m.name, name) == 0) return &m;
  return nullptr;
}

}  // namespace greenmim
