// Example: the CUDA kernels linked into a framework (greenmim::kernels, C ABI greenmim/kernels.h).
//
// One Swin-B stage-1 attention layer on the device, forward and backward, the way a framework
// extension calls it: the framework owns every buffer (here cudaMalloc stands in for its caching
// allocator; the library never allocates), passes plain tensor descriptors and its stream, asks
// how much workspace the backward needs, and turns a refused call into a readable error with
// gm_last_refusal(). The planner and the partition indices come from the header-only library on
// the host and are uploaded once per (mask, stage, shift). Results are checked against the CPU
// window-by-window oracle when greenmim::reference (Eigen) is available.
//
// Builds wherever greenmim::kernels builds (nvcc present). Without a CUDA device it says so and
// exits 0; it also runs on the project's CPU emulator of CUDA (ctest
// example_kernels_attention_layer_emulated), which is how CI checks it without a GPU.
//
//   build/bin/example_kernels_attention_layer [batch]     (default 2)
#include <cuda_runtime_api.h>
#include <greenmim/greenmim.hpp>
#include <greenmim/kernels.h>
#ifdef GREENMIM_EXAMPLE_HAVE_REFERENCE
#include <greenmim/reference/attention.hpp>
#include <greenmim/reference/oracle.hpp>
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

using namespace greenmim;

namespace {

// Every CUDA or greenmim call goes through this: a refused argument (cudaErrorInvalidValue from a
// gm_ entry point) comes with the library's reason; anything else with CUDA's error string.
bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  const char* why = gm_last_refusal();
  std::fprintf(stderr, "%s failed: %s%s%s\n", what, cudaGetErrorString(e), *why ? ": " : "", why);
  return false;
}
#define TRY(call) \
  do {            \
    if (!ok((call), #call)) return 1; \
  } while (0)

// A contiguous tensor descriptor (strides in elements) over a device pointer.
gm_tensor tensor(void* data, std::initializer_list<std::int64_t> extents) {
  gm_tensor t{};
  t.data = data;
  t.rank = static_cast<std::int32_t>(extents.size());
  int i = 0;
  for (std::int64_t e : extents) t.extent[i++] = e;
  std::int64_t s = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.stride[d] = s;
    s *= t.extent[d];
  }
  return t;
}

// The framework's allocator, here plain cudaMalloc; every buffer is freed on exit.
struct device_buffers {
  std::vector<void*> owned;
  template <class T>
  T* alloc(size_t count) {
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)) != cudaSuccess) return nullptr;
    owned.push_back(p);
    return static_cast<T*>(p);
  }
  ~device_buffers() {
    for (void* p : owned) cudaFree(p);
  }
};

