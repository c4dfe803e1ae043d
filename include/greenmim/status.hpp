//! \file status.hpp
//! Status codes returned by every host-side planning and index-building function
//! (CUTLASS `Status` style), a message function, and an optional throwing wrapper.
#pragma once

#include <stdexcept>
#include <string>

namespace greenmim {

enum class status : int {
  success = 0,
  invalid_argument,     //!< a scalar argument is out of its domain (G <= 0, p <= 0, ratio outside [0,1], ...)
  empty_input,          //!< nothing to work on (no windows, no visible tokens) where something is required
  size_exceeds_group,   //!< a window has more tokens than the group size
  shape_mismatch,       //!< extents or strides of views disagree
  out_of_range,         //!< an index or coordinate lies outside its domain
  not_covered,          //!< a plan or index does not cover every window/token exactly once
  misaligned,           //!< a mask breaks the mask-unit alignment needed by patch merging
  overflow,             //!< a size or count does not fit the index type
  workspace_too_small,  //!< caller-provided storage is smaller than required
};

//! Human-readable name of a status code. Never returns null.
inline const char* status_string(status s) noexcept {
  switch (s) {
    case status::success: return "success";
    case status::invalid_argument: return "invalid argument";
    case status::empty_input: return "empty input";
    case status::size_exceeds_group: return "a window is larger than the group size";
    case status::shape_mismatch: return "shape or stride mismatch";
    case status::out_of_range: return "index or coordinate out of range";
    case status::not_covered: return "plan/index does not cover every window exactly once";
    case status::misaligned: return "mask is not aligned to the mask unit";
    case status::overflow: return "size overflows the index type";
    case status::workspace_too_small: return "workspace too small";
  }
  return "unknown status";
}

//! Exception thrown by the optional throwing wrappers (`greenmim::check`).
class error : public std::runtime_error {
 public:
  explicit error(status s, const std::string& what = {})
      : std::runtime_error(what.empty() ? std::string(status_string(s))
                                        : std::string(status_string(s)) + ": " + what),
        code_(s) {}
  status code() const noexcept { return code_; }

 private:
  status code_;
};

//! Throws `greenmim::error` unless `s == status::success`.
inline void check(status s, const std::string& what = {}) {
  if (s != status::success) throw error(s, what);
}

}  // namespace greenmim
