//! \file models.hpp
//! Built-in model shapes (Swin-B, Swin-L; REFERENCE-NOTES; Twins-B, Twins-L) for simulations and
//! benchmarks.
#pragma once

#include <cstring>

#include "config.hpp"
#include "geometry.hpp"

namespace greenmim {

struct model_shape {
  const char* name;
  index_t channels[4];
  index_t heads[4];
  index_t depths[4];
  index_t head_dim;
  index_t image_size;
  index_t patch_size;
  index_t window;

  //! Token grid side of stage `s` (0-based): image / (patch * 2^s).
  constexpr index_t grid(int s) const { return image_size / (patch_size << s); }
  //! Window geometry of stage `s`, shifted or not (shift = p/2), with Swin's small-stage rule.
  constexpr window_geometry geometry(int s, bool shifted) const {
    return make_window_geometry(grid(s), grid(s), window, shifted ? window / 2 : 0);
  }
};

inline constexpr model_shape builtin_models[] = {
    {"swin-b", {128, 256, 512, 1024}, {4, 8, 16, 32}, {2, 2, 18, 2}, 32, 224, 4, 7},
    {"swin-l", {192, 384, 768, 1536}, {6, 12, 24, 48}, {2, 2, 18, 2}, 32, 224, 4, 7},
    {"swin-b-w14", {128, 256, 512, 1024}, {4, 8, 16, 32}, {2, 2, 18, 2}, 32, 224, 4, 14},
    {"swin-l-w14", {192, 384, 768, 1536}, {6, 12, 24, 48}, {2, 2, 18, 2}, 32, 224, 4, 14},
};

//! Looks a model up by name; null when unknown.
inline const model_shape* find_model(const char* name) {
  for (const auto& m : builtin_models)
    if (std::strcmp(m.name, name) == 0) return &m;
  return nullptr;
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
