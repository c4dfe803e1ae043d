//! \file host_api.cpp
//! The C ABI of greenmim_host.h: thin adapters from plain structs to the header-only library.
//! All arithmetic lives in include/greenmim/; these files only check arguments, convert views and
//! turn statuses into messages. This one: versions, the last error, the per-stage index builder
//! (gmh_stage_*: the reference the encoder planner is tested against), plan tables and merge
//! indices. The other families: host_planners.cpp, host_reference.cpp, host_conv.cpp
//! (host_common.hpp lists them).
#include "host_common.hpp"

#include <chrono>
#include <cstring>
#include <memory>

using namespace greenmim;
using namespace greenmim::host;

thread_local std::string greenmim::host::g_last_error;

namespace {

int plan_sizes(const std::vector<index_t>& sizes, int32_t strat, int32_t group_size, int32_t max_group_size,
               int32_t channels, plan& p, double& plan_us) {
  if (!valid_strategy(strat)) return fail("unknown strategy " + std::to_string(strat));
  if (group_size < 0) return fail("group_size must be >= 0 (0 = sweep), got " + std::to_string(group_size));
  if (max_group_size < 0)
    return fail("max_group_size must be >= 0 (0 = no cap), got " + std::to_string(max_group_size));
  if (max_group_size > 0 && strat != GMH_FAST && strat != GMH_PAPER)
    return fail("max_group_size applies to the fast and paper strategies only");
  if (group_size > 0 && max_group_size > 0 && group_size > max_group_size)
    return fail("group_size " + std::to_string(group_size) + " > max_group_size " + std::to_string(max_group_size));
  if (channels < 1 || channels > (1 << 20)) return fail("channels must be 1..2^20, got " + std::to_string(channels));
  planner_options opt;
  opt.strat = static_cast<strategy>(strat);
  opt.group_size = group_size;
  opt.max_group_size = max_group_size;
  const auto t0 = std::chrono::steady_clock::now();
  const status s = make_plan(span<const index_t>(sizes), opt, static_cast<index_t>(channels), p);
  plan_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  if (s == status::empty_input) return fail("plan: no visible token in any window");
  if (s == status::size_exceeds_group)
    return fail(group_size > 0 ? "plan: a window holds more tokens than the fixed group_size " + std::to_string(group_size)
                               : "plan: a window holds more tokens than max_group_size " + std::to_string(max_group_size));
  if (s != status::success) return fail("plan", s);
  return GMH_OK;
}

}  // namespace

struct gmh_stage {
  partition_indices part;
  std::vector<index_t> token_window;
  std::vector<index_t> window_sizes;
  gmh_stage_info info{};
};

