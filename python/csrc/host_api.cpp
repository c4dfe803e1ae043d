//! \file host_api.cpp
//! The C ABI of greenmim_host.h: thin adapters from plain structs to the header-only library
//! (planner, index builders, Twins plans and conv tables, CPU reference). All arithmetic lives in include/greenmim/; this file
//! only checks arguments, converts views and turns statuses into messages.
#include "greenmim_host.h"

#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <greenmim/encoder_plan.hpp>
#include <greenmim/greenmim.hpp>
#include <greenmim/kernel_limits.hpp>
#include <greenmim/reference/attention.hpp>
#include <greenmim/reference/conv.hpp>
#include <greenmim/twins_plan.hpp>

namespace {

using namespace greenmim;

thread_local std::string g_last_error;

int fail(const std::string& why, int code = GMH_INVALID_ARGUMENT) {
  g_last_error = why;
  return code;
}
int fail(const char* where, status s) { return fail(std::string(where) + ": " + status_string(s)); }
int ok() {
  g_last_error.clear();
  return GMH_OK;
}

//! Runs `f` and turns any exception (out of memory, a throwing wrapper) into GMH_INTERNAL.
template <class F>
int guarded(F&& f) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return fail("out of memory", GMH_INTERNAL);
  } catch (const std::exception& e) {
    return fail(std::string("internal error: ") + e.what(), GMH_INTERNAL);
  } catch (...) {
    return fail("internal error", GMH_INTERNAL);
  }
}

bool valid_strategy(int32_t s) { return s >= GMH_FAST && s <= GMH_SINGLE; }

}  // namespace

struct gmh_stage {
  partition_indices part;
  std::vector<index_t> token_window;
  std::vector<index_t> window_sizes;
  gmh_stage_info info{};
};

