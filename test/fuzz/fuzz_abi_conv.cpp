// fuzz_abi, convolution family: gm_depthwise_conv_fwd / _bwd (+ can_implement, workspace size)
// and gm_block_conv_fwd / _bwd (+ can_implement, workspace sizes). Each input draws a small call (features
// [B <= 2, N <= 40, C <= 24], block conv with s <= 4), a table whose entries are mostly valid
// tokens and sometimes out of range (documented to read as zero), then mutates the tensors
// (extents, strides, ranks, null / misaligned / aliased data), the bare pointers (table,
// weight, bias, dweight, dbias: null, misaligned, aliased), dtype, kernel / stride, residual and
// the workspace. The bare arrays are sized from the final arguments as kernels.h documents them
// (nbr [N, 9], weight [C, 9] or [C_out, C_in, s, s], ...), so an accepted call runs on buffers of
// exactly its documented footprint. Invariants: fuzz_abi.cpp.
#include <greenmim/kernels.h>

#include "fuzz_abi_util.hpp"

#include <cstdint>
#include <limits>
#include <vector>

using namespace gm_fuzz_abi;

namespace {

enum : int { X, Y, DY, DX, TABLE, W, BIAS, DW, DBIAS, NUM_ARGS };

struct conv_call {
  bool block = false, backward = false;
  gm_dtype dt = GM_FLOAT32;
  std::int32_t kernel = 3;    // depthwise: kernel; block conv: stride s
  std::int32_t residual = 1;  // depthwise only
  std::vector<desc> d = std::vector<desc>(NUM_ARGS);
  std::vector<std::int32_t> table;
  std::int64_t work = 0;      // emulated threads x reduction steps of an accepted run (bounded below)

  std::vector<std::size_t> elem_sizes() const {
    const std::size_t e = elem_bytes(dt);
    return {e, e, e, e, 4, 4, 4, 4, 4};
  }
  std::vector<desc*> ptrs() {
    std::vector<desc*> p;
    for (auto& x : d) p.push_back(&x);
    return p;
  }

  // Lengths of the bare arrays for the final arguments (kernels.h); an absurd length makes the
  // array unplaceable, and then the call is only checked, never run.
  void size_arrays() {
    auto len = [](std::int64_t a, std::int64_t b, std::int64_t c = 1) -> std::int64_t {
      if (a < 0 || b < 0 || c < 0 || a > (1 << 20) || b > (1 << 20) || c > (1 << 20)) return std::int64_t{1} << 21;
      const std::int64_t n = a * b * c;
      return n > (1 << 20) ? std::int64_t{1} << 21 : n;
    };
    const gm_tensor& x = d[X].t;
    const gm_tensor& out = backward ? d[DY].t : d[Y].t;
    const std::int64_t N = x.extent[1], C = x.extent[2];
    if (!block) {
      d[TABLE].t.extent[0] = len(N, 9);
      d[W].t.extent[0] = d[DW].t.extent[0] = len(C, 9);
      d[BIAS].t.extent[0] = d[DBIAS].t.extent[0] = len(C, 1);
      work = len(x.extent[0], N, C);
      return;
    }
    const std::int64_t P = len(kernel, kernel), Nn = out.extent[1], Co = out.extent[2];
    d[TABLE].t.extent[0] = len(Nn, P);
    d[W].t.extent[0] = d[DW].t.extent[0] = len(Co, C, P);
    d[BIAS].t.extent[0] = d[DBIAS].t.extent[0] = len(Co, 1);
    // the tiled GEMMs: (M / 64) x (N / 64) CTAs of 256 threads, K / 16 steps each
    const std::int64_t M = len(x.extent[0], Nn), K = len(P, C);
    work = len((M + 63) / 64 * ((Co + 63) / 64 + (K + 63) / 64), (K + Co + 15) / 16, 256);
  }

