// The model and geometry flags shared by `plan`, `simulate` and `demo`: --model NAME, then
// --image, --patch, --window, --mask-unit on top of it (validated by greenmim::make_model_shape,
// one line on failure) and --ratio; the notes the commands print about Swin's small-stage rule
// and about which attention path (CUDA kernels or the CPU reference) can run a stage.
#pragma once

#include <greenmim/random_masks.hpp>
#include <greenmim/kernel_limits.hpp>
#include <greenmim/models.hpp>

#include <string>
#include <vector>

#include "cli_common.hpp"
#include "cli_main.hpp"

namespace greenmim::cli {

//! The usage lines of the geometry flags, as every command prints them.
inline const char* geometry_usage() {
  return
    "  --image PX        image side in pixels (default: the model's: 224, 192 or 256)\n"
    "  --patch PX        patch size (default: the model's, 4)\n"
    "  --window P        window side in tokens (default: the model's; a stage grid <= P is one\n"
    "                    window of the grid's size, not shifted, as in Swin/timm)\n"
    "  --mask-unit PX    mask unit side (default: the largest patch stride, patch x 8 = 32)\n"
    "  --ratio R         mask ratio in [0, 1] (default 0.75)\n";
}

//! Geometry flags, valued (each command adds them to its own).
inline const std::vector<std::string>& geometry_flags() {
  static const std::vector<std::string> f = {"--image", "--patch", "--window", "--mask-unit", "--ratio"};
  return f;
}

//! `v` followed by the geometry flags.
inline std::vector<std::string> with_geometry_flags(std::vector<std::string> v) {
  for (const auto& f : geometry_flags()) v.push_back(f);
  return v;
}

//! Names of the built-in Swin models, comma-separated.
inline std::string swin_model_names() {
  std::string names;
  for (const auto& m : builtin_models) names += std::string(names.empty() ? "" : ", ") + m.name;
  return names;
}

//! The built-in Swin model names wrapped to lines of at most `width` characters, every line
//! after the first indented by `indent` spaces (for usage texts).
inline std::string swin_model_names_wrapped(std::size_t indent, std::size_t width = 100) {
  std::string out, line;
  for (const auto& m : builtin_models) {
    const std::string item = std::string(m.name);
    if (!line.empty() && indent + line.size() + 1 + item.size() > width) {
      out += line + "\n" + std::string(indent, ' ');
      line.clear();
    }
    line += (line.empty() ? "" : " ") + item;
  }
  return out + line;
}

//! A model chosen on the command line: the validated shape, the mask ratio, and whether the
//! geometry is the preset's own (no --image/--patch/--window/--mask-unit given).
struct model_choice {
  model_shape shape{};
  const model_shape* preset = nullptr;
  double ratio = 0.75;
  bool preset_geometry = true;
  mask_config masking() const { return make_mask_config(shape, ratio); }
};

//! Parses --model (default `dflt`) and the geometry flags of `a`. Throws usage_error with one
//! line: an unknown model (naming the closest), a bad number, a geometry make_model_shape
//! refuses (its reason), a stage-1 grid above `lim.max_grid`.
inline model_choice parse_model(const args& a, const std::string& dflt, const limits& lim,
                                const std::string& extra_names = {}) {
  model_choice c;
  const std::string name = a.get("--model", dflt);
  c.preset = find_model(name.c_str());
  if (!c.preset) {
    std::vector<std::string> names;
    for (const auto& m : builtin_models) names.emplace_back(m.name);
    throw usage_error("--model: unknown model '" + name + "'" + did_you_mean(name, names) + " (" + swin_model_names() +
                      extra_names + ")");
  }
  model_geometry g;
  if (a.has("--image")) g.image_size = static_cast<index_t>(parse_int(a.get("--image"), "--image", 1, 32768));
  if (a.has("--patch")) g.patch_size = static_cast<index_t>(parse_int(a.get("--patch"), "--patch", 1, 4096));
  if (a.has("--window")) g.window = static_cast<index_t>(parse_int(a.get("--window"), "--window", 1, 32767));
  if (a.has("--mask-unit")) g.mask_unit = static_cast<index_t>(parse_int(a.get("--mask-unit"), "--mask-unit", 1, 32768));
  c.preset_geometry = !(a.has("--image") || a.has("--patch") || a.has("--window") || a.has("--mask-unit"));
  std::string why;
  if (make_model_shape(*c.preset, g, c.shape, &why) != status::success) throw usage_error(why);
  if (c.shape.grid(0) > lim.max_grid)
    throw usage_error("stage-1 grid of " + std::to_string(c.shape.grid(0)) + " tokens per side is above this program's limit of " +
                      std::to_string(lim.max_grid));
  c.ratio = parse_double(a.get("--ratio", "0.75"), "--ratio", 0.0, 1.0);
  return c;
}

//! One line on Swin's small-stage rule for stage `s` (0-based) of `m`, or "" when it changes
//! nothing (`shifted`: whether the caller runs a shifted block at this stage).
inline std::string window_note(const model_shape& m, int s, bool shifted) {
  const index_t g = m.grid(s);
  if (m.window_shrunk(s))
    return "stage " + std::to_string(s + 1) + ": grid " + std::to_string(g) + " < window " + std::to_string(m.window) +
           ": one " + std::to_string(g) + "x" + std::to_string(g) + " window, no shift (Swin/timm small-stage rule)";
  if (shifted && m.shift_dropped(s))
    return "stage " + std::to_string(s + 1) + ": grid " + std::to_string(g) + " = window " + std::to_string(m.window) +
           ": one window, no shift (Swin/timm small-stage rule)";
  return {};
}

//! Which attention path can run stage `s` with groups of `group_size`: "CUDA kernels accept
//! it (...), on tensor cores / on CUDA cores (...)" or "CUDA kernels refuse it (reason): the CPU
//! reference runs it".
inline std::string path_note(const model_shape& m, int s, index_t group_size) {
  const index_t w = m.geometry(s, false).window;
  const std::string why = cuda_attention_refusal(w, group_size, m.head_dim);
  if (why.empty())
    return "CUDA kernels accept it (window " + std::to_string(w) + " <= " + std::to_string(cuda_max_window) + ", G " +
           std::to_string(group_size) + " <= " + std::to_string(cuda_max_group) + ", head_dim " +
           std::to_string(m.head_dim) + ")" +
           (group_size <= cuda_mma_max_group ? ", on tensor cores (fp16/bf16, G <= " : ", on CUDA cores (G > ") +
           std::to_string(cuda_mma_max_group) + ")";
  return "CUDA kernels refuse it (" + why + "): the CPU reference runs it";
}

}  // namespace greenmim::cli
