// fuzz_abi, device-side index building: gm_select_visible, gm_token_windows, gm_build_partition.
// Each input draws small scalars (masks, grid, geometry, capacity; tokens, windows, G, groups),
// mutates them (gm_fuzz::size_like: boundaries, anything), mutates the pointers (null,
// misaligned, aliased) and the CUB-style temporary storage (size query, exact, one byte short,
// misaligned, null size pointer), and fills the device inputs with mostly consistent and
// sometimes arbitrary contents (positions, counts, token windows, window groups and slot
// offsets: the kernels document what they drop; window sizes stay small, as gm_token_windows
// writes them). Every array is an emulated cudaMalloc of exactly the length kernels.h gives for
// the final scalars; scalars too large for that are checked with null pointers only (then an
// acceptance must not touch memory). Invariants (fuzz_abi.cpp), plus: a refused call leaves
// every buffer as it was, a size query launches nothing.
#include <greenmim/geometry.hpp>
#include <greenmim/kernels.h>

#include "fuzz_abi_util.hpp"

#include <cstdint>
#include <vector>

using namespace gm_fuzz_abi;

namespace {

constexpr std::int64_t k_max_elems = 1 << 14;  // per array, for an emulated run

//! n elements of `bytes` each, or -1 when n is not a length we allocate.
std::int64_t length(std::int64_t n) { return n >= 0 && n <= k_max_elems ? n : -1; }

//! Small, sometimes boundary, sometimes anything.
std::int32_t scalar(FuzzedDataProvider& in, std::int32_t typical) {
  return in.ConsumeBool() ? typical : gm_fuzz::size_like(in, 64);
}

struct tmp_request {
  int kind = 0;  // 0: query only, 1/5: exact, 2: one byte short, 3: misaligned by 16, 4: null size pointer
};

//! Arrays placed on real memory (exactly sized) or all null.
struct arrays {
  std::vector<desc> d;
  std::vector<std::size_t> elem;
  bool real = false;
  std::vector<desc*> ptrs() {
    std::vector<desc*> p;
    for (auto& x : d) p.push_back(&x);
    return p;
  }
  template <class T = std::int32_t>
  T* ptr(int i) const { return static_cast<T*>(d[static_cast<std::size_t>(i)].t.data); }
  //! Places the arrays (lengths already set, -1 = too long): real when every length fits.
  void place_all(device_memory& mem) {
    real = true;
    for (auto& x : d)
      if (x.t.extent[0] < 0) real = false;
    if (real) real = place(ptrs(), elem, true, mem);
    if (!real)
      for (auto& x : d) x.t.data = nullptr;
  }
};

void mutate_pointers(FuzzedDataProvider& in, arrays& a) {
  const int n = in.ConsumeIntegralInRange<int>(0, 2);
  for (int i = 0; i < n; ++i) mutate_pointer(in, a.d[in.ConsumeIntegralInRange<std::size_t>(0, a.d.size() - 1)]);
}

//! A refusal: clean, and no buffer changed.
void check_refusal(cudaError_t e, std::uint64_t before, const device_memory& mem,
                   const std::vector<std::vector<unsigned char>>& snap, const char* what) {
  GM_FUZZ_CHECK(refused_cleanly(e, before), "%s: returned %d (%s) with %llu blocks run", what, static_cast<int>(e),
                gm_last_refusal(), static_cast<unsigned long long>(gm_emu::blocks_run() - before));
  GM_FUZZ_CHECK(mem.snapshot() == snap, "%s: refused, but a buffer changed", what);
  if (verbose()) std::fprintf(stderr, "refused %s: %s\n", what, gm_last_refusal());
}

//! The outcome of a call that is not a query: refused cleanly, or (real memory) ran cleanly.
void check_call(cudaError_t e, std::uint64_t before, const device_memory& mem,
                const std::vector<std::vector<unsigned char>>& snap, bool must_refuse, const char* what) {
  if (e != cudaSuccess || must_refuse) return check_refusal(e, before, mem, snap, what);
  check_ran(e, what);
}

// ---- gm_select_visible ---------------------------------------------------------------------
enum : int { MASK, POS, NUM };

void fuzz_select_visible(FuzzedDataProvider& in) {
  std::int32_t masks = scalar(in, in.ConsumeIntegralInRange<int>(0, 3));
  std::int32_t h = scalar(in, in.ConsumeIntegralInRange<int>(1, 12)), w = scalar(in, in.ConsumeIntegralInRange<int>(1, 12));
  tmp_request tmp{in.ConsumeIntegralInRange<int>(0, 5)};
  const bool small = masks >= 0 && h >= 0 && w >= 0 && static_cast<double>(masks) * h * w <= k_max_elems;
  const std::int64_t n = small ? static_cast<std::int64_t>(masks) * h * w : -1;
  arrays a;
  a.d = {array(MASK, n), array(POS, n), array(NUM, 1)};
  a.elem = {1, 4, 4};
  mutate_pointers(in, a);
  const std::uint32_t seed = in.ConsumeIntegral<std::uint32_t>();
  device_memory mem;
  a.place_all(mem);
  if (a.real && n > 0) {
    std::vector<std::uint8_t> mask(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < mask.size(); ++i) mask[i] = static_cast<std::uint8_t>(((i + 1) * (seed | 1) >> 7) % 3);
    upload(a.d[MASK], mask);
  }
  if (verbose()) {
    std::fprintf(stderr, "select_visible: masks %d %d x %d, temp kind %d, real %d\n", masks, h, w, tmp.kind, a.real);
    print_descs(a.ptrs());
  }
  // the size query: never a launch, never an access
  std::size_t bytes = 0;
  std::uint64_t before = gm_emu::blocks_run();
  auto snap = mem.snapshot();
  const cudaError_t q = gm_select_visible(nullptr, &bytes, a.ptr<std::uint8_t>(MASK), masks, h, w, a.ptr(POS),
                                          a.ptr(NUM), nullptr);
  if (q != cudaSuccess) return check_refusal(q, before, mem, snap, "select_visible (query)");
  GM_FUZZ_CHECK(gm_emu::blocks_run() == before && mem.snapshot() == snap, "select_visible: the query did work");
  if (tmp.kind == 0) return;
  std::size_t give = tmp.kind == 2 && bytes > 0 ? bytes - 1 : bytes;
  const std::size_t shift = tmp.kind == 3 ? 16 : 0;  // CUB aligns the storage itself
  void* t = a.real ? mem.alloc(give + shift) : fake_address(15);
  snap = mem.snapshot();
  before = gm_emu::blocks_run();
  const cudaError_t e = gm_select_visible(static_cast<char*>(t) + shift, tmp.kind == 4 ? nullptr : &give,
                                          a.ptr<std::uint8_t>(MASK), masks, h, w, a.ptr(POS), a.ptr(NUM), nullptr);
  const bool must_refuse = (tmp.kind == 2 && bytes > 0) || tmp.kind == 4 || !a.real;
  check_call(e, before, mem, snap, must_refuse, "select_visible");
}

// ---- gm_token_windows -------------------------------------------------------------------------
enum : int { TPOS, TCOUNT, TCOORDS, TWIN, TSIZES };

void fuzz_token_windows(FuzzedDataProvider& in) {
  const std::int32_t masks0 = in.ConsumeIntegralInRange<int>(0, 3);
  const std::int32_t h0 = in.ConsumeIntegralInRange<int>(1, 12), w0 = in.ConsumeIntegralInRange<int>(1, 12);
  const greenmim::window_geometry g0 = greenmim::make_window_geometry(h0, w0, in.ConsumeIntegralInRange<int>(1, 7), 0);
  gm_window_geometry geom{g0.height, g0.width, g0.window, in.ConsumeBool() ? g0.window / 2 : 0};
  if (g0.height <= g0.window && g0.width <= g0.window) geom.shift = 0;
  std::int32_t masks = masks0, capacity = masks0 * h0 * w0;
  const int n = in.ConsumeIntegralInRange<int>(0, 3);
  for (int i = 0; i < n; ++i) switch (in.ConsumeIntegralInRange<int>(0, 5)) {
      case 0: masks = gm_fuzz::size_like(in, 4); break;
      case 1: capacity = gm_fuzz::size_like(in, 64); break;
      case 2: geom.height = gm_fuzz::size_like(in, 16); break;
      case 3: geom.width = gm_fuzz::size_like(in, 16); break;
      case 4: geom.window = gm_fuzz::size_like(in, 8); break;
      default: geom.shift = gm_fuzz::size_like(in, 4); break;
    }
  const greenmim::window_geometry g{geom.height, geom.width, geom.window, geom.shift};
  const std::int64_t nw = g.valid() && masks >= 0 ? length(static_cast<std::int64_t>(masks) * g.num_windows()) : -1;
  const std::int64_t cap = capacity >= 0 ? length(capacity) : -1;
  arrays a;
  a.d = {array(TPOS, cap), array(TCOUNT, 1), array(TCOORDS, cap), array(TWIN, cap), array(TSIZES, nw)};
  a.elem = {4, 4, 4, 4, 4};
  mutate_pointers(in, a);
  // positions: mostly real flat positions, sometimes anything; the count: mostly the capacity
  std::vector<std::int32_t> pos(static_cast<std::size_t>(std::max<std::int64_t>(cap, 0)));
  const double hw_all_d = static_cast<double>(std::max(masks, 0)) * std::max(geom.height, 0) * std::max(geom.width, 0);
  const std::int64_t hw_all = hw_all_d < 2e9 ? static_cast<std::int64_t>(hw_all_d) : std::int64_t{2000000000};
  for (std::size_t i = 0; i < pos.size(); ++i)
    pos[i] = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? gm_fuzz::size_like(in, 64)
                                                       : static_cast<std::int32_t>(hw_all > 0 ? static_cast<std::int64_t>(i) % hw_all : 0);
  const std::vector<std::int32_t> count{in.ConsumeBool() ? capacity : gm_fuzz::size_like(in, 64)};
  device_memory mem;
  a.place_all(mem);
  if (a.real) upload(a.d[TPOS], pos), upload(a.d[TCOUNT], count);
  if (verbose()) {
    std::fprintf(stderr, "token_windows: capacity %d masks %d geometry %d %d %d %d, real %d\n", capacity, masks,
                 geom.height, geom.width, geom.window, geom.shift, a.real);
    print_descs(a.ptrs());
  }
  const auto snap = mem.snapshot();
  const std::uint64_t before = gm_emu::blocks_run();
  const cudaError_t e = gm_token_windows(a.ptr(TPOS), a.ptr(TCOUNT), capacity, masks, geom, a.ptr(TCOORDS), a.ptr(TWIN),
                                         a.ptr(TSIZES), nullptr);
  check_call(e, before, mem, snap, false, "token_windows");
}

// ---- gm_build_partition -----------------------------------------------------------------------
enum : int { COORDS, TOKWIN, WSIZES, WGROUP, WOFF, GATHER, SCATTER, SLOTWIN, SLOTCOORD };

std::int32_t mostly(FuzzedDataProvider& in, std::int32_t lo, std::int32_t hi) {
  if (in.ConsumeIntegralInRange<int>(0, 7) == 0 || hi < lo) return gm_fuzz::size_like(in, 64);
  return in.ConsumeIntegralInRange<std::int32_t>(lo, hi);
}

void fuzz_build_partition(FuzzedDataProvider& in) {
  std::int32_t N = in.ConsumeIntegralInRange<int>(0, 64), nw = in.ConsumeIntegralInRange<int>(0, 16);
  std::int32_t G = in.ConsumeIntegralInRange<int>(1, 16), ng = in.ConsumeIntegralInRange<int>(0, 8);
  // contents for the drawn sizes
  std::vector<std::int32_t> tokwin(static_cast<std::size_t>(N)), coords(static_cast<std::size_t>(N));
  std::vector<std::int32_t> sizes(static_cast<std::size_t>(nw), 0), group(static_cast<std::size_t>(nw)),
      off(static_cast<std::size_t>(nw));
  for (std::size_t t = 0; t < tokwin.size(); ++t) {
    tokwin[t] = mostly(in, 0, nw - 1);
    coords[t] = static_cast<std::int32_t>(t);
    if (tokwin[t] >= 0 && tokwin[t] < nw) ++sizes[static_cast<std::size_t>(tokwin[t])];
  }
  for (std::size_t w = 0; w < sizes.size(); ++w) {
    if (in.ConsumeIntegralInRange<int>(0, 7) == 0) sizes[w] += in.ConsumeIntegralInRange<int>(-64, 64);
    group[w] = mostly(in, -1, ng - 1);
    off[w] = mostly(in, 0, G - 1);
  }
  tmp_request tmp{in.ConsumeIntegralInRange<int>(0, 5)};
  const int n = in.ConsumeIntegralInRange<int>(0, 3);
  for (int i = 0; i < n; ++i) switch (in.ConsumeIntegralInRange<int>(0, 3)) {
      case 0: N = gm_fuzz::size_like(in, 64); break;
      case 1: nw = gm_fuzz::size_like(in, 16); break;
      case 2: G = gm_fuzz::size_like(in, 16); break;
      default: ng = gm_fuzz::size_like(in, 8); break;
    }
  const std::int64_t tok = N >= 0 ? length(N) : -1, win = nw >= 0 ? length(nw) : -1;
  const std::int64_t slots = G >= 0 && ng >= 0 ? length(static_cast<std::int64_t>(G) * ng) : -1;
  arrays a;
  a.d = {array(COORDS, tok), array(TOKWIN, tok), array(WSIZES, win), array(WGROUP, win), array(WOFF, win),
         array(GATHER, slots), array(SCATTER, tok), array(SLOTWIN, slots), array(SLOTCOORD, slots)};
  a.elem = std::vector<std::size_t>(a.d.size(), 4);
  mutate_pointers(in, a);
  // The window sizes are gm_token_windows' counts (documented): no array with arbitrary values
  // may alias them (the scan of arbitrary int32 values overflows).
  for (std::size_t i = 0; i < a.d.size(); ++i)
    if (i != WSIZES && a.d[WSIZES].buffer >= 0 && a.d[i].buffer == a.d[WSIZES].buffer) a.d[WSIZES].buffer = 13;
  device_memory mem;
  a.place_all(mem);
  if (a.real) {
    // a longer array keeps zeros past what was drawn: token 0's window, empty windows, group 0
    upload(a.d[COORDS], coords), upload(a.d[TOKWIN], tokwin), upload(a.d[WSIZES], sizes);
    upload(a.d[WGROUP], group), upload(a.d[WOFF], off);
  }
  auto call = [&](void* t, std::size_t* bytes) {
    return gm_build_partition(t, bytes, a.ptr(COORDS), a.ptr(TOKWIN), N, a.ptr(WSIZES), nw, a.ptr(WGROUP), a.ptr(WOFF),
                              G, ng, a.ptr(GATHER), a.ptr(SCATTER), a.ptr(SLOTWIN), a.ptr(SLOTCOORD), nullptr);
  };
  if (verbose()) {
    std::fprintf(stderr, "build_partition: tokens %d windows %d G %d groups %d, temp kind %d, real %d\n", N, nw, G, ng,
                 tmp.kind, a.real);
    print_descs(a.ptrs());
  }
  std::size_t bytes = 0;
  std::uint64_t before = gm_emu::blocks_run();
  auto snap = mem.snapshot();
  const cudaError_t q = call(nullptr, &bytes);
  if (q != cudaSuccess) {
    check_refusal(q, before, mem, snap, "build_partition (query)");
    return check_refusal(call(fake_address(15), &bytes), before, mem, snap, "build_partition (after a refused query)");
  }
  GM_FUZZ_CHECK(gm_emu::blocks_run() == before && mem.snapshot() == snap, "build_partition: the query did work");
  if (tmp.kind == 0) return;
  std::size_t give = tmp.kind == 2 ? bytes - 1 : bytes;  // the size is never 0 (256-byte chunks)
  const std::size_t shift = tmp.kind == 3 ? 16 : 0;
  void* t = a.real ? mem.alloc(give + shift) : fake_address(15);
  snap = mem.snapshot();
  before = gm_emu::blocks_run();
  const cudaError_t e = call(static_cast<char*>(t) + shift, tmp.kind == 4 ? nullptr : &give);
  const bool all_empty = N == 0 && nw == 0 && static_cast<std::int64_t>(G) * ng == 0;
  const bool must_refuse = tmp.kind == 2 || tmp.kind == 3 || tmp.kind == 4 || (!a.real && !all_empty);
  check_call(e, before, mem, snap, must_refuse, "build_partition");
}

}  // namespace

namespace gm_fuzz_abi {

void fuzz_index_family(FuzzedDataProvider& in, bool partition) {
  if (partition) return fuzz_build_partition(in);
  if (in.ConsumeBool()) fuzz_select_visible(in);
  else fuzz_token_windows(in);
}

}  // namespace gm_fuzz_abi