namespace {

//! Visible coordinates of `num_masks` masks: cu_seqlens [M+1] and packed coords (row-major).
int mask_coords(const uint8_t* visible, int32_t num_masks, int32_t height, int32_t width,
                std::vector<index_t>& cu, std::vector<index_t>& coords) {
  if (!visible) return fail("visible: null pointer");
  if (num_masks < 1) return fail("num_masks must be >= 1, got " + std::to_string(num_masks));
  if (height < 1 || width < 1 || height > 32767 || width > 32767)
    return fail("mask grid must be 1..32767 per side, got " + std::to_string(height) + "x" + std::to_string(width));
  const std::int64_t total = static_cast<std::int64_t>(num_masks) * height * width;
  if (total > (std::int64_t{1} << 31) - 1) return fail("mask has more than 2^31-1 positions");
  if (status s = keep_mask_coords(span<const std::uint8_t>(visible, total), num_masks, height, width, cu, coords);
      s != status::success)
    return fail("mask", s);
  return GMH_OK;
}

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

template <class T, int R>
bool to_view(const gmh_tensor& t, int rank, tensor_view<T, R>& v, const char* name, std::string& why) {
  if (!t.data) {
    why = std::string(name) + ": null data";
    return false;
  }
  if (t.rank != rank) {
    why = std::string(name) + ": rank " + std::to_string(t.rank) + ", expected " + std::to_string(rank);
    return false;
  }
  v.data = static_cast<T*>(t.data);
  for (int i = 0; i < R; ++i) {
    if (t.extent[i] < 0 || t.stride[i] < 0) {
      why = std::string(name) + ": negative extent or stride";
      return false;
    }
    v.extent[i] = t.extent[i];
    v.stride[i] = t.stride[i];
  }
  return true;
}

partition_view to_partition(const gmh_partition& p) {
  return partition_view{p.gather, p.scatter, p.slot_window, p.slot_coord, p.group_size, p.num_groups, p.num_tokens};
}

//! An optional view: absent (data null) is fine, present must convert.
template <class T, int R>
bool opt_view(const gmh_tensor& t, int rank, tensor_view<T, R>& v, const char* name, std::string& why) {
  return !t.data || to_view(t, rank, v, name, why);
}

//! What both directions share after their views: partition, window, scale, the reference's own
//! checks (can_implement), then the run.
template <class T, class Args, class Run>
int run_reference(const gmh_attention_args& a, Args& r, const char* what, Run run) {
  r.part = to_partition(a.part);
  r.window = a.window;
  r.scale = static_cast<T>(a.scale);
  if (status s = reference::can_implement(r); s != status::success) return fail(what, s);
  if (status s = run(r); s != status::success) return fail(what, s);
  return ok();
}

template <class T>
int attention_fwd(const gmh_attention_args& a) {
  reference::attention_args<T> r;
  std::string why;
  if (!to_view(a.q, 4, r.q, "q", why) || !to_view(a.k, 4, r.k, "k", why) || !to_view(a.v, 4, r.v, "v", why) ||
      !to_view(a.o, 4, r.out, "o", why) || !opt_view(a.lse, 3, r.lse, "lse", why) ||
      !opt_view(a.bias_table, 2, r.bias, "bias_table", why))
    return fail(why);
  return run_reference<T>(a, r, "attention forward",
                          [](const auto& x) { return reference::group_attention_forward(x); });
}

template <class T>
int attention_bwd(const gmh_attention_args& a) {
  reference::attention_backward_args<T> r;
  std::string why;
  if (!to_view(a.q, 4, r.q, "q", why) || !to_view(a.k, 4, r.k, "k", why) || !to_view(a.v, 4, r.v, "v", why) ||
      !to_view(a.o, 4, r.o, "o", why) || !to_view(a.d_o, 4, r.dout, "d_o", why) ||
      !to_view(a.lse, 3, r.lse, "lse", why) || !to_view(a.dq, 4, r.dq, "dq", why) ||
      !to_view(a.dk, 4, r.dk, "dk", why) || !to_view(a.dv, 4, r.dv, "dv", why) ||
      !opt_view(a.bias_table, 2, r.bias, "bias_table", why) ||
      !opt_view(a.d_bias_table, 2, r.dbias, "d_bias_table", why))
    return fail(why);
  return run_reference<T>(a, r, "attention backward",
                          [](const auto& x) { return reference::group_attention_backward(x); });
}

gmh_range range(const arena_range& r) { return gmh_range{r.offset, r.size}; }

void describe(const encoder_partition& p, gmh_plan_partition& o) {
  o.group_size = p.group_size;
  o.num_groups = p.num_groups;
  o.num_windows = p.num_windows;
  o.window = p.window;
  o.shift = p.shift;
  o.budget_exhausted = p.budget_exhausted ? 1 : 0;
  o.cost = p.cost;
  o.lower_bound = p.lower_bound;
  o.plan_us = p.plan_us;
  o.gather = range(p.gather);
  o.scatter = range(p.scatter);
  o.slot_window = range(p.slot_window);
  o.slot_coord = range(p.slot_coord);
}

//! The argument checks of gmh_encoder_plan_build that deserve their own message.
int check_encoder_args(const gmh_encoder_args& a) {
  if (!a.visible) return fail("visible: null pointer");
  if (a.num_stages < 1 || a.num_stages > GMH_MAX_STAGES)
    return fail("num_stages must be 1.." + std::to_string(GMH_MAX_STAGES) + ", got " + std::to_string(a.num_stages));
  if (a.grid < 1 || a.grid > 32767) return fail("grid must be 1..32767, got " + std::to_string(a.grid));
  if (a.grid % (1 << (a.num_stages - 1)))
    return fail("the " + std::to_string(a.grid) + "x" + std::to_string(a.grid) + " patch grid does not halve " +
                std::to_string(a.num_stages - 1) + " times");
  if (a.window < 1 || a.window > 32767) return fail("window must be >= 1, got " + std::to_string(a.window));
  if (a.embed_dim < 1 || a.embed_dim > (1 << 20)) return fail("embed_dim must be 1..2^20, got " + std::to_string(a.embed_dim));
  if (a.num_masks < 1) return fail("num_masks must be >= 1, got " + std::to_string(a.num_masks));
  if (!a.per_sample && a.num_masks != 1) return fail("a shared mask is one mask (num_masks 1); use per_sample");
  if (a.mask_height < 1 || a.mask_width < 1 || a.grid % a.mask_height || a.grid % a.mask_width)
    return fail("a " + std::to_string(a.mask_height) + "x" + std::to_string(a.mask_width) + " mask does not tile the " +
                std::to_string(a.grid) + "x" + std::to_string(a.grid) + " patch grid (give it at mask-unit or patch resolution)");
  if (!valid_strategy(a.strategy)) return fail("unknown strategy " + std::to_string(a.strategy));
  if (a.group_size < -1)
    return fail("group_size must be >= -1 (0 = sweep, -1 = each stage's window area), got " +
                std::to_string(a.group_size));
  const bool sweeps = a.strategy == GMH_FAST || a.strategy == GMH_PAPER;
  if ((a.group_size != 0 || a.max_group_size > 0) && !sweeps)
    return fail("group_size and max_group_size apply to the fast and paper strategies only");
  if (a.group_size > 0 && a.max_group_size > 0 && a.group_size > a.max_group_size)
    return fail("group_size " + std::to_string(a.group_size) + " > max_group_size " + std::to_string(a.max_group_size));
  return GMH_OK;
}

int encoder_failure(status s, const gmh_encoder_args& a) {
  switch (s) {
    case status::empty_input: return fail("the mask has no visible patch");
    case status::misaligned:
      return fail("patch merging: a 2x2 block of tokens is partly visible (the mask unit must cover whole tokens of "
                  "the last stage, the encoder's largest stride)");
    case status::size_exceeds_group:
      return fail(a.group_size > 0 ? "plan: a window holds more tokens than the fixed group_size " +
                                         std::to_string(a.group_size)
                                   : "plan: a window holds more tokens than max_group_size" +
                                         (a.max_group_size > 0 ? " " + std::to_string(a.max_group_size) : std::string()));
    default: return fail("encoder plan", s);
  }
}

//! The argument checks of gmh_twins_plan_prepare that deserve their own message.
int check_twins_args(const gmh_twins_args& a) {
  if (!a.visible) return fail("visible: null pointer");
  if (a.num_stages < 1 || a.num_stages > GMH_MAX_STAGES)
    return fail("num_stages must be 1.." + std::to_string(GMH_MAX_STAGES) + ", got " + std::to_string(a.num_stages));
  if (a.grid < 1 || a.grid > 32767) return fail("grid must be 1..32767, got " + std::to_string(a.grid));
  if (a.grid % (1 << (a.num_stages - 1)))
    return fail("the " + std::to_string(a.grid) + "x" + std::to_string(a.grid) + " patch grid does not halve " +
                std::to_string(a.num_stages - 1) + " times");
  for (int32_t s = 0; s < a.num_stages; ++s) {
    const int32_t side = a.grid >> s;
    const std::string at = "stage " + std::to_string(s + 1) + " (" + std::to_string(side) + "x" + std::to_string(side) +
                           " tokens): ";
    if (a.window[s] < 1 || side % a.window[s])
      return fail(at + "the window " + std::to_string(a.window[s]) + " does not divide the grid (Twins pads such a "
                  "grid with zero tokens that attend like real ones; a visible-token encoder has no such tokens)");
    if (a.sr_ratio[s] < 1 || a.sr_ratio[s] > 64 || side % a.sr_ratio[s])
      return fail(at + "the sub-sampling ratio " + std::to_string(a.sr_ratio[s]) + " is not in 1..64 or does not "
                  "divide the grid");
    if (a.channels[s] < 1 || a.channels[s] > (1 << 20))
      return fail(at + "channels must be 1..2^20, got " + std::to_string(a.channels[s]));
  }
  gmh_encoder_args e{};
  e.visible = a.visible;
  e.num_masks = a.num_masks;
  e.mask_height = a.mask_height;
  e.mask_width = a.mask_width;
  e.per_sample = a.per_sample;
  e.grid = a.grid;
  e.window = 1;
  e.num_stages = a.num_stages;
  e.embed_dim = 1;
  e.strategy = a.strategy;
  e.group_size = a.group_size;
  e.max_group_size = a.max_group_size;
  return check_encoder_args(e);  // masks, strategy and group sizes as the Swin plan
}

template <class T>
bool bias_span(const gmh_tensor& t, span<const T>& out, const char* name, std::string& why) {
  if (!t.data) return true;
  if (t.rank != 1 || (t.extent[0] > 1 && t.stride[0] != 1)) {
    why = std::string(name) + ": a contiguous [C] tensor expected";
    return false;
  }
  out = span<const T>(static_cast<const T*>(t.data), t.extent[0]);
  return true;
}

template <class T>
int conv_run(const gmh_conv_args& a, bool block, bool backward) {
  const char* what = block ? (backward ? "block conv backward" : "block conv forward")
                           : (backward ? "depthwise conv backward" : "depthwise conv forward");
  std::string why;
  tensor_view<const T, 3> x, dy;
  tensor_view<T, 3> y, dx;
  span<const T> bias;
  if (!to_view(a.x, 3, x, "x", why)) return fail(std::string(what) + ": " + why);
  if (!a.table && a.table_size > 0) return fail(std::string(what) + ": table: null pointer");
  if (a.table_size < 0) return fail(std::string(what) + ": table_size < 0");
  const span<const index_t> table(a.table, a.table_size);
  status st = status::success;
  if (!backward) {
    if (!to_view(a.y, 3, y, "y", why) || !bias_span(a.bias, bias, "bias", why)) return fail(std::string(what) + ": " + why);
  } else {
    if (!to_view(a.dy, 3, dy, "dy", why) || !to_view(a.dx, 3, dx, "dx", why))
      return fail(std::string(what) + ": " + why);
    if (a.dbias.data && (a.dbias.rank != 1 || (a.dbias.extent[0] > 1 && a.dbias.stride[0] != 1)))
      return fail(std::string(what) + ": dbias: a contiguous [C] tensor expected");
  }
  span<T> dbias = a.dbias.data ? span<T>(static_cast<T*>(a.dbias.data), a.dbias.extent[0]) : span<T>();
  if (block) {
    tensor_view<const T, 4> w;
    tensor_view<T, 4> dw;
    if (!to_view(a.weight, 4, w, "weight", why) || !opt_view(a.dweight, 4, dw, "dweight", why))
      return fail(std::string(what) + ": " + why);
    st = backward ? reference::block_conv_backward<T>(table, a.size, x, w, dy, dx, dw, dbias)
                  : reference::block_conv_forward<T>(table, a.size, x, w, bias, y);
  } else {
    tensor_view<const T, 2> w;
    tensor_view<T, 2> dw;
    if (!to_view(a.weight, 2, w, "weight", why) || !opt_view(a.dweight, 2, dw, "dweight", why))
      return fail(std::string(what) + ": " + why);
    st = backward ? reference::depthwise_conv_backward<T>(table, a.size, x, w, dy, a.residual != 0, dx, dw, dbias)
                  : reference::depthwise_conv_forward<T>(table, a.size, x, w, bias, a.residual != 0, y);
  }
  if (st != status::success) return fail(what, st);
  return ok();
}

int conv_dispatch(const gmh_conv_args* a, bool block, bool backward) {
  return guarded([&]() -> int {
    if (!a) return fail("gmh conv: null argument");
    if (a->dtype == GMH_FLOAT32) return conv_run<float>(*a, block, backward);
    if (a->dtype == GMH_FLOAT64) return conv_run<double>(*a, block, backward);
    return fail("the CPU reference runs float32 and float64 only (dtype code " + std::to_string(a->dtype) + ")");
  });
}

void describe_twins(const twins_stage& st, gmh_twins_stage& o) {
  o.height = st.height;
  o.width = st.width;
  o.num_tokens = st.num_tokens;
  o.num_keys = st.num_keys;
  o.max_tokens = st.max_tokens;
  o.max_keys = st.max_keys;
  o.uniform = st.uniform ? 1 : 0;
  o.key_holes = st.key_holes ? 1 : 0;
  o.embed_holes = st.embed_holes ? 1 : 0;
  o.reshape = (st.key_reshape ? 1 : 0) | (st.embed_reshape ? 2 : 0);
  describe(st.lsa, o.lsa);
  o.position = range(st.position);
  o.cu_seqlens = range(st.cu_seqlens);
  o.neighbors = range(st.neighbors);
  o.keys = range(st.keys);
  o.key_cu_seqlens = range(st.key_cu_seqlens);
  o.query_slot = range(st.query_slot);
  o.key_gather = range(st.key_gather);
  o.embed = range(st.embed);
  o.unit_rank = range(st.unit_rank);
}

//! The planner options of both plan ABIs: group_size > 0 fixes G, -1 fixes it at each window's
//! area; max_group_size > 0 caps G, < 0 takes the fast kernels' cap per stage.
encoder_plan_options plan_options(int32_t strat, int32_t group_size, int32_t max_group_size) {
  encoder_plan_options opt;
  opt.strat = static_cast<strategy>(strat);
  opt.group_size = group_size > 0 ? group_size : 0;
  opt.window_area_groups = group_size == -1;
  opt.max_group_size = max_group_size > 0 ? max_group_size : 0;
  if (max_group_size < 0) opt.stage_cap = &greenmim::fast_path_max_group;
  return opt;
}

}  // namespace