template <class T>
bool upload(T* d, const std::vector<T>& h) {
  return ok(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy to device");
}
template <class T>
bool download(std::vector<T>& h, const T* d) {
  return ok(cudaMemcpy(h.data(), d, h.size() * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}

}  // namespace

int main(int argc, char** argv) {
  // 0. Is there a device at all? (A framework would have asked already.)
  int devices = 0;
  const cudaError_t probe = cudaGetDeviceCount(&devices);
  if (probe != cudaSuccess || devices == 0) {
    std::printf("kernels_attention_layer: no CUDA device (%s); built fine, nothing to run\n",
                probe != cudaSuccess ? cudaGetErrorString(probe) : "0 devices");
    return 0;
  }

  const index_t B = argc > 1 ? std::atoi(argv[1]) : 2;  // images sharing one mask
  const model_shape& swin = *find_model("swin-b");
  const index_t p = swin.window, H = swin.heads[0], D = swin.head_dim;  // 7, 4 heads, 32

  // 1. Host: mask -> visible tokens -> windows -> plan -> partition indices (header-only library).
  mask_config cfg;
  const std::vector<std::uint8_t> units = random_mask(cfg, /*seed=*/3, /*stream=rank*/ 0);
  std::vector<index_t> coords;
  check(visible_coords(span<const std::uint8_t>(units), cfg.grid(), swin.grid(0), coords));
  const window_geometry geom = swin.geometry(0, /*shifted=*/true);
  window_list windows;
  check(build_windows(geom, span<const index_t>(coords), windows));
  const std::vector<index_t> sizes = windows.sizes();
  plan pl;
  check(make_plan(span<const index_t>(sizes), planner_options{}, swin.channels[0], pl));
  partition_indices part;
  check(build_partition(pl, windows, part));
  const index_t N = part.num_tokens, S = part.num_slots();
  std::printf("stage 1 (shifted): %d images, %d visible tokens each, plan G = %d x %d groups (%.2f%% above bound)\n",
              B, N, pl.group_size, pl.num_groups(), 100 * pl.gap());

  // 2. Device buffers, owned by the caller. Upload the indices (or build them on the device with
  //    gm_select_visible / gm_token_windows / gm_build_partition, see kernels.h).
  device_buffers mem;
  const size_t elems = static_cast<size_t>(B) * N * H * D, rows = static_cast<size_t>(B) * N * H;
  const size_t table = static_cast<size_t>((2 * p - 1) * (2 * p - 1) * H);
  float *q = mem.alloc<float>(elems), *k = mem.alloc<float>(elems), *v = mem.alloc<float>(elems);
  float *o = mem.alloc<float>(elems), *dout = mem.alloc<float>(elems), *lse = mem.alloc<float>(rows);
  float *dq = mem.alloc<float>(elems), *dk = mem.alloc<float>(elems), *dv = mem.alloc<float>(elems);
  float *bias = mem.alloc<float>(table), *dbias = mem.alloc<float>(table);
  index_t *gather = mem.alloc<index_t>(static_cast<size_t>(S)), *scatter = mem.alloc<index_t>(static_cast<size_t>(N));
  index_t *slot_window = mem.alloc<index_t>(static_cast<size_t>(S)), *slot_coord = mem.alloc<index_t>(static_cast<size_t>(S));
  if (!slot_coord) {
    std::fprintf(stderr, "cudaMalloc failed\n");
    return 1;
  }
  rng r(11, 0);
  std::vector<float> hq(elems), hk(elems), hv(elems), hdo(elems), hbias(table);
  for (auto* x : {&hq, &hk, &hv, &hdo, &hbias})
    for (float& e : *x) e = static_cast<float>(2 * r.uniform() - 1);
  if (!upload(q, hq) || !upload(k, hk) || !upload(v, hv) || !upload(dout, hdo) || !upload(bias, hbias) ||
      !upload(gather, part.gather) || !upload(scatter, part.scatter) || !upload(slot_window, part.slot_window) ||
      !upload(slot_coord, part.slot_coord))
    return 1;

  const gm_partition gp{gather, scatter, slot_window, slot_coord, part.group_size, part.num_groups, part.num_tokens};
  cudaStream_t stream = nullptr;  // the framework's current stream

  // 3. Forward: check the arguments (no device work), then launch.
  gm_attention_fwd_args fa{};
  fa.dtype = GM_FLOAT32;
  fa.q = tensor(q, {B, N, H, D});
  fa.k = tensor(k, {B, N, H, D});
  fa.v = tensor(v, {B, N, H, D});
  fa.o = tensor(o, {B, N, H, D});
  fa.lse = tensor(lse, {B, N, H});  // kept for the backward
  fa.bias_table = tensor(bias, {(2 * p - 1) * (2 * p - 1), H});
  fa.part = gp;
  fa.window = p;
  fa.scale = 0;  // head_dim^-0.5
  fa.algo = GM_ALGO_AUTO;
  TRY(gm_attention_fwd_can_implement(&fa));
  TRY(gm_attention_fwd(&fa, stream));

  // What a refusal looks like: head_dim 48 is not supported; nothing is launched.
  gm_attention_fwd_args bad = fa;
  bad.q.extent[3] = 48;
  if (gm_attention_fwd_can_implement(&bad) == cudaErrorInvalidValue)
    std::printf("refused as expected (head_dim 48): %s\n", gm_last_refusal());
  cudaGetLastError();  // a refusal leaves no sticky CUDA error, but clear it as a framework would

  // 4. Backward: workspace query (CUB style), caller-allocated workspace, dbias accumulated (+=).
  gm_attention_bwd_args ba{};
  ba.dtype = GM_FLOAT32;
  ba.q = fa.q;
  ba.k = fa.k;
  ba.v = fa.v;
  ba.o = fa.o;
  ba.d_o = tensor(dout, {B, N, H, D});
  ba.lse = fa.lse;
  ba.bias_table = fa.bias_table;
  ba.dq = tensor(dq, {B, N, H, D});
  ba.dk = tensor(dk, {B, N, H, D});
  ba.dv = tensor(dv, {B, N, H, D});
  ba.d_bias_table = tensor(dbias, {(2 * p - 1) * (2 * p - 1), H});
  ba.part = gp;
  ba.window = p;
  ba.algo = GM_ALGO_AUTO;
  size_t ws_bytes = 0;
  TRY(gm_attention_bwd_workspace_size(&ba, &ws_bytes));
  void* workspace = mem.alloc<unsigned char>(ws_bytes);  // cudaMalloc is 256-byte aligned
  TRY(cudaMemsetAsync(dbias, 0, table * sizeof(float), stream));
  TRY(gm_attention_bwd(&ba, workspace, ws_bytes, stream));
  TRY(cudaStreamSynchronize(stream));
  std::printf("forward and backward ran on the device (backward workspace %zu bytes)\n", ws_bytes);

  // 5. Check against the CPU oracle: dense attention window by window, no groups, no padding.
  std::vector<float> ho(elems), hlse(rows), hdq(elems), hdk(elems), hdv(elems), hdb(table);
  if (!download(ho, o) || !download(hlse, lse) || !download(hdq, dq) || !download(hdk, dk) || !download(hdv, dv) ||
      !download(hdb, dbias))
    return 1;
#ifdef GREENMIM_EXAMPLE_HAVE_REFERENCE
  namespace ref = greenmim::reference;
  std::vector<index_t> token_window(static_cast<size_t>(N));
  for (index_t w = 0; w < windows.num_windows(); ++w)
    for (index_t t : windows.window(w)) token_window[static_cast<size_t>(t)] = w;
  std::vector<float> wo(elems), wlse(rows), wdq(elems), wdk(elems), wdv(elems), wdb(table, 0.f);
  ref::oracle_args<float> oa;
  oa.q = make_view(static_cast<const float*>(hq.data()), B, N, H, D);
  oa.k = make_view(static_cast<const float*>(hk.data()), B, N, H, D);
  oa.v = make_view(static_cast<const float*>(hv.data()), B, N, H, D);
  oa.token_window = span<const index_t>(token_window);
  oa.token_coord = span<const index_t>(windows.coords);
  oa.bias = make_view(static_cast<const float*>(hbias.data()), (2 * p - 1) * (2 * p - 1), H);
  oa.window = p;
  oa.out = make_view(wo.data(), B, N, H, D);
  oa.lse = make_view(wlse.data(), B, N, H);
  check(ref::window_attention_oracle(oa));
  ref::oracle_backward_args<float> ob;
  ob.q = oa.q;
  ob.k = oa.k;
  ob.v = oa.v;
  ob.dout = make_view(static_cast<const float*>(hdo.data()), B, N, H, D);
  ob.token_window = oa.token_window;
  ob.token_coord = oa.token_coord;
  ob.bias = oa.bias;
  ob.window = p;
  ob.dq = make_view(wdq.data(), B, N, H, D);
  ob.dk = make_view(wdk.data(), B, N, H, D);
  ob.dv = make_view(wdv.data(), B, N, H, D);
  ob.dbias = make_view(wdb.data(), (2 * p - 1) * (2 * p - 1), H);
  check(ref::window_attention_oracle_backward(ob));
  auto max_err = [](const std::vector<float>& a, const std::vector<float>& b) {
    double e = 0, scale = 1e-30;
    for (size_t i = 0; i < a.size(); ++i) {
      e = std::max(e, static_cast<double>(std::fabs(a[i] - b[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
    }
    return e / scale;  // relative to the largest reference value
  };
  const double ef = std::max(max_err(ho, wo), max_err(hlse, wlse));
  const double eb = std::max({max_err(hdq, wdq), max_err(hdk, wdk), max_err(hdv, wdv), max_err(hdb, wdb)});
  std::printf("max error vs the CPU oracle (relative to the largest value): forward %.2e, backward %.2e\n", ef, eb);
  if (!(ef < 1e-4 && eb < 1e-4)) {
    std::printf("kernels_attention_layer: FAILED\n");
    return 1;
  }
  std::printf("kernels_attention_layer: device results match the CPU oracle\n");
#else
  double checksum = 0;
  for (float x : ho) checksum += x;
  std::printf("output checksum %.6f (no greenmim::reference to compare with)\n", checksum);
  std::printf("kernels_attention_layer: ran (unchecked)\n");
#endif
  return 0;
}
