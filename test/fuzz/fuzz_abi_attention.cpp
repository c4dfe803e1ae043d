// fuzz_abi, attention and partition family: gm_attention_fwd / gm_attention_bwd (+ can_implement,
// workspace size) and gm_partition_tokens / gm_unpartition_tokens (+ can_implement). Each input
// builds a small, valid problem (keep mask -> windows -> plan -> partition indices), then mutates
// its gm_*_args: extents, strides, ranks, null / misaligned / aliased pointers, out-of-range enum
// values, window, partition sizes, workspace size and alignment. Invariants (fuzz_abi.cpp):
// refusals before any launch with a reason, the entry refuses what can_implement refuses (the
// partition entries check their own direction only), accepted arguments run without a fault.
// Sizes stay tiny (G <= 64, N <= 64, C <= 40) so that accepted cases run in milliseconds.
#include <greenmim/greenmim.hpp>
#include <greenmim/kernels.h>

#include "fuzz_abi_util.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace greenmim;
using namespace gm_fuzz_abi;

namespace {

struct problem {
  index_t B = 1, N = 0, H = 1, D = 32, window = 1;
  partition_indices pi;
};

bool make_problem(FuzzedDataProvider& in, problem& p) {
  const index_t h = in.ConsumeIntegralInRange<index_t>(1, 8), w = in.ConsumeIntegralInRange<index_t>(1, 8);
  const index_t win = in.ConsumeIntegralInRange<index_t>(1, 4);
  const window_geometry g = make_window_geometry(h, w, win, in.ConsumeBool() ? win / 2 : 0);
  std::vector<index_t> coords;
  for (index_t r = 0; r < h; ++r)
    for (index_t c = 0; c < w; ++c)
      if (in.ConsumeIntegralInRange<int>(0, 3) != 0) coords.push_back(pack_coord(r, c));
  if (coords.empty()) return false;
  window_list l;
  if (build_windows(g, span<const index_t>(coords), l) != status::success) return false;
  const auto sizes = l.sizes();
  planner_options o;
  o.strat = in.ConsumeBool() ? strategy::fast : strategy::per_window;
  plan pl;
  if (make_plan(span<const index_t>(sizes), o, 64, pl) != status::success) return false;
  if (build_partition(pl, l, p.pi) != status::success) return false;
  p.B = in.ConsumeIntegralInRange<index_t>(1, 2);
  p.N = l.num_tokens;
  p.H = in.ConsumeIntegralInRange<index_t>(1, 2);
  p.D = in.ConsumeBool() ? 32 : 64;
  p.window = g.window;
  return true;
}

gm_partition device_part(const partition_indices& pi, device_memory& mem, bool real) {
  gm_partition p{};
  p.group_size = pi.group_size;
  p.num_groups = pi.num_groups;
  p.num_tokens = pi.num_tokens;
  if (!real) {  // fake addresses far from the tensors'
    p.gather = reinterpret_cast<const std::int32_t*>(std::uintptr_t{20} << 36);
    p.scatter = reinterpret_cast<const std::int32_t*>(std::uintptr_t{21} << 36);
    p.slot_window = reinterpret_cast<const std::int32_t*>(std::uintptr_t{22} << 36);
    p.slot_coord = reinterpret_cast<const std::int32_t*>(std::uintptr_t{23} << 36);
    return p;
  }
  p.gather = static_cast<const std::int32_t*>(mem.alloc(pi.gather.size() * 4, pi.gather.data()));
  p.scatter = static_cast<const std::int32_t*>(mem.alloc(pi.scatter.size() * 4, pi.scatter.data()));
  p.slot_window = static_cast<const std::int32_t*>(mem.alloc(pi.slot_window.size() * 4, pi.slot_window.data()));
  p.slot_coord = static_cast<const std::int32_t*>(mem.alloc(pi.slot_coord.size() * 4, pi.slot_coord.data()));
  return p;
}

// Mutations of the partition's scalars and pointers; returns true when the partition is still
// the real one (only then may an accepted call run on real memory).
bool mutate_part(FuzzedDataProvider& in, gm_partition& p) {
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0: p.gather = nullptr; return false;
    case 1: p.scatter = nullptr; return false;
    case 2: p.slot_window = nullptr; return false;
    case 3: p.slot_coord = nullptr; return true;  // allowed without a bias
    case 4: p.group_size = in.ConsumeIntegral<std::int32_t>(); return false;
    case 5: p.num_groups = in.ConsumeIntegral<std::int32_t>(); return false;
    case 6: p.num_tokens = in.ConsumeIntegral<std::int32_t>(); return false;
    default: p.group_size = in.ConsumeIntegralInRange<std::int32_t>(-1, 2000); return false;
  }
}

