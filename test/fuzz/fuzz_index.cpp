// libFuzzer target: the host index builders (partition.hpp, mask.hpp, merging.hpp, windows.hpp)
// with arbitrary coordinates, masks, plans, window sizes and shifts. Invariants:
//  - no out-of-bounds read or write (AddressSanitizer: every tensor lives in a buffer of exactly
//    its footprint), no undefined behaviour (UBSan), no exception: a status comes back;
//  - a refusal leaves every output exactly as it was;
//  - what is built validates (validate_window_list, validate_partition), window sizes agree
//    with window_sizes, build_partition succeeds exactly when the plan is valid for the list;
//  - unpartition(partition(x)) == x bit-exactly; padding slots hold pad_value; overlapping
//    input and output views are refused;
//  - the dense mask is symmetric and 0 exactly where attends(); relative-position indices lie in
//    the table or are rel_pos_none; the dense bias equals the table at those indices;
//  - merge indices use every visible token exactly once, in Swin's 2x2 order.
// Work bound (the fuzzer's, documented): grids up to 32767 per side are drawn, but inputs whose
// window count, scratch grid or dense mask would exceed ~2^20 entries are not run further.
#include <greenmim/greenmim.hpp>

#include <algorithm>
#include <cstring>
#include <exception>
#include <set>
#include <vector>

#include "fuzz_util.hpp"

using namespace greenmim;

