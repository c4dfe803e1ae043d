//! \file host_planners.cpp
//! The C ABI of greenmim_host.h, the two arena planners: a Swin encoder's plan
//! (gmh_encoder_plan_*, include/greenmim/encoder_plan.hpp) and a Twins plan (gmh_twins_plan_*,
//! include/greenmim/twins_plan.hpp), each as create / prepare (sizes and layout) / write (into
//! the caller's arena) / destroy.
#include "host_common.hpp"

#include <greenmim/kernel_limits.hpp>
#include <greenmim/twins_plan.hpp>

using namespace greenmim;
using namespace greenmim::host;

namespace {

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

}  // namespace

struct gmh_encoder_planner {
  greenmim::encoder_planner planner;
};

struct gmh_twins_planner {
  greenmim::twins_planner planner;
};

namespace {

//! gmh_*_planner_create of either planner: a new, empty planner in *out.
template <class Planner>
int create_planner(Planner** out, const char* fn) {
  return guarded([&]() -> int {
    if (!out) return fail(std::string(fn) + ": null argument");
    *out = new Planner{};
    return ok();
  });
}

//! gmh_*_plan_write of either planner: the prepared plan into the caller's arena.
template <class Planner>
int write_plan(const Planner* p, int32_t* arena, const char* fn) {
  return guarded([&]() -> int {
    if (!p) return fail(std::string(fn) + ": null planner");
    if (p->planner.write(arena) != status::success)
      return fail(std::string(fn) + (arena ? ": no prepared plan (a prepare failed or none ran)" : ": null arena"));
    return ok();
  });
}

//! gmh_*_plan_prepare of either planner: the argument checks (`check`), the planner's layout of
//! the masks for `geometry(args)` (a failure's message from `failure`), then `info`: its head, each
//! stage by `describe_stage`, and the time it took.
template <class Layout, class Planner, class Args, class Info, class Check, class Geometry, class Failure,
          class DescribeStage>
int prepare_plan(Planner* p, const Args* a, Info* info, const char* fn, Check check, Geometry geometry,
                 Failure failure, DescribeStage describe_stage) {
  return guarded([&]() -> int {
    if (!p || !a || !info) return fail(std::string(fn) + ": null argument");
    if (int rc = check(*a)) return rc;
    const auto t0 = std::chrono::steady_clock::now();
    const std::int64_t n = static_cast<std::int64_t>(a->num_masks) * a->mask_height * a->mask_width;
    const encoder_plan_options opt = plan_options(a->strategy, a->group_size, a->max_group_size);
    Layout layout;
    if (status s = p->planner.prepare(span<const std::uint8_t>(a->visible, n), a->num_masks, a->mask_height,
                                      a->mask_width, a->per_sample != 0, geometry(*a), opt, layout);
        s != status::success)
      return failure(s, *a);
    *info = Info{};
    info->num_stages = a->num_stages;
    info->num_masks = a->num_masks;
    info->arena_size = p->planner.arena_size();
    for (int32_t s = 0; s < a->num_stages; ++s) describe_stage(layout.stages[static_cast<size_t>(s)], info->stage[s]);
    info->build_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    return ok();
  });
}

}  // namespace

extern "C" {

int gmh_encoder_planner_create(gmh_encoder_planner** out) {
  return create_planner(out, "gmh_encoder_planner_create");
}

void gmh_encoder_planner_destroy(gmh_encoder_planner* p) { delete p; }

int gmh_encoder_plan_prepare(gmh_encoder_planner* p, const gmh_encoder_args* a, gmh_encoder_info* info) {
  return prepare_plan<encoder_plan>(
      p, a, info, "gmh_encoder_plan_prepare", check_encoder_args,
      [](const gmh_encoder_args& a) { return encoder_geometry{a.grid, a.window, a.num_stages, a.embed_dim}; },
      [](status s, const gmh_encoder_args& a) { return encoder_failure(s, a); },
      [](const encoder_stage& st, gmh_plan_stage& o) {
        o.height = st.height;
        o.width = st.width;
        o.num_tokens = st.num_tokens;
        describe(st.part[0], o.part[0]);
        describe(st.part[1], o.part[1]);
        o.position = range(st.position);
        o.merge = range(st.merge);
        o.cu_seqlens = range(st.cu_seqlens);
        o.unit_rank = range(st.unit_rank);
      });
}

int gmh_encoder_plan_write(const gmh_encoder_planner* p, int32_t* arena) {
  return write_plan(p, arena, "gmh_encoder_plan_write");
}

int gmh_twins_planner_create(gmh_twins_planner** out) {
  return create_planner(out, "gmh_twins_planner_create");
}

void gmh_twins_planner_destroy(gmh_twins_planner* p) { delete p; }

int gmh_twins_plan_prepare(gmh_twins_planner* p, const gmh_twins_args* a, gmh_twins_info* info) {
  return prepare_plan<twins_plan>(
      p, a, info, "gmh_twins_plan_prepare", check_twins_args,
      [](const gmh_twins_args& a) {
        twins_geometry geo;
        geo.grid = a.grid;
        geo.windows.assign(a.window, a.window + a.num_stages);
        geo.sr_ratios.assign(a.sr_ratio, a.sr_ratio + a.num_stages);
        geo.channels.assign(a.channels, a.channels + a.num_stages);
        return geo;
      },
      [](status s, const gmh_twins_args& a) {   // the planner's failures read as the encoder's
        gmh_encoder_args e{};
        e.group_size = a.group_size;
        e.max_group_size = a.max_group_size;
        return encoder_failure(s, e);
      },
      describe_twins);
}

int gmh_twins_plan_write(const gmh_twins_planner* p, int32_t* arena) {
  return write_plan(p, arena, "gmh_twins_plan_write");
}

}  // extern "C"