template <class Args, class Place, class Check, class Run>
void exercise(FuzzedDataProvider& in, const problem& pb, Args base, std::vector<desc*> tensors,
              Place&& finish, Check&& can, Run&& run, const char* what) {
  (void)base;
  // mutations
  const int n = in.ConsumeIntegralInRange<int>(0, 4);
  for (int i = 0; i < n; ++i) {
    const int target = in.ConsumeIntegralInRange<int>(0, static_cast<int>(tensors.size()) + 2);
    if (target < static_cast<int>(tensors.size())) mutate(in, *tensors[target]);
    else if (target == static_cast<int>(tensors.size())) finish.scalars(in);
    else finish.part_mutation = true;
  }
  const std::vector<std::size_t> elem = finish.elem_sizes();
  // pass 1: fake pointers, checks only
  {
    device_memory none;
    place(tensors, elem, false, none);
    auto a = finish.args(none, false, in);
    const cudaError_t c = can(&a);
    GM_FUZZ_CHECK(c == cudaSuccess || c == cudaErrorInvalidValue, "%s can_implement returned %d", what, static_cast<int>(c));
    if (c != cudaSuccess && finish.run_may_accept) {
      // gm_partition_tokens checks its own direction only: it may accept (and launch) what
      // can_implement refuses, so it is called on real memory below, never on fake pointers
      GM_FUZZ_CHECK(gm_last_refusal()[0] != '\0', "%s: refusal without a reason", what);
    } else if (c != cudaSuccess) {
      GM_FUZZ_CHECK(gm_last_refusal()[0] != '\0', "%s: refusal without a reason", what);
      if (verbose()) std::fprintf(stderr, "refused %s: %s\n", what, gm_last_refusal());
      const std::uint64_t before = gm_emu::blocks_run();
      const cudaError_t e = run(&a, nullptr, false);
      GM_FUZZ_CHECK(refused_cleanly(e, before) || finish.run_may_accept, "%s: can_implement refused (%s) but the entry returned %d",
                    what, gm_last_refusal(), static_cast<int>(e));
      return;
    }
  }
  // pass 2: accepted, on real memory, when the descriptors describe memory we can allocate
  if (finish.part_mutation && !finish.part_still_real) return;  // index arrays no longer match their sizes
  device_memory mem;
  if (!place(tensors, elem, true, mem)) return;
  auto a = finish.args(mem, true, in);
  const std::uint64_t before = gm_emu::blocks_run();
  if (can(&a) != cudaSuccess) {  // real addresses can differ in alignment/overlap from the fakes
    if (!finish.run_may_accept) return;
    const cudaError_t e = run(&a, &mem, true);  // one direction's check: a refusal is clean, an acceptance runs
    GM_FUZZ_CHECK(e == cudaSuccess || refused_cleanly(e, before), "%s: %d (%s)", what, static_cast<int>(e),
                  gm_last_refusal());
    return;
  }
  if (verbose()) {  // replaying one input: what is about to run
    std::fprintf(stderr, "running %s: G %d groups %d tokens %d\n", what, a.part.group_size, a.part.num_groups,
                 a.part.num_tokens);
    print_descs(tensors);
  }
  check_ran(run(&a, &mem, true), what);
}