namespace {

constexpr std::int64_t kMaxEntries = std::int64_t{1} << 20;

bool same_list(const window_list& a, const window_list& b) {
  return a.geometry.height == b.geometry.height && a.geometry.width == b.geometry.width &&
         a.geometry.window == b.geometry.window && a.geometry.shift == b.geometry.shift &&
         a.num_samples == b.num_samples && a.num_tokens == b.num_tokens && a.offsets == b.offsets &&
         a.tokens == b.tokens && a.coords == b.coords;
}

window_list sentinel_list() {
  window_list l;
  l.geometry = window_geometry{3, 5, 2, 1};
  l.num_samples = 7;
  l.num_tokens = 1;
  l.offsets = {0, 1};
  l.tokens = {0};
  l.coords = {pack_coord(1, 1)};
  return l;
}

bool same_part(const partition_indices& a, const partition_indices& b) {
  return a.group_size == b.group_size && a.num_groups == b.num_groups && a.num_tokens == b.num_tokens &&
         a.gather == b.gather && a.scatter == b.scatter && a.slot_window == b.slot_window &&
         a.slot_coord == b.slot_coord;
}

partition_indices sentinel_part() {
  partition_indices p;
  p.group_size = 3;
  p.num_groups = 1;
  p.num_tokens = 2;
  p.gather = {1, 0, pad_index};
  p.scatter = {1, 0};
  p.slot_window = {4, 4, pad_index};
  p.slot_coord = {9, 8, 0};
  return p;
}

// A strided 3-d view over a fresh buffer of exactly its footprint (ASan catches any access
// beyond it). Strides: inner dimension 1 or 2, outer ones padded by 0..2 elements.
template <class T>
struct strided3 {
  std::vector<T> buf;
  tensor_view<T, 3> v;
  strided3(FuzzedDataProvider& in, std::int64_t e0, std::int64_t e1, std::int64_t e2) {
    v.extent[0] = e0, v.extent[1] = e1, v.extent[2] = e2;
    v.stride[2] = in.ConsumeIntegralInRange<int>(1, 2);
    v.stride[1] = v.stride[2] * std::max<std::int64_t>(e2, 1) + in.ConsumeIntegralInRange<int>(0, 2);
    v.stride[0] = v.stride[1] * std::max<std::int64_t>(e1, 1) + in.ConsumeIntegralInRange<int>(0, 2);
    if (in.ConsumeIntegralInRange<int>(0, 7) == 0 && e1 <= 16)  // not row-major (may self-overlap)
      std::swap(v.stride[0], v.stride[1]);
    std::int64_t n = 1;
    for (int i = 0; i < 3; ++i) n += (v.extent[i] - 1) * v.stride[i];
    buf.assign(static_cast<size_t>(v.numel() ? n : 0), T{});
    v.data = buf.data();
  }
};

void check_windows(const window_geometry& g, index_t batch, const std::vector<index_t>& cu,
                   const std::vector<index_t>& coords, bool per_sample, window_list& list) {
  window_list out = sentinel_list();
  status s;
  if (per_sample) s = build_windows_per_sample(g, span<const index_t>(cu), span<const index_t>(coords), out);
  else s = build_windows(g, span<const index_t>(coords), out);
  if (s != status::success) {
    GM_FUZZ_CHECK(same_list(out, sentinel_list()), "a refused window build (%s) changed its output", status_string(s));
    return;
  }
  GM_FUZZ_CHECK(g.valid(), "an invalid geometry was accepted");
  GM_FUZZ_CHECK(validate_window_list(out) == status::success, "built list invalid: %s",
                status_string(validate_window_list(out)));
  GM_FUZZ_CHECK(out.num_tokens == static_cast<index_t>(coords.size()), "token count");
  GM_FUZZ_CHECK(out.num_samples == (per_sample ? batch : 1), "samples");
  if (!per_sample) {
    std::vector<index_t> ws(static_cast<size_t>(g.num_windows()), -5);
    GM_FUZZ_CHECK(window_sizes(g, span<const index_t>(coords), span<index_t>(ws)) == status::success, "window_sizes");
    GM_FUZZ_CHECK(ws == out.sizes(), "window_sizes differs from the list's sizes");
  }
  list = out;
}

plan fuzzed_plan(FuzzedDataProvider& in, const std::vector<index_t>& sizes) {
  plan p;
  if (in.ConsumeBool()) {  // a real plan of these sizes
    planner_options o;
    o.strat = static_cast<strategy>(in.ConsumeIntegralInRange<int>(0, 3));
    o.work_budget = 1 << 16;
    if (make_plan(span<const index_t>(sizes), o, 64, p) == status::success) {
      if (in.ConsumeIntegralInRange<int>(0, 3) == 0 && p.num_groups() > 0) {  // then break it a little
        switch (in.ConsumeIntegralInRange<int>(0, 4)) {
          case 0: p.group_size = gm_fuzz::size_like(in); break;
          case 1: p.windows[in.ConsumeIntegralInRange<size_t>(0, p.windows.size() - 1)] = gm_fuzz::size_like(in); break;
          case 2: p.fills[in.ConsumeIntegralInRange<size_t>(0, p.fills.size() - 1)] += in.ConsumeIntegralInRange<int>(-2, 2); break;
          case 3: p.group_offsets.back() -= 1; break;
          default: p.windows.push_back(p.windows.front()), p.group_offsets.back() += 1; break;
        }
      }
      return p;
    }
  }
  // an arbitrary plan
  p.group_size = gm_fuzz::size_like(in, 64);
  const int groups = in.ConsumeIntegralInRange<int>(0, 6);
  for (int g = 0; g < groups; ++g) {
    const int k = in.ConsumeIntegralInRange<int>(0, 4);
    index_t fill = 0;
    for (int i = 0; i < k; ++i) {
      const index_t w = in.ConsumeIntegralInRange<index_t>(-1, static_cast<index_t>(sizes.size()));
      p.windows.push_back(w);
      if (w >= 0 && w < static_cast<index_t>(sizes.size())) fill += sizes[w];
    }
    p.group_offsets.push_back(static_cast<index_t>(p.windows.size()));
    p.fills.push_back(in.ConsumeBool() ? fill : gm_fuzz::size_like(in));
  }
  return p;
}

void check_partition(const partition_indices& pi, const window_list& l) {
  GM_FUZZ_CHECK(validate_partition(pi) == status::success, "built partition invalid: %s",
                status_string(validate_partition(pi)));
  GM_FUZZ_CHECK(pi.num_tokens == l.num_tokens, "num_tokens");
  for (index_t s = 0; s < pi.num_slots(); ++s) {
    const index_t t = pi.gather[s];
    if (t == pad_index) {
      GM_FUZZ_CHECK(pi.slot_window[s] == pad_index && pi.slot_coord[s] == 0, "padding slot %d", s);
    } else {
      GM_FUZZ_CHECK(pi.slot_coord[s] == l.coords[t], "slot %d coordinate", s);
    }
  }
}

void round_trip(FuzzedDataProvider& in, const partition_indices& pi) {
  const std::int64_t B = in.ConsumeIntegralInRange<int>(1, 2), C = in.ConsumeIntegralInRange<int>(0, 5);
  const std::int64_t slots = pi.num_slots();
  if (B * (slots + pi.num_tokens) * std::max<std::int64_t>(C, 1) * 3 > kMaxEntries) return;
  strided3<float> x(in, B, pi.num_tokens, C), y(in, B, slots, C), x2(in, B, pi.num_tokens, C);
  float v = 1;
  for (auto& e : x.buf) e = v++;
  std::fill(y.buf.begin(), y.buf.end(), -7.f);
  const bool x_self_overlap = x.v.stride[0] < x.v.stride[1];
  const partition_view pv = make_partition_view(pi);
  status s = partition_tokens<float>(pi, x.v, y.v, 0.5f);
  GM_FUZZ_CHECK(s == status::success, "partition_tokens refused a valid partition: %s", status_string(s));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t sl = 0; sl < slots; ++sl)
      for (std::int64_t c = 0; c < C; ++c) {
        const index_t t = pv.gather[sl];
        GM_FUZZ_CHECK(y.v(b, sl, c) == (t == pad_index ? 0.5f : x.v(b, t, c)), "partition value");
      }
  std::fill(x2.buf.begin(), x2.buf.end(), -9.f);
  s = unpartition_tokens<float>(pv, y.v, x2.v);
  GM_FUZZ_CHECK(s == status::success, "unpartition_tokens: %s", status_string(s));
  if (!x_self_overlap && x2.v.stride[0] >= x2.v.stride[1])
    for (std::int64_t b = 0; b < B; ++b)
      for (index_t t = 0; t < pi.num_tokens; ++t)
        for (std::int64_t c = 0; c < C; ++c)
          GM_FUZZ_CHECK(x2.v(b, t, c) == x.v(b, t, c), "round trip differs at (%lld, %d, %lld)",
                        static_cast<long long>(b), t, static_cast<long long>(c));
  // x and y inside one buffer: refused when their byte ranges overlap, y untouched then.
  if (C > 0 && pi.num_tokens > 0 && slots > 0) {
    const std::int64_t nx = B * pi.num_tokens * C, ny = B * slots * C;
    const std::int64_t off = in.ConsumeIntegralInRange<std::int64_t>(0, nx + 1);
    std::vector<float> one(static_cast<size_t>(std::max(nx, off + ny)), 3.f);
    tensor_view<float, 3> xv = make_view(one.data(), B, pi.num_tokens, C);
    tensor_view<float, 3> yv = make_view(one.data() + off, B, slots, C);
    const std::vector<float> before = one;
    s = partition_tokens<float>(pv, xv, yv);
    const bool overlap = off < nx;
    GM_FUZZ_CHECK((s == status::invalid_argument) == overlap, "overlapping views: %s (offset %lld of %lld)",
                  status_string(s), static_cast<long long>(off), static_cast<long long>(nx));
    if (overlap) GM_FUZZ_CHECK(one == before, "a refused partition wrote");
  }
}