extern "C" {

int32_t gmh_abi_version(void) { return GMH_ABI_VERSION; }
int32_t gmh_version(void) {
  return GREENMIM_VERSION_MAJOR * 10000 + GREENMIM_VERSION_MINOR * 100 + GREENMIM_VERSION_PATCH;
}
const char* gmh_last_error(void) { return g_last_error.c_str(); }

int gmh_window_geometry(int32_t height, int32_t width, int32_t window, int32_t shift, int32_t* out_window,
                        int32_t* out_shift, int32_t* num_windows) {
  if (!out_window || !out_shift || !num_windows) return fail("gmh_window_geometry: null argument");
  const window_geometry g = make_window_geometry(height, width, window, shift);
  if (!g.valid())
    return fail("window geometry: grid " + std::to_string(height) + "x" + std::to_string(width) + ", window " +
                std::to_string(window) + ", shift " + std::to_string(shift) + " is not valid");
  *out_window = g.window;
  *out_shift = g.shift;
  *num_windows = g.num_windows();
  return ok();
}

int gmh_stage_build(const gmh_stage_args* a, gmh_stage** out) {
  return guarded([&]() -> int {
    if (!a || !out) return fail("gmh_stage_build: null argument");
    *out = nullptr;
    if (a->window < 1 || a->window > 32767) return fail("window must be >= 1, got " + std::to_string(a->window));
    if (a->shift < 0 || a->shift >= a->window)
      return fail("shift must be in [0, window), got " + std::to_string(a->shift));
    std::vector<index_t> cu, coords;
    if (int rc = mask_coords(a->visible, a->num_masks, a->height, a->width, cu, coords)) return rc;
    if (coords.empty()) return fail("mask: no visible token");
    const window_geometry g = make_window_geometry(a->height, a->width, a->window, a->shift);
    window_list wl;
    const status ws = a->num_masks == 1
                          ? build_windows(g, span<const index_t>(coords), wl)
                          : build_windows_per_sample(g, span<const index_t>(cu), span<const index_t>(coords), wl);
    if (ws != status::success) return fail("windows", ws);
    auto st = std::make_unique<gmh_stage>();
    st->window_sizes = wl.sizes();
    plan p;
    double us = 0;
    if (int rc = plan_sizes(st->window_sizes, a->strategy, a->group_size, a->max_group_size, a->channels, p, us))
      return rc;
    if (status s = build_partition(p, wl, st->part); s != status::success) return fail("partition", s);
    st->token_window.assign(static_cast<size_t>(wl.num_tokens), pad_index);
    for (index_t w = 0; w < wl.num_windows(); ++w)
      for (index_t t : wl.window(w)) st->token_window[static_cast<size_t>(t)] = w;
    gmh_stage_info& i = st->info;
    i.group_size = st->part.group_size;
    i.num_groups = st->part.num_groups;
    i.num_tokens = st->part.num_tokens;
    i.num_windows = wl.num_windows();
    i.window = g.window;
    i.shift = g.shift;
    i.budget_exhausted = p.budget_exhausted ? 1 : 0;
    i.cost = p.cost;
    i.lower_bound = p.lower_bound;
    i.plan_us = us;
    *out = st.release();
    return ok();
  });
}

int gmh_stage_info_get(const gmh_stage* s, gmh_stage_info* info) {
  if (!s || !info) return fail("gmh_stage_info_get: null argument");
  *info = s->info;
  return ok();
}

int gmh_stage_copy(const gmh_stage* s, int32_t* gather, int32_t* scatter, int32_t* slot_window, int32_t* slot_coord,
                   int32_t* token_window, int32_t* window_sizes) {
  if (!s) return fail("gmh_stage_copy: null stage");
  auto put = [](int32_t* dst, const std::vector<index_t>& src) {
    if (dst && !src.empty()) std::memcpy(dst, src.data(), src.size() * sizeof(int32_t));
  };
  put(gather, s->part.gather);
  put(scatter, s->part.scatter);
  put(slot_window, s->part.slot_window);
  put(slot_coord, s->part.slot_coord);
  put(token_window, s->token_window);
  put(window_sizes, s->window_sizes);
  return ok();
}

void gmh_stage_free(gmh_stage* s) { delete s; }

int32_t gmh_fast_path_max_group(int32_t window) { return greenmim::fast_path_max_group(window); }

int gmh_plan_table(const int32_t* sizes, int32_t num_windows, int32_t strat, int32_t group_size,
                   int32_t max_group_size, int32_t channels, int32_t* window_group, int32_t* window_slot_offset,
                   gmh_stage_info* info) {
  return guarded([&]() -> int {
    if (!sizes || !window_group || !window_slot_offset || !info) return fail("gmh_plan_table: null argument");
    if (num_windows < 1) return fail("num_windows must be >= 1, got " + std::to_string(num_windows));
    std::vector<index_t> sz(sizes, sizes + num_windows);
    for (index_t v : sz)
      if (v < 0) return fail("window sizes must be >= 0, got " + std::to_string(v));
    plan p;
    double us = 0;
    if (int rc = plan_sizes(sz, strat, group_size, max_group_size, channels, p, us)) return rc;
    for (int32_t w = 0; w < num_windows; ++w) window_group[w] = window_slot_offset[w] = pad_index;
    for (index_t g = 0; g < p.num_groups(); ++g) {
      index_t off = 0;
      for (index_t w : p.group(g)) {
        window_group[w] = g;
        window_slot_offset[w] = off;
        off += sz[static_cast<size_t>(w)];
      }
    }
    *info = gmh_stage_info{};
    info->group_size = p.group_size;
    info->num_groups = p.num_groups();
    info->num_windows = num_windows;
    info->budget_exhausted = p.budget_exhausted ? 1 : 0;
    info->cost = p.cost;
    info->lower_bound = p.lower_bound;
    info->plan_us = us;
    return ok();
  });
}

int gmh_merge_indices(const uint8_t* visible, int32_t num_masks, int32_t height, int32_t width, int32_t* gather4,
                      int64_t capacity, int64_t* written) {
  return guarded([&]() -> int {
    if (!gather4 || !written) return fail("gmh_merge_indices: null argument");
    std::vector<index_t> cu, coords, g4, next_cu, next;
    if (int rc = mask_coords(visible, num_masks, height, width, cu, coords)) return rc;
    const status s = num_masks == 1 ? merge_indices(height, width, span<const index_t>(coords), g4, next)
                                    : merge_indices_per_sample(height, width, span<const index_t>(cu),
                                                               span<const index_t>(coords), g4, next_cu, next);
    if (s == status::misaligned)
      return fail("patch merging: a 2x2 block of tokens is partly visible (the mask unit must cover whole blocks)");
    if (s == status::invalid_argument && (height % 2 || width % 2))
      return fail("patch merging: grid " + std::to_string(height) + "x" + std::to_string(width) + " is not even");
    if (s != status::success) return fail("patch merging", s);
    if (static_cast<int64_t>(g4.size()) > capacity)
      return fail("gather4 holds " + std::to_string(capacity) + " entries, " + std::to_string(g4.size()) + " needed");
    if (!g4.empty()) std::memcpy(gather4, g4.data(), g4.size() * sizeof(int32_t));
    *written = static_cast<int64_t>(g4.size());
    return ok();
  });
}

}  // extern "C"