  void scalars(FuzzedDataProvider& in) {
    switch (in.ConsumeIntegralInRange<int>(0, 3)) {
      case 0: dt = static_cast<gm_dtype>(in.ConsumeBool() ? in.ConsumeIntegral<std::int32_t>() : in.ConsumeIntegralInRange<int>(-1, 3)); break;
      case 1: kernel = gm_fuzz::size_like(in, 9); break;
      case 2: kernel = in.ConsumeIntegralInRange<std::int32_t>(-1, 6); break;
      default: residual = in.ConsumeIntegral<std::int32_t>(); break;
    }
  }

  gm_depthwise_conv_args dw_args() const {
    gm_depthwise_conv_args a{};
    a.dtype = dt;
    a.x = d[X].t, a.y = d[Y].t, a.dy = d[DY].t, a.dx = d[DX].t;
    a.nbr = static_cast<const std::int32_t*>(d[TABLE].t.data);
    a.kernel = kernel;
    a.weight = static_cast<const float*>(d[W].t.data);
    a.bias = static_cast<const float*>(d[BIAS].t.data);
    a.dweight = static_cast<float*>(d[DW].t.data);
    a.dbias = static_cast<float*>(d[DBIAS].t.data);
    a.residual = residual;
    return a;
  }
  gm_block_conv_args block_args() const {
    gm_block_conv_args a{};
    a.dtype = dt;
    a.x = d[X].t, a.y = d[Y].t, a.dy = d[DY].t, a.dx = d[DX].t;
    a.gather = static_cast<const std::int32_t*>(d[TABLE].t.data);
    a.stride = kernel;
    a.weight = static_cast<const float*>(d[W].t.data);
    a.bias = static_cast<const float*>(d[BIAS].t.data);
    a.dweight = static_cast<float*>(d[DW].t.data);
    a.dbias = static_cast<float*>(d[DBIAS].t.data);
    return a;
  }

  //! Whether the call takes a workspace (the depthwise backward, both block convs).
  bool has_workspace() const { return block || backward; }
  //! The call's workspace_size.
  cudaError_t workspace_size(std::size_t* bytes) const {
    if (!block) {
      const gm_depthwise_conv_args a = dw_args();
      return gm_depthwise_conv_bwd_workspace_size(&a, bytes);
    }
    const gm_block_conv_args a = block_args();
    return backward ? gm_block_conv_bwd_workspace_size(&a, bytes) : gm_block_conv_fwd_workspace_size(&a, bytes);
  }

  //! can_implement of this call (and, where it takes a workspace, workspace_size agreeing with it).
  cudaError_t can() const {
    cudaError_t c;
    if (block) {
      const gm_block_conv_args a = block_args();
      c = backward ? gm_block_conv_bwd_can_implement(&a) : gm_block_conv_fwd_can_implement(&a);
    } else {
      const gm_depthwise_conv_args a = dw_args();
      c = backward ? gm_depthwise_conv_bwd_can_implement(&a) : gm_depthwise_conv_fwd_can_implement(&a);
    }
    if (has_workspace()) {
      std::size_t bytes = 0;
      const cudaError_t w = workspace_size(&bytes);
      GM_FUZZ_CHECK(w == c, "%s: can_implement %d but workspace_size %d", block ? "block conv" : "depthwise bwd",
                    static_cast<int>(c), static_cast<int>(w));
      GM_FUZZ_CHECK(workspace_size(nullptr) == cudaErrorInvalidValue && gm_last_refusal()[0] != '\0',
                    "%s: a null bytes pointer was accepted", block ? "block conv" : "depthwise bwd");
    }
    GM_FUZZ_CHECK(c == cudaSuccess || c == cudaErrorInvalidValue, "conv can_implement returned %d", static_cast<int>(c));
    GM_FUZZ_CHECK(c == cudaSuccess || gm_last_refusal()[0] != '\0', "conv: refusal without a reason");
    return c;
  }