void masks(FuzzedDataProvider& in, const partition_indices& pi, index_t window) {
  const std::int64_t G = pi.group_size, ng = pi.num_groups;
  const std::int64_t heads = in.ConsumeIntegralInRange<int>(1, 2);
  if (ng * G * G * heads > kMaxEntries) return;
  const partition_view pv = make_partition_view(pi);
  std::vector<float> m(static_cast<size_t>(ng * G * G), 7.f);
  status s = build_attention_mask<float>(pi, make_view(m.data(), ng, G, G), -100.f);
  GM_FUZZ_CHECK(s == status::success, "mask: %s", status_string(s));
  auto mv = make_view(m.data(), ng, G, G);
  for (std::int64_t g = 0; g < ng; ++g)
    for (std::int64_t i = 0; i < G; ++i)
      for (std::int64_t j = 0; j < G; ++j) {
        const bool a = attends(pv.slot_window[g * G + i], pv.slot_window[g * G + j]);
        GM_FUZZ_CHECK(mv(g, i, j) == (a ? 0.f : -100.f) && mv(g, i, j) == mv(g, j, i), "mask entry");
      }
  // relative-position index with the geometry's window or another one
  const index_t p = in.ConsumeBool() ? window : gm_fuzz::size_like(in, 40);
  std::vector<index_t> r(static_cast<size_t>(ng * G * G), 12345);
  s = build_rel_pos_index(pi, p, make_view(r.data(), ng, G, G));
  if (s != status::success) {
    GM_FUZZ_CHECK(std::all_of(r.begin(), r.end(), [](index_t e) { return e == 12345; }), "a refused index wrote");
    return;
  }
  const std::int64_t rows = (2 * static_cast<std::int64_t>(p) - 1) * (2 * static_cast<std::int64_t>(p) - 1);
  for (std::int64_t e = 0; e < ng * G * G; ++e)
    GM_FUZZ_CHECK(r[e] == rel_pos_none || (r[e] >= 0 && r[e] < rows), "index %d outside [0, %lld)", r[e],
                  static_cast<long long>(rows));
  if (rows * heads > kMaxEntries) return;
  std::vector<float> table(static_cast<size_t>(rows * heads));
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<float>(i) + 0.25f;
  std::vector<float> bias(static_cast<size_t>(ng * heads * G * G), 9.f);
  s = build_rel_pos_bias<float>(pi, p, make_view(static_cast<const float*>(table.data()), rows, heads),
                                make_view(bias.data(), ng, heads, G, G));
  GM_FUZZ_CHECK(s == status::success, "bias refused where the index was built: %s", status_string(s));
  auto bv = make_view(bias.data(), ng, heads, G, G);
  for (std::int64_t g = 0; g < ng; ++g)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t i = 0; i < G; ++i)
        for (std::int64_t j = 0; j < G; ++j) {
          const index_t k = r[(g * G + i) * G + j];
          GM_FUZZ_CHECK(bv(g, h, i, j) == (k == rel_pos_none ? 0.f : table[k * heads + h]), "bias entry");
        }
}