// ---- the three argument structs --------------------------------------------------------------
void fuzz_partition(FuzzedDataProvider& in, const problem& pb) {
  const std::int64_t C = in.ConsumeIntegralInRange<int>(1, 40);
  gm_dtype dt = static_cast<gm_dtype>(in.ConsumeIntegralInRange<int>(0, 2));
  desc x{0, 0, dense({pb.B, pb.N, C})}, y{1, 0, dense({pb.B, static_cast<std::int64_t>(pb.pi.num_slots()), C})};
  struct fin {
    const problem& pb;
    gm_dtype& dt;
    desc &x, &y;
    bool part_mutation = false, run_may_accept = true;  // the entry checks one direction only
    std::vector<std::size_t> elem_sizes() const { return {elem_bytes(dt), elem_bytes(dt)}; }
    gm_partition part_override{};
    bool have_override = false, part_still_real = true;
    void scalars(FuzzedDataProvider& in) {
      dt = in.ConsumeBool() ? static_cast<gm_dtype>(in.ConsumeIntegral<std::int32_t>()) : static_cast<gm_dtype>(in.ConsumeIntegralInRange<int>(-1, 3));
    }
    gm_partition_args args(device_memory& mem, bool real, FuzzedDataProvider& in) {
      gm_partition_args a{};
      a.dtype = dt;
      a.x = x.t;
      a.y = y.t;
      a.part = device_part(pb.pi, mem, real);
      if (part_mutation) {
        if (!have_override) { part_override = a.part; part_still_real = mutate_part(in, part_override); have_override = true; }
        if (!real) a.part = part_override;
      }
      return a;
    }
  } f{pb, dt, x, y};
  const bool un = in.ConsumeBool();
  exercise(in, pb, 0, {&x, &y}, f, [](const gm_partition_args* a) { return gm_partition_can_implement(a); },
           [un](const gm_partition_args* a, device_memory*, bool) { return un ? gm_unpartition_tokens(a, nullptr) : gm_partition_tokens(a, nullptr); },
           un ? "unpartition" : "partition");
}

struct attn_fin {
  const problem& pb;
  std::vector<desc>& d;
  gm_dtype& dt;
  gm_algo& algo;
  index_t& window;
  float& scale;
  bool backward;
  bool part_mutation = false, run_may_accept = false;
  std::vector<std::size_t> elem_sizes() const {  // q k v o d_o lse bias dq dk dv dbias
    const std::size_t e = elem_bytes(dt);
    return {e, e, e, e, e, 4, 4, e, e, e, 4};
  }
  gm_partition part_override{};
  bool have_override = false, part_still_real = true;
  void scalars(FuzzedDataProvider& in) {
    switch (in.ConsumeIntegralInRange<int>(0, 4)) {
      case 0: dt = static_cast<gm_dtype>(in.ConsumeIntegral<std::int32_t>()); break;
      case 1: algo = static_cast<gm_algo>(in.ConsumeIntegral<std::int32_t>()); break;
      case 2: algo = static_cast<gm_algo>(in.ConsumeIntegralInRange<int>(0, 2)); break;
      case 3: window = in.ConsumeIntegralInRange<index_t>(-1, 40); break;
      default: scale = in.ConsumeFloatingPoint<float>(); break;
    }
  }
  template <class A>
  void common(A& a, device_memory& mem, bool real, FuzzedDataProvider& in) {
    a.dtype = dt;
    a.q = d[0].t, a.k = d[1].t, a.v = d[2].t, a.o = d[3].t, a.lse = d[5].t, a.bias_table = d[6].t;
    a.part = device_part(pb.pi, mem, real);
    if (part_mutation) {
      if (!have_override) { part_override = a.part; part_still_real = mutate_part(in, part_override); have_override = true; }
      if (!real) a.part = part_override;
      else if (part_override.slot_coord == nullptr) a.part.slot_coord = nullptr;
    }
    a.window = window;
    a.scale = scale;
    a.algo = algo;
  }
  gm_attention_bwd_args args(device_memory& mem, bool real, FuzzedDataProvider& in) {
    gm_attention_bwd_args a{};
    common(a, mem, real, in);
    a.d_o = d[4].t, a.dq = d[7].t, a.dk = d[8].t, a.dv = d[9].t, a.d_bias_table = d[11].t;
    return a;
  }
};

struct fwd_fin : attn_fin {
  std::vector<std::size_t> elem_sizes() const {  // q k v o lse bias
    const std::size_t e = elem_bytes(dt);
    return {e, e, e, e, 4, 4};
  }
  gm_attention_fwd_args args(device_memory& mem, bool real, FuzzedDataProvider& in) {
    gm_attention_fwd_args a{};
    common(a, mem, real, in);
    return a;
  }
};

