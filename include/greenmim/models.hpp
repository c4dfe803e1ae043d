//! \file models.hpp
//! Built-in model shapes (Swin-B, Swin-L; REFERENCE-NOTES) for simulations and benchmarks.
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

}  // namespace greenmim