  //! The entry point. Its workspace (where it takes one): exact, one byte short, misaligned or
  //! null (`ws_kind` 0..3), from `mem` when real, a fake address otherwise. `bad_ws` = the
  //! workspace alone must make the call fail.
  cudaError_t run(int ws_kind, device_memory* mem, bool& bad_ws) const {
    bad_ws = false;
    if (!has_workspace()) {
      const gm_depthwise_conv_args a = dw_args();
      return gm_depthwise_conv_fwd(&a, nullptr);
    }
    std::size_t bytes = 0;
    if (workspace_size(&bytes) != cudaSuccess) bytes = 1024;
    std::size_t give = bytes, shift = 0;
    if (ws_kind == 1 && bytes > 0) give = bytes - 1, bad_ws = true;
    if (ws_kind == 2 && bytes > 0) shift = 4, bad_ws = true;  // float-aligned, not 16-byte aligned
    char* ws = mem ? static_cast<char*>(mem->alloc(give + shift)) : fake_address(14);
    if (ws_kind == 3) ws = nullptr, bad_ws = bytes > 0;
    void* w = ws ? ws + shift : nullptr;
    if (!block) {
      const gm_depthwise_conv_args a = dw_args();
      return gm_depthwise_conv_bwd(&a, w, give, nullptr);
    }
    const gm_block_conv_args a = block_args();
    return backward ? gm_block_conv_bwd(&a, w, give, nullptr) : gm_block_conv_fwd(&a, w, give, nullptr);
  }
};

std::int32_t table_entry(FuzzedDataProvider& in, std::int64_t n) {
  switch (in.ConsumeIntegralInRange<int>(0, 15)) {
    case 0: return in.ConsumeIntegral<std::int32_t>();  // anything: outside [0, N) reads as zero
    case 1: return static_cast<std::int32_t>(n);
    case 2: return -1;
    default: return n > 0 ? in.ConsumeIntegralInRange<std::int32_t>(0, static_cast<std::int32_t>(n - 1)) : -1;
  }
}

const char* name(const conv_call& c) {
  if (c.block) return c.backward ? "block_conv_bwd" : "block_conv_fwd";
  return c.backward ? "depthwise_conv_bwd" : "depthwise_conv_fwd";
}

}  // namespace