void merging(FuzzedDataProvider& in, index_t height, index_t width, const std::vector<index_t>& cu,
             const std::vector<index_t>& coords, bool per_sample) {
  if (static_cast<std::int64_t>(height) * width > kMaxEntries) return;
  std::vector<index_t> g4 = {5, 6}, next = {7}, ncu = {8};
  const auto g4_0 = g4, next_0 = next, ncu_0 = ncu;
  status s = per_sample ? merge_indices_per_sample(height, width, span<const index_t>(cu), span<const index_t>(coords),
                                                   g4, ncu, next)
                        : merge_indices(height, width, span<const index_t>(coords), g4, next);
  if (s != status::success) {
    GM_FUZZ_CHECK(g4 == g4_0 && next == next_0 && ncu == ncu_0, "a refused merge (%s) changed its outputs",
                  status_string(s));
    return;
  }
  GM_FUZZ_CHECK(g4.size() == 4 * next.size() && g4.size() == coords.size(), "merge sizes %zu %zu %zu", g4.size(),
                next.size(), coords.size());
  std::vector<std::uint8_t> used(coords.size(), 0);
  for (size_t j = 0; j < next.size(); ++j)
    for (index_t k = 0; k < 4; ++k) {
      const index_t t = g4[4 * j + k];
      GM_FUZZ_CHECK(t >= 0 && t < static_cast<index_t>(coords.size()) && !used[t], "merge token %d", t);
      used[t] = 1;
      GM_FUZZ_CHECK(coord_h(coords[t]) == 2 * coord_h(next[j]) + merge_dh(k) &&
                        coord_w(coords[t]) == 2 * coord_w(next[j]) + merge_dw(k),
                    "merge order");
    }
  const std::int64_t C = in.ConsumeIntegralInRange<int>(1, 3);
  if (static_cast<std::int64_t>(coords.size()) * C * 8 > kMaxEntries) return;
  std::vector<float> x(coords.size() * C), y(next.size() * 4 * C, -1.f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  s = merge_tokens<float>(span<const index_t>(g4), make_view(static_cast<const float*>(x.data()), 1, static_cast<std::int64_t>(coords.size()), C),
                          make_view(y.data(), 1, static_cast<std::int64_t>(next.size()), 4 * C));
  GM_FUZZ_CHECK(s == status::success, "merge_tokens: %s", status_string(s));
}

void one_input(FuzzedDataProvider& in) {
  window_geometry g;
  const bool wild = in.ConsumeIntegralInRange<int>(0, 7) == 0;
  g.height = wild ? gm_fuzz::size_like(in) : in.ConsumeIntegralInRange<index_t>(1, 40);
  g.width = wild ? gm_fuzz::size_like(in) : in.ConsumeIntegralInRange<index_t>(1, 40);
  g.window = wild ? gm_fuzz::size_like(in, 16) : in.ConsumeIntegralInRange<index_t>(1, 16);
  g.shift = wild ? gm_fuzz::size_like(in, 16) : in.ConsumeIntegralInRange<index_t>(0, std::max<index_t>(g.window - 1, 0));
  if (in.ConsumeBool() && g.height > 0 && g.width > 0 && g.window > 0)  // Swin's rule for small grids
    g = make_window_geometry(g.height, g.width, g.window, g.shift);
  const bool per_sample = in.ConsumeBool();
  const index_t batch = per_sample ? in.ConsumeIntegralInRange<index_t>(0, 3) : 1;
  if (g.valid() && static_cast<std::int64_t>(g.num_windows()) * std::max<index_t>(batch, 1) > kMaxEntries) return;

  // Coordinates: from a keep mask (valid, row-major per sample) or arbitrary packed values.
  std::vector<index_t> cu, coords;
  if (in.ConsumeBool() && g.height > 0 && g.width > 0 && g.height <= 32767 && g.width <= 32767 && std::int64_t{g.height} * g.width * batch <= kMaxEntries) {
    std::vector<std::uint8_t> keep(static_cast<size_t>(std::int64_t{g.height} * g.width * batch));
    const int density = in.ConsumeIntegralInRange<int>(0, 8);
    for (auto& k : keep) k = in.ConsumeIntegralInRange<int>(0, 7) < density;
    const status s = keep_mask_coords(span<const std::uint8_t>(keep), batch, g.height, g.width, cu, coords);
    GM_FUZZ_CHECK(s == status::success || g.height > 32767 || g.width > 32767, "keep_mask_coords: %s", status_string(s));
    if (in.ConsumeIntegralInRange<int>(0, 3) == 0 && !coords.empty()) {  // permute within a sample, or break one
      const size_t i = in.ConsumeIntegralInRange<size_t>(0, coords.size() - 1);
      const size_t j = in.ConsumeIntegralInRange<size_t>(0, coords.size() - 1);
      if (in.ConsumeBool()) std::swap(coords[i], coords[j]);
      else coords[i] = in.ConsumeIntegral<index_t>();
    }
    if (!per_sample) cu.clear();
  } else {
    const int n = in.ConsumeIntegralInRange<int>(0, 64);
    for (int i = 0; i < n; ++i)
      coords.push_back(in.ConsumeBool() ? pack_coord(in.ConsumeIntegralInRange<index_t>(0, 40), in.ConsumeIntegralInRange<index_t>(0, 40))
                                        : in.ConsumeIntegral<index_t>());
    cu.push_back(0);
    for (index_t b = 0; b + 1 < batch; ++b)
      cu.push_back(in.ConsumeIntegralInRange<index_t>(cu.back() - 1, static_cast<index_t>(coords.size()) + 1));
    if (batch > 0) cu.push_back(in.ConsumeIntegralInRange<int>(0, 7) ? static_cast<index_t>(coords.size()) : in.ConsumeIntegral<index_t>());
  }
  if (!per_sample && in.ConsumeIntegralInRange<int>(0, 15) == 0) {  // token_windows on whatever we have
    std::vector<index_t> tw(coords.size(), -3);
    const auto tw0 = tw;
    const status s = token_windows(g, span<const index_t>(coords), span<index_t>(tw));
    (void)s;
  }

  window_list list;
  bool have_list = false;
  {
    window_list l;
    l.num_tokens = -1;
    check_windows(g, batch, cu, coords, per_sample, l);
    if (l.num_tokens >= 0) list = l, have_list = true;
  }
  merging(in, g.height, g.width, cu, coords, per_sample);
  if (!have_list) return;

  // Partition indices: from a (possibly broken) plan, or the single-group 'masking' mode.
  const std::vector<index_t> sizes = list.sizes();
  partition_indices pi = sentinel_part();
  status s;
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
    index_t G = in.ConsumeBool() ? 0 : gm_fuzz::size_like(in, 128);
    if (G > kMaxEntries) G = static_cast<index_t>(kMaxEntries);  // O(G) memory by design
    s = build_single_group(list, pi, G);
    const bool expect = G == 0 || G >= list.num_tokens;
    GM_FUZZ_CHECK((s == status::success) == (expect && G >= 0), "single group G=%d N=%d: %s", G, list.num_tokens,
                  status_string(s));
  } else {
    plan p = fuzzed_plan(in, sizes);
    // n_g * G slots are allocated: keep accepted plans small (the overflow refusal stays reachable)
    const std::int64_t slots = static_cast<std::int64_t>(p.group_size) * std::max<index_t>(p.num_groups(), 1);
    if (slots > kMaxEntries && slots <= 2147483647) p.group_size = static_cast<index_t>(kMaxEntries / std::max<index_t>(p.num_groups(), 1));
    const status valid = validate_plan(span<const index_t>(sizes), p);
    s = build_partition(p, list, pi);
    const bool fits = static_cast<std::int64_t>(p.group_size) * p.num_groups() <= 2147483647;
    GM_FUZZ_CHECK((s == status::success) == (valid == status::success && fits), "build_partition %s, validate_plan %s",
                  status_string(s), status_string(valid));
  }
  if (s != status::success) {
    GM_FUZZ_CHECK(same_part(pi, sentinel_part()), "a refused partition build (%s) changed its output", status_string(s));
    return;
  }
  if (pi.num_slots() > kMaxEntries) return;
  check_partition(pi, list);
  round_trip(in, pi);
  masks(in, pi, list.geometry.window);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  try {
    one_input(in);
  } catch (const std::exception& e) {
    GM_FUZZ_CHECK(false, "exception: %s", e.what());
  }
  return 0;
}
