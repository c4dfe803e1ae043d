//! \file host_common.hpp
//! Private to python/csrc (the greenmim_host library): what every family of the C ABI shares: the
//! last error (gmh_last_error), the status-to-message helpers, the exception guard, tensor views
//! from gmh_tensor, visible coordinates of masks, and the planner options of both plan ABIs.
//! The ABI's families, one file each: host_api.cpp (versions, stage and plan tables, merge
//! indices), host_planners.cpp (the encoder and Twins planners), host_reference.cpp (the CPU
//! reference attention), host_conv.cpp (conv tables and the CPU reference convs).
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <greenmim/encoder_plan.hpp>
#include <greenmim/greenmim.hpp>
#include <greenmim/kernel_limits.hpp>

#include "greenmim_host.h"

// Hidden: the library exports its gmh_ functions only.
#pragma GCC visibility push(hidden)
namespace greenmim {
namespace host {

//! The calling thread's last error message (defined in host_api.cpp).
extern thread_local std::string g_last_error;

inline int fail(const std::string& why, int code = GMH_INVALID_ARGUMENT) {
  g_last_error = why;
  return code;
}
inline int fail(const char* where, status s) { return fail(std::string(where) + ": " + status_string(s)); }
inline int ok() {
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

inline bool valid_strategy(int32_t s) { return s >= GMH_FAST && s <= GMH_SINGLE; }

//! Visible coordinates of `num_masks` masks: cu_seqlens [M+1] and packed coords (row-major).
inline int mask_coords(const uint8_t* visible, int32_t num_masks, int32_t height, int32_t width,
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

//! An optional view: absent (data null) is fine, present must convert.
template <class T, int R>
bool opt_view(const gmh_tensor& t, int rank, tensor_view<T, R>& v, const char* name, std::string& why) {
  return !t.data || to_view(t, rank, v, name, why);
}

inline gmh_range range(const arena_range& r) { return gmh_range{r.offset, r.size}; }

//! The planner options of both plan ABIs: group_size > 0 fixes G, -1 fixes it at each window's
//! area; max_group_size > 0 caps G, < 0 takes the fast kernels' cap per stage.
inline encoder_plan_options plan_options(int32_t strat, int32_t group_size, int32_t max_group_size) {
  encoder_plan_options opt;
  opt.strat = static_cast<strategy>(strat);
  opt.group_size = group_size > 0 ? group_size : 0;
  opt.window_area_groups = group_size == -1;
  opt.max_group_size = max_group_size > 0 ? max_group_size : 0;
  if (max_group_size < 0) opt.stage_cap = &greenmim::fast_path_max_group;
  return opt;
}

}  // namespace host
}  // namespace greenmim
#pragma GCC visibility pop
