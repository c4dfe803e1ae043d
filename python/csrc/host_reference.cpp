//! \file host_reference.cpp
//! The C ABI of greenmim_host.h, the CPU reference attention (gmh_attention_fwd / _bwd): views
//! from the plain structs, then include/greenmim/reference/attention.hpp.
#include "host_common.hpp"

#include <greenmim/reference/attention.hpp>

using namespace greenmim;
using namespace greenmim::host;

namespace {

partition_view to_partition(const gmh_partition& p) {
  return partition_view{p.gather, p.scatter, p.slot_window, p.slot_coord, p.group_size, p.num_groups, p.num_tokens};
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

}  // namespace

extern "C" {

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

}  // extern "C"
