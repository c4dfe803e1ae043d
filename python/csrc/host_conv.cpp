//! \file host_conv.cpp
//! The C ABI of greenmim_host.h, the sparse convs: neighbour and block tables
//! (gmh_conv_table_*, include/greenmim/sparse_conv.hpp) and the CPU reference depthwise and block
//! convs (gmh_depthwise_conv_* / gmh_block_conv_*, include/greenmim/reference/conv.hpp).
#include "host_common.hpp"

#include <greenmim/reference/conv.hpp>

using namespace greenmim;
using namespace greenmim::host;

namespace {

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

}  // namespace

struct gmh_conv_table {
  std::vector<index_t> entries, out_cu, out_position;
  gmh_conv_table_info info{};
};

extern "C" {

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