namespace gm_fuzz_abi {

void fuzz_conv_family(FuzzedDataProvider& in, bool block) {
  conv_call c;
  c.block = block;
  c.backward = in.ConsumeBool();
  c.dt = static_cast<gm_dtype>(in.ConsumeIntegralInRange<int>(0, 2));
  const std::int64_t B = in.ConsumeIntegralInRange<int>(0, 2), N = in.ConsumeIntegralInRange<int>(0, 40);
  std::int64_t Ci, Co, Nn, taps;
  if (!block) {
    Ci = Co = in.ConsumeBool() ? 8 * in.ConsumeIntegralInRange<int>(0, 3) : in.ConsumeIntegralInRange<int>(0, 24);
    Nn = N;
    taps = 9;
    c.residual = in.ConsumeBool();
  } else {
    c.kernel = in.ConsumeIntegralInRange<int>(1, 4);
    Ci = in.ConsumeIntegralInRange<int>(0, 12), Co = in.ConsumeIntegralInRange<int>(0, 12);
    Nn = in.ConsumeIntegralInRange<int>(0, 12);
    taps = static_cast<std::int64_t>(c.kernel) * c.kernel;
  }
  c.d[X] = desc{X, 0, dense({B, N, Ci})};
  c.d[DX] = desc{DX, 0, dense({B, N, Ci})};
  c.d[Y] = desc{Y, 0, dense({B, Nn, Co})};
  c.d[DY] = desc{DY, 0, dense({B, Nn, Co})};
  c.d[TABLE] = array(TABLE, 0);
  c.d[W] = array(W, 0);
  c.d[BIAS] = array(in.ConsumeBool() ? BIAS : -1, 0);
  c.d[DW] = array(c.backward && in.ConsumeBool() ? DW : -1, 0);
  c.d[DBIAS] = array(c.backward && in.ConsumeBool() ? DBIAS : -1, 0);
  c.table.resize(static_cast<std::size_t>(Nn * taps));
  for (auto& t : c.table) t = table_entry(in, N);
  const int ws_kind = in.ConsumeIntegralInRange<int>(0, 5);  // 4, 5: exact

  const int n = in.ConsumeIntegralInRange<int>(0, 4);
  for (int i = 0; i < n; ++i) {
    const int target = in.ConsumeIntegralInRange<int>(0, NUM_ARGS);
    if (target < NUM_ARGS) mutate(in, c.d[static_cast<std::size_t>(target)]);
    else c.scalars(in);
  }
  c.size_arrays();
  const std::vector<std::size_t> elem = c.elem_sizes();
  const char* what = name(c);

  {  // no arguments at all
    const std::uint64_t before = gm_emu::blocks_run();
    if (block) {
      GM_FUZZ_CHECK(gm_block_conv_fwd_can_implement(nullptr) == cudaErrorInvalidValue &&
                        refused_cleanly(c.backward ? gm_block_conv_bwd(nullptr, nullptr, 0, nullptr)
                                                   : gm_block_conv_fwd(nullptr, nullptr, 0, nullptr),
                                        before),
                    "block conv: null args");
    } else {
      GM_FUZZ_CHECK(gm_depthwise_conv_bwd_can_implement(nullptr) == cudaErrorInvalidValue &&
                        refused_cleanly(c.backward ? gm_depthwise_conv_bwd(nullptr, nullptr, 0, nullptr)
                                                   : gm_depthwise_conv_fwd(nullptr, nullptr),
                                        before),
                    "depthwise conv: null args");
    }
  }

  // pass 1: fake pointers, checks only; a refusal must come before any launch or access
  {
    device_memory none;
    place(c.ptrs(), elem, false, none);
    if (c.can() != cudaSuccess) {
      if (verbose()) std::fprintf(stderr, "refused %s: %s\n", what, gm_last_refusal());
      const std::uint64_t before = gm_emu::blocks_run();
      bool bad_ws = false;
      const cudaError_t e = c.run(ws_kind, nullptr, bad_ws);
      GM_FUZZ_CHECK(refused_cleanly(e, before), "%s: can_implement refused but the entry returned %d (%s)", what,
                    static_cast<int>(e), gm_last_refusal());
      return;
    }
  }
  // pass 2: accepted, on real memory of exactly the documented sizes
  if (c.work > (std::int64_t{1} << 22)) return;  // too slow to emulate in a fuzzing loop
  device_memory mem;
  if (!place(c.ptrs(), elem, true, mem)) return;
  upload(c.d[TABLE], c.table);
  const std::uint64_t before = gm_emu::blocks_run();
  bool bad_ws = false;
  if (c.can() != cudaSuccess) {  // real addresses can differ in alignment / overlap from the fakes
    const cudaError_t e = c.run(ws_kind, &mem, bad_ws);
    GM_FUZZ_CHECK(refused_cleanly(e, before), "%s: can_implement refused (real memory) but the entry returned %d", what,
                  static_cast<int>(e));
    return;
  }
  if (verbose()) {
    std::fprintf(stderr, "running %s: dtype %d kernel/stride %d residual %d ws %d\n", what, static_cast<int>(c.dt),
                 c.kernel, c.residual, ws_kind);
    print_descs(c.ptrs());
  }
  const cudaError_t e = c.run(ws_kind, &mem, bad_ws);
  if (bad_ws) {
    GM_FUZZ_CHECK(refused_cleanly(e, before), "%s: a bad workspace (kind %d) was not refused: %d", what, ws_kind,
                  static_cast<int>(e));
    return;
  }
  check_ran(e, what);
}

}  // namespace gm_fuzz_abi