void fuzz_attention(FuzzedDataProvider& in, const problem& pb, bool backward) {
  const std::int64_t B = pb.B, N = pb.N, H = pb.H, D = pb.D, p = pb.window, R = (2 * p - 1) * (2 * p - 1);
  gm_dtype dt = static_cast<gm_dtype>(in.ConsumeIntegralInRange<int>(0, 2));
  gm_algo algo = static_cast<gm_algo>(in.ConsumeIntegralInRange<int>(0, 2));
  index_t window = static_cast<index_t>(p);
  float scale = 0.f;
  const bool bias = in.ConsumeBool();
  std::vector<desc> d(12);
  for (int i = 0; i < 12; ++i) d[i] = desc{i, 0, dense({B, N, H, D})};
  d[5] = desc{5, 0, dense({B, N, H})};                            // lse
  d[6] = desc{bias ? 6 : -1, 0, dense({R, H})};                   // bias table
  d[11] = desc{bias && in.ConsumeBool() ? 11 : -1, 0, dense({R, H})};  // d_bias_table
  // fwd: q k v o lse bias = 0 1 2 3 5 6; bwd adds d_o 4, dq 7, dk 8, dv 9, dbias 11
  attn_fin f{pb, d, dt, algo, window, scale, backward};
  if (!backward) {
    fwd_fin ff{f};
    exercise(in, pb, 0, {&d[0], &d[1], &d[2], &d[3], &d[5], &d[6]}, ff,
             [](const gm_attention_fwd_args* a) { return gm_attention_fwd_can_implement(a); },
             [](const gm_attention_fwd_args* a, device_memory*, bool) { return gm_attention_fwd(a, nullptr); }, "fwd");
    return;
  }
  const int ws_kind = in.ConsumeIntegralInRange<int>(0, 5);
  exercise(in, pb, 0, {&d[0], &d[1], &d[2], &d[3], &d[4], &d[5], &d[6], &d[7], &d[8], &d[9], &d[11]}, f,
           [](const gm_attention_bwd_args* a) {
             std::size_t bytes = 0;
             const cudaError_t c = gm_attention_bwd_can_implement(a);
             const cudaError_t w = gm_attention_bwd_workspace_size(a, &bytes);
             GM_FUZZ_CHECK(c == w, "bwd can_implement %d but workspace_size %d", static_cast<int>(c), static_cast<int>(w));
             GM_FUZZ_CHECK(gm_attention_bwd_workspace_size(a, nullptr) == cudaErrorInvalidValue, "null bytes pointer accepted");
             return c;
           },
           [ws_kind](const gm_attention_bwd_args* a, device_memory* mem, bool real) {
             std::size_t bytes = 0;
             if (gm_attention_bwd_workspace_size(a, &bytes) != cudaSuccess) bytes = 1024;
             std::size_t give = bytes;
             std::uintptr_t shift = 0;
             if (ws_kind == 1 && bytes > 0) give = bytes - 1;   // too small: refused
             if (ws_kind == 2) shift = 16;                      // misaligned: refused
             void* ws = nullptr;
             if (real) ws = mem->alloc(give + shift + 256);
             else ws = reinterpret_cast<void*>(std::uintptr_t{30} << 36);
             void* w = static_cast<char*>(ws) + shift;
             if (ws_kind == 3) w = nullptr;
             const std::uint64_t before = gm_emu::blocks_run();
             const cudaError_t e = gm_attention_bwd(a, w, give, nullptr);
             const bool bad_ws = (ws_kind == 1 && bytes > 0) || ws_kind == 2 || (ws_kind == 3 && bytes > 0);
             if (bad_ws && real) {
               GM_FUZZ_CHECK(refused_cleanly(e, before), "bwd: a bad workspace (kind %d) was not refused: %d", ws_kind,
                             static_cast<int>(e));
               return cudaSuccess;
             }
             return e;
           },
           "bwd");
}

}  // namespace

namespace gm_fuzz_abi {

void fuzz_attention_family(FuzzedDataProvider& in, int which) {
  problem pb;
  if (!make_problem(in, pb)) return;
  if (pb.pi.group_size > 64) return;
  if (which == 0 || which == 3) fuzz_partition(in, pb);
  else fuzz_attention(in, pb, which == 2);
}

}  // namespace gm_fuzz_abi