struct gmh_encoder_planner {
  greenmim::encoder_planner planner;
};

struct gmh_twins_planner {
  greenmim::twins_planner planner;
};

struct gmh_conv_table {
  std::vector<index_t> entries, out_cu, out_position;
  gmh_conv_table_info info{};
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

int gmh_attention_fwd(const gmh_attention_args* a) {
  return guarded([&]() -> int {
    if (!a) return fail("gmh_attention_fwd: null argument");
    if (a->dtype == GMH_FLOAT32) return attention_fwd<float>(*a);
    if (a->dtype == GMH_FLOAT64) return attention_fwd<double>(*a);
    return fail("the CPU reference runs float32 and float64 only (dtype code " + std::to_string(a->dtype) + ")");
  });
}

int gmh_attention_bwd(const gmh_attention_args* a) {
  return guarded([&]() -> int {
    if (!a) return fail("gmh_attention_bwd: null argument");
    if (a->dtype == GMH_FLOAT32) return attention_bwd<float>(*a);
    if (a->dtype == GMH_FLOAT64) return attention_bwd<double>(*a);
    return fail("the CPU reference runs float32 and float64 only (dtype code " + std::to_string(a->dtype) + ")");
  });
}

int gmh_encoder_planner_create(gmh_encoder_planner** out) {
  return guarded([&]() -> int {
    if (!out) return fail("gmh_encoder_planner_create: null argument");
    *out = new gmh_encoder_planner{};
    return ok();
  });
}

void gmh_encoder_planner_destroy(gmh_encoder_planner* p) { delete p; }

int gmh_encoder_plan_prepare(gmh_encoder_planner* p, const gmh_encoder_args* a, gmh_encoder_info* info) {
  return guarded([&]() -> int {
    if (!p || !a || !info) return fail("gmh_encoder_plan_prepare: null argument");
    if (int rc = check_encoder_args(*a)) return rc;
    const auto t0 = std::chrono::steady_clock::now();
    const std::int64_t n = static_cast<std::int64_t>(a->num_masks) * a->mask_height * a->mask_width;
    encoder_geometry geo{a->grid, a->window, a->num_stages, a->embed_dim};
    const encoder_plan_options opt = plan_options(a->strategy, a->group_size, a->max_group_size);
    encoder_plan layout;
    if (status s = p->planner.prepare(span<const std::uint8_t>(a->visible, n), a->num_masks, a->mask_height,
                                      a->mask_width, a->per_sample != 0, geo, opt, layout);
        s != status::success)
      return encoder_failure(s, *a);
    *info = gmh_encoder_info{};
    info->num_stages = a->num_stages;
    info->num_masks = a->num_masks;
    info->arena_size = p->planner.arena_size();
    for (int32_t s = 0; s < a->num_stages; ++s) {
      const encoder_stage& st = layout.stages[static_cast<size_t>(s)];
      gmh_plan_stage& o = info->stage[s];
      o.height = st.height;
      o.width = st.width;
      o.num_tokens = st.num_tokens;
      describe(st.part[0], o.part[0]);
      describe(st.part[1], o.part[1]);
      o.position = range(st.position);
      o.merge = range(st.merge);
      o.cu_seqlens = range(st.cu_seqlens);
      o.unit_rank = range(st.unit_rank);
    }
    info->build_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    return ok();
  });
}

int gmh_encoder_plan_write(const gmh_encoder_planner* p, int32_t* arena) {
  return guarded([&]() -> int {
    if (!p) return fail("gmh_encoder_plan_write: null planner");
    if (p->planner.write(arena) != status::success)
      return fail(arena ? "gmh_encoder_plan_write: no prepared plan (a prepare failed or none ran)"
                        : "gmh_encoder_plan_write: null arena");
    return ok();
  });
}

int gmh_twins_planner_create(gmh_twins_planner** out) {
  return guarded([&]() -> int {
    if (!out) return fail("gmh_twins_planner_create: null argument");
    *out = new gmh_twins_planner{};
    return ok();
  });
}

void gmh_twins_planner_destroy(gmh_twins_planner* p) { delete p; }

int gmh_twins_plan_prepare(gmh_twins_planner* p, const gmh_twins_args* a, gmh_twins_info* info) {
  return guarded([&]() -> int {
    if (!p || !a || !info) return fail("gmh_twins_plan_prepare: null argument");
    if (int rc = check_twins_args(*a)) return rc;
    const auto t0 = std::chrono::steady_clock::now();
    const std::int64_t n = static_cast<std::int64_t>(a->num_masks) * a->mask_height * a->mask_width;
    twins_geometry geo;
    geo.grid = a->grid;
    geo.windows.assign(a->window, a->window + a->num_stages);
    geo.sr_ratios.assign(a->sr_ratio, a->sr_ratio + a->num_stages);
    geo.channels.assign(a->channels, a->channels + a->num_stages);
    const encoder_plan_options opt = plan_options(a->strategy, a->group_size, a->max_group_size);
    twins_plan layout;
    if (status s = p->planner.prepare(span<const std::uint8_t>(a->visible, n), a->num_masks, a->mask_height,
                                      a->mask_width, a->per_sample != 0, geo, opt, layout);
        s != status::success) {
      gmh_encoder_args e{};
      e.group_size = a->group_size;
      e.max_group_size = a->max_group_size;
      return encoder_failure(s, e);
    }
    *info = gmh_twins_info{};
    info->num_stages = a->num_stages;
    info->num_masks = a->num_masks;
    info->arena_size = p->planner.arena_size();
    for (int32_t s = 0; s < a->num_stages; ++s) describe_twins(layout.stages[static_cast<size_t>(s)], info->stage[s]);
    info->build_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    return ok();
  });
}

int gmh_twins_plan_write(const gmh_twins_planner* p, int32_t* arena) {
  return guarded([&]() -> int {
    if (!p) return fail("gmh_twins_plan_write: null planner");
    if (p->planner.write(arena) != status::success)
      return fail(arena ? "gmh_twins_plan_write: no prepared plan (a prepare failed or none ran)"
                        : "gmh_twins_plan_write: null arena");
    return ok();
  });
}

int gmh_conv_table_build(const gmh_conv_table_args* a, gmh_conv_table** out, gmh_conv_table_info* info) {
  return guarded([&]() -> int {
    if (!a || !out || !info) return fail("gmh_conv_table_build: null argument");
    *out = nullptr;
    if (!a->per_sample && a->num_masks != 1) return fail("a shared mask is one mask (num_masks 1); use per_sample");
    std::vector<index_t> cu, coords;
    if (int rc = mask_coords(a->visible, a->num_masks, a->height, a->width, cu, coords)) return rc;
    const span<const index_t> cus(cu), cs(coords);
    auto t = std::make_unique<gmh_conv_table>();
    const index_t H = a->height, W = a->width, k = a->size;
    gmh_conv_table_info& i = t->info;
    i.num_inputs = static_cast<int32_t>(coords.size());
    if (a->kind == GMH_NEIGHBOR_TABLE) {
      if (k < 1 || k > 15 || k % 2 == 0) return fail("neighbour table: the kernel must be odd, 1..15, got " + std::to_string(k));
      neighbor_table nt;
      const status s = a->per_sample ? build_neighbor_table_per_sample(H, W, k, cus, cs, nt)
                                     : build_neighbor_table(H, W, k, cs, nt);
      if (s != status::success) return fail("neighbour table", s);
      t->entries = std::move(nt.nbr);
      t->out_cu = cu;
      i.num_outputs = i.num_inputs;
      i.row = k * k;
      t->out_position.resize(coords.size());
      for (index_t b = 0; b < a->num_masks; ++b)
        for (index_t u = cu[b]; u < cu[b + 1]; ++u)
          t->out_position[u] = (a->per_sample ? b * H * W : 0) + coord_h(coords[u]) * W + coord_w(coords[u]);
    } else if (a->kind == GMH_BLOCK_TABLE) {
      if (k < 1 || k > 64 || H % k || W % k)
        return fail("block table: the stride " + std::to_string(k) + " must be 1..64 and divide the " +
                    std::to_string(H) + "x" + std::to_string(W) + " grid");
      block_table bt;
      const status s = a->per_sample ? build_block_table_per_sample(H, W, k, cus, cs, bt, block_rule::any)
                                     : build_block_table(H, W, k, cs, bt, block_rule::any);
      if (s != status::success) return fail("block table", s);
      i.num_outputs = bt.num_outputs();
      i.row = k * k;
      for (index_t v : bt.gather) i.holes |= v == pad_index ? 1 : 0;
      t->entries = std::move(bt.gather);
      t->out_cu = a->per_sample ? bt.next_cu_seqlens : std::vector<index_t>{0, bt.num_outputs()};
      const index_t Hn = H / k, Wn = W / k;
      t->out_position.resize(bt.next_coords.size());
      for (index_t b = 0; b + 1 < static_cast<index_t>(t->out_cu.size()); ++b)
        for (index_t u = t->out_cu[b]; u < t->out_cu[b + 1]; ++u)
          t->out_position[u] = (a->per_sample ? b * Hn * Wn : 0) + coord_h(bt.next_coords[u]) * Wn + coord_w(bt.next_coords[u]);
    } else {
      return fail("unknown table kind " + std::to_string(a->kind));
    }
    *info = i;
    *out = t.release();
    return ok();
  });
}

int gmh_conv_table_copy(const gmh_conv_table* t, int32_t* entries, int32_t* out_cu_seqlens, int32_t* out_position) {
  if (!t) return fail("gmh_conv_table_copy: null table");
  auto put = [](int32_t* dst, const std::vector<index_t>& src) {
    if (dst && !src.empty()) std::memcpy(dst, src.data(), src.size() * sizeof(int32_t));
  };
  put(entries, t->entries);
  put(out_cu_seqlens, t->out_cu);
  put(out_position, t->out_position);
  return ok();
}

void gmh_conv_table_free(gmh_conv_table* t) { delete t; }

int gmh_depthwise_conv_fwd(const gmh_conv_args* a) { return conv_dispatch(a, false, false); }
int gmh_depthwise_conv_bwd(const gmh_conv_args* a) { return conv_dispatch(a, false, true); }
int gmh_block_conv_fwd(const gmh_conv_args* a) { return conv_dispatch(a, true, false); }
int gmh_block_conv_bwd(const gmh_conv_args* a) { return conv_dispatch(a, true, true); }

}  // extern "C"
