// Host-only checks of the C ABI (kernels.h): argument refusal without a device, no crash, no
// launch. These run on every machine; fake (never dereferenced) device pointers stand in for
// real allocations because can_implement never touches the device.
#include "gpu_test_util.hpp"

#include <cstdint>

namespace {

using gm_test::make_tensor;
using greenmim::index_t;

// Fake, suitably aligned "device" addresses, far apart so that nothing overlaps.
void* fake(std::uintptr_t k) { return reinterpret_cast<void*>((k + 1) * (std::uintptr_t{1} << 32)); }
const std::int32_t* fake_idx(std::uintptr_t k) { return static_cast<const std::int32_t*>(fake(k)); }

constexpr std::int64_t B = 2, N = 100, H = 4, D = 32, G = 49, NG = 3, P = 7;
constexpr std::int64_t R = (2 * P - 1) * (2 * P - 1);

gm_tensor rows(void* p) { return make_tensor(p, {B, N, H, D}, {N * H * D, H * D, D, 1}); }

gm_partition part() {
  gm_partition p{};
  p.gather = fake_idx(20);
  p.scatter = fake_idx(21);
  p.slot_window = fake_idx(22);
  p.slot_coord = fake_idx(23);
  p.group_size = G;
  p.num_groups = NG;
  p.num_tokens = N;
  return p;
}

gm_attention_fwd_args good_fwd(gm_dtype dt = GM_BFLOAT16) {
  gm_attention_fwd_args a{};
  a.dtype = dt;
  a.q = rows(fake(1));
  a.k = rows(fake(2));
  a.v = rows(fake(3));
  a.o = rows(fake(4));
  a.lse = make_tensor(fake(5), {B, N, H}, {N * H, H, 1});
  a.bias_table = make_tensor(fake(6), {R, H}, {H, 1});
  a.part = part();
  a.window = P;
  a.scale = 0.f;
  a.algo = GM_ALGO_AUTO;
  return a;
}

gm_attention_bwd_args good_bwd(gm_dtype dt = GM_BFLOAT16) {
  gm_attention_bwd_args a{};
  a.dtype = dt;
  a.q = rows(fake(1));
  a.k = rows(fake(2));
  a.v = rows(fake(3));
  a.o = rows(fake(4));
  a.d_o = rows(fake(7));
  a.lse = make_tensor(fake(5), {B, N, H}, {N * H, H, 1});
  a.bias_table = make_tensor(fake(6), {R, H}, {H, 1});
  a.dq = rows(fake(8));
  a.dk = rows(fake(9));
  a.dv = rows(fake(10));
  a.d_bias_table = make_tensor(fake(11), {R, H}, {H, 1});
  a.part = part();
  a.window = P;
  return a;
}

gm_partition_args good_partition(gm_dtype dt = GM_FLOAT32) {
  gm_partition_args a{};
  a.dtype = dt;
  a.x = make_tensor(fake(1), {B, N, 128}, {N * 128, 128, 1});
  a.y = make_tensor(fake(2), {B, G * NG, 128}, {G * NG * 128, 128, 1});
  a.part = part();
  return a;
}

//! The same address two bytes on: a misaligned int32 array.
const std::int32_t* misalign(const std::int32_t* p) {
  return reinterpret_cast<const std::int32_t*>(reinterpret_cast<const char*>(p) + 2);
}

bool refused(cudaError_t e) { return e == cudaErrorInvalidValue && std::string(gm_last_refusal()).size() > 0; }

}  // namespace

TEST_CASE("kernels ABI: forward can_implement accepts good arguments and refuses bad ones") {
  for (gm_dtype dt : {GM_FLOAT32, GM_FLOAT16, GM_BFLOAT16}) {
    gm_attention_fwd_args a = good_fwd(dt);
    CHECK(gm_attention_fwd_can_implement(&a) == cudaSuccess);
    CHECK(std::string(gm_last_refusal()).empty());
    a.q.extent[3] = a.k.extent[3] = a.v.extent[3] = a.o.extent[3] = 64;
    a.q.stride[2] = a.k.stride[2] = a.v.stride[2] = a.o.stride[2] = 64;
    a.q.stride[1] = a.k.stride[1] = a.v.stride[1] = a.o.stride[1] = 64 * H;
    a.q.stride[0] = a.k.stride[0] = a.v.stride[0] = a.o.stride[0] = 64 * H * N;
    CHECK(gm_attention_fwd_can_implement(&a) == cudaSuccess);
  }
  CHECK(gm_attention_fwd_can_implement(nullptr) == cudaErrorInvalidValue);

  struct mutation {
    const char* what;
    void (*apply)(gm_attention_fwd_args&);
  };
  const mutation bad[] = {
      {"dtype", [](gm_attention_fwd_args& a) { a.dtype = static_cast<gm_dtype>(7); }},
      {"algo", [](gm_attention_fwd_args& a) { a.algo = static_cast<gm_algo>(9); }},
      {"head_dim 48", [](gm_attention_fwd_args& a) { a.q.extent[3] = 48; }},
      {"head_dim 16 everywhere",
       [](gm_attention_fwd_args& a) { a.q.extent[3] = a.k.extent[3] = a.v.extent[3] = a.o.extent[3] = 16; }},
      {"q rank", [](gm_attention_fwd_args& a) { a.q.rank = 3; }},
      {"null q", [](gm_attention_fwd_args& a) { a.q.data = nullptr; }},
      {"null o", [](gm_attention_fwd_args& a) { a.o.data = nullptr; }},
      {"misaligned q", [](gm_attention_fwd_args& a) { a.q.data = static_cast<char*>(a.q.data) + 1; }},
      {"last stride", [](gm_attention_fwd_args& a) { a.k.stride[3] = 2; }},
      {"negative stride", [](gm_attention_fwd_args& a) { a.v.stride[1] = -a.v.stride[1]; }},
      {"k extent", [](gm_attention_fwd_args& a) { a.k.extent[1] = N + 1; }},
      {"o self-overlap", [](gm_attention_fwd_args& a) { a.o.stride[1] = 1; }},
      {"o overlaps q", [](gm_attention_fwd_args& a) { a.o.data = a.q.data; }},
      {"lse shape", [](gm_attention_fwd_args& a) { a.lse.extent[2] = H + 1; }},
      {"lse rank", [](gm_attention_fwd_args& a) { a.lse.rank = 4; }},
      {"bias rows", [](gm_attention_fwd_args& a) { a.bias_table.extent[0] = R - 1; }},
      {"bias heads", [](gm_attention_fwd_args& a) { a.bias_table.extent[1] = H + 1; }},
      {"window 0 with bias", [](gm_attention_fwd_args& a) { a.window = 0; }},
      {"window too large", [](gm_attention_fwd_args& a) { a.window = GM_MAX_WINDOW + 1; }},
      {"G = 0", [](gm_attention_fwd_args& a) { a.part.group_size = 0; }},
      {"G too large", [](gm_attention_fwd_args& a) { a.part.group_size = GM_SIMT_MAX_GROUP + 1; }},
      {"num_groups < 0", [](gm_attention_fwd_args& a) { a.part.num_groups = -1; }},
      {"num_tokens mismatch", [](gm_attention_fwd_args& a) { a.part.num_tokens = N - 1; }},
      {"null gather", [](gm_attention_fwd_args& a) { a.part.gather = nullptr; }},
      {"null slot_window", [](gm_attention_fwd_args& a) { a.part.slot_window = nullptr; }},
      {"null slot_coord with bias", [](gm_attention_fwd_args& a) { a.part.slot_coord = nullptr; }},
      // a misaligned int32 index array faults on the device (found by fuzz_abi in the index builders)
      {"misaligned gather", [](gm_attention_fwd_args& a) { a.part.gather = misalign(a.part.gather); }},
      {"misaligned slot_window", [](gm_attention_fwd_args& a) { a.part.slot_window = misalign(a.part.slot_window); }},
      {"misaligned slot_coord", [](gm_attention_fwd_args& a) { a.part.slot_coord = misalign(a.part.slot_coord); }},
      {"scale NaN", [](gm_attention_fwd_args& a) { a.scale = NAN; }},
      {"batch > 65535", [](gm_attention_fwd_args& a) { a.q.extent[0] = a.k.extent[0] = a.v.extent[0] = a.o.extent[0] = a.lse.extent[0] = 70000; }},
      {"MMA with G > 256", [](gm_attention_fwd_args& a) { a.algo = GM_ALGO_MMA; a.part.group_size = 257; }},
      {"MMA with unaligned rows", [](gm_attention_fwd_args& a) { a.algo = GM_ALGO_MMA; a.o.data = static_cast<char*>(a.o.data) + 2; }},
  };
  for (const mutation& m : bad) {
    gm_attention_fwd_args a = good_fwd();
    m.apply(a);
    INFO("mutation: " << m.what);
    CHECK(refused(gm_attention_fwd_can_implement(&a)));
    CHECK(refused(gm_attention_fwd(&a, nullptr)));  // refused before any launch, device or not
  }
  gm_attention_fwd_args f32 = good_fwd(GM_FLOAT32);
  f32.algo = GM_ALGO_MMA;
  CHECK(refused(gm_attention_fwd_can_implement(&f32)));
  gm_attention_fwd_args nobias = good_fwd();
  nobias.bias_table.data = nullptr;
  nobias.window = 0;
  nobias.part.slot_coord = nullptr;
  CHECK(gm_attention_fwd_can_implement(&nobias) == cudaSuccess);  // no bias: window and coords unused
  gm_attention_fwd_args nolse = good_fwd();
  nolse.lse.data = nullptr;
  CHECK(gm_attention_fwd_can_implement(&nolse) == cudaSuccess);
  gm_attention_fwd_args mma = good_fwd(GM_FLOAT16);
  mma.algo = GM_ALGO_MMA;
  CHECK(gm_attention_fwd_can_implement(&mma) == cudaSuccess);
  for (int g : {64, 65, 144, 256}) {  // one pass up to 64, query tiles up to 256
    INFO("MMA with G " << g);
    gm_attention_fwd_args big = good_fwd(GM_BFLOAT16);
    big.algo = GM_ALGO_MMA;
    big.part.group_size = g;
    CHECK(gm_attention_fwd_can_implement(&big) == cudaSuccess);
  }
}

TEST_CASE("kernels ABI: backward can_implement, workspace size, refusals") {
  gm_attention_bwd_args a = good_bwd();
  CHECK(gm_attention_bwd_can_implement(&a) == cudaSuccess);
  std::size_t bytes = 0;
  CHECK(gm_attention_bwd_workspace_size(&a, &bytes) == cudaSuccess);
  const std::size_t delta = static_cast<std::size_t>(B * H * G * NG) * 4;
  const std::size_t partial = static_cast<std::size_t>(B * NG * 1 * H * R) * 4;
  auto up = [](std::size_t n) { return (n + 255) / 256 * 256; };
  CHECK(bytes == up(delta) + up(partial));
  gm_attention_bwd_args nodb = good_bwd();
  nodb.d_bias_table.data = nullptr;
  CHECK(gm_attention_bwd_workspace_size(&nodb, &bytes) == cudaSuccess);
  CHECK(bytes == up(delta));
  CHECK(gm_attention_bwd_workspace_size(&a, nullptr) == cudaErrorInvalidValue);
  CHECK(gm_attention_bwd_workspace_size(nullptr, &bytes) == cudaErrorInvalidValue);
  CHECK(gm_attention_bwd_can_implement(nullptr) == cudaErrorInvalidValue);

  struct mutation {
    const char* what;
    void (*apply)(gm_attention_bwd_args&);
  };
  const mutation bad[] = {
      {"lse missing", [](gm_attention_bwd_args& x) { x.lse.data = nullptr; }},
      {"dbias without bias", [](gm_attention_bwd_args& x) { x.bias_table.data = nullptr; }},
      {"dbias shape", [](gm_attention_bwd_args& x) { x.d_bias_table.extent[0] = R + 1; }},
      {"dq overlaps q", [](gm_attention_bwd_args& x) { x.dq.data = x.q.data; }},
      {"dv overlaps d_o", [](gm_attention_bwd_args& x) { x.dv.data = x.d_o.data; }},
      {"dbias overlaps bias", [](gm_attention_bwd_args& x) { x.d_bias_table.data = x.bias_table.data; }},
      {"null d_o", [](gm_attention_bwd_args& x) { x.d_o.data = nullptr; }},
      {"misaligned gather", [](gm_attention_bwd_args& x) { x.part.gather = misalign(x.part.gather); }},
      {"misaligned slot_coord", [](gm_attention_bwd_args& x) { x.part.slot_coord = misalign(x.part.slot_coord); }},
      {"dk self-overlap", [](gm_attention_bwd_args& x) { x.dk.stride[2] = 0; }},
      {"head_dim 128", [](gm_attention_bwd_args& x) { x.q.extent[3] = 128; }},
      {"dtype", [](gm_attention_bwd_args& x) { x.dtype = static_cast<gm_dtype>(-1); }},
      {"MMA with G > 256", [](gm_attention_bwd_args& x) { x.algo = GM_ALGO_MMA; x.part.group_size = 257; }},
      {"MMA with unaligned dq rows", [](gm_attention_bwd_args& x) { x.algo = GM_ALGO_MMA; x.dq.data = static_cast<char*>(x.dq.data) + 2; }},
      {"MMA with float32", [](gm_attention_bwd_args& x) { x.algo = GM_ALGO_MMA; x.dtype = GM_FLOAT32; }},
  };
  for (const mutation& m : bad) {
    gm_attention_bwd_args x = good_bwd();
    m.apply(x);
    INFO("mutation: " << m.what);
    CHECK(refused(gm_attention_bwd_can_implement(&x)));
    CHECK(refused(gm_attention_bwd_workspace_size(&x, &bytes)));
    CHECK(refused(gm_attention_bwd(&x, fake(30), std::size_t{1} << 30, nullptr)));
  }
  // the tensor-core backward: accepted where it applies, with the same workspace; AUTO and SIMT
  // fall back to the SIMT kernels where it does not
  for (gm_dtype dt : {GM_FLOAT16, GM_BFLOAT16}) {
    gm_attention_bwd_args m = good_bwd(dt);
    m.algo = GM_ALGO_MMA;
    CHECK(gm_attention_bwd_can_implement(&m) == cudaSuccess);
    CHECK(gm_attention_bwd_workspace_size(&m, &bytes) == cudaSuccess);
    CHECK(bytes == up(delta) + up(partial));
  }
  gm_attention_bwd_args f32 = good_bwd(GM_FLOAT32);
  CHECK(gm_attention_bwd_can_implement(&f32) == cudaSuccess);
  f32.algo = GM_ALGO_MMA;
  CHECK(refused(gm_attention_bwd_can_implement(&f32)));
  CHECK(std::string(gm_last_refusal()).find("GM_ALGO_MMA") != std::string::npos);
  gm_attention_bwd_args big = good_bwd();
  big.part.group_size = 200;  // the tiled tensor-core kernels
  big.algo = GM_ALGO_MMA;
  CHECK(gm_attention_bwd_can_implement(&big) == cudaSuccess);
  big.part.group_size = 257;
  big.algo = GM_ALGO_AUTO;
  CHECK(gm_attention_bwd_can_implement(&big) == cudaSuccess);  // AUTO: SIMT
  big.algo = GM_ALGO_SIMT;
  CHECK(gm_attention_bwd_can_implement(&big) == cudaSuccess);
  // workspace checks happen before any launch
  REQUIRE(gm_attention_bwd_workspace_size(&a, &bytes) == cudaSuccess);
  CHECK(refused(gm_attention_bwd(&a, fake(30), bytes - 1, nullptr)));
  CHECK(refused(gm_attention_bwd(&a, nullptr, bytes, nullptr)));
  CHECK(refused(gm_attention_bwd(&a, static_cast<char*>(fake(30)) + 16, bytes, nullptr)));
}

TEST_CASE("kernels ABI: partition/unpartition checks") {
  gm_partition_args a = good_partition();
  CHECK(gm_partition_can_implement(&a) == cudaSuccess);
  CHECK(gm_partition_can_implement(nullptr) == cudaErrorInvalidValue);
  CHECK(gm_partition_tokens(nullptr, nullptr) == cudaErrorInvalidValue);
  CHECK(gm_unpartition_tokens(nullptr, nullptr) == cudaErrorInvalidValue);
  struct mutation {
    const char* what;
    void (*apply)(gm_partition_args&);
  };
  const mutation bad[] = {
      {"dtype", [](gm_partition_args& x) { x.dtype = static_cast<gm_dtype>(5); }},
      {"y rows", [](gm_partition_args& x) { x.y.extent[1] = G * NG + 1; }},
      {"x tokens", [](gm_partition_args& x) { x.x.extent[1] = N + 1; }},
      {"C mismatch", [](gm_partition_args& x) { x.y.extent[2] = 127; }},
      {"overlap", [](gm_partition_args& x) { x.y.data = x.x.data; }},
      {"null gather", [](gm_partition_args& x) { x.part.gather = nullptr; }},
      {"null scatter", [](gm_partition_args& x) { x.part.scatter = nullptr; }},
      {"misaligned gather", [](gm_partition_args& x) { x.part.gather = misalign(x.part.gather); }},
      {"misaligned scatter", [](gm_partition_args& x) { x.part.scatter = misalign(x.part.scatter); }},
      {"G = 0", [](gm_partition_args& x) { x.part.group_size = 0; }},
      {"last stride", [](gm_partition_args& x) { x.x.stride[2] = 3; }},
      {"misaligned", [](gm_partition_args& x) { x.x.data = static_cast<char*>(x.x.data) + 2; }},
  };
  for (const mutation& m : bad) {
    gm_partition_args x = good_partition();
    m.apply(x);
    INFO("mutation: " << m.what);
    CHECK(refused(gm_partition_can_implement(&x)));
  }
  // each direction checks only what it uses
  gm_partition_args g = good_partition();
  g.part.scatter = nullptr;
  CHECK(refused(gm_unpartition_tokens(&g, nullptr)));
}

TEST_CASE("kernels ABI: index building refuses bad arguments") {
  std::size_t bytes = 0;
  CHECK(gm_select_visible(nullptr, nullptr, nullptr, 1, 7, 7, nullptr, nullptr, nullptr) == cudaErrorInvalidValue);
  CHECK(gm_select_visible(nullptr, &bytes, nullptr, 1, 0, 7, nullptr, nullptr, nullptr) == cudaErrorInvalidValue);
  CHECK(gm_select_visible(nullptr, &bytes, nullptr, -1, 7, 7, nullptr, nullptr, nullptr) == cudaErrorInvalidValue);
  const gm_window_geometry bad_geom{56, 56, 7, 7};  // shift must be < window
  CHECK(gm_token_windows(nullptr, nullptr, 10, 1, bad_geom, nullptr, nullptr, nullptr, nullptr) == cudaErrorInvalidValue);
  // null token arrays are refused before anything is queued (no memset of the sizes first): with
  // a bogus, never-dereferenced sizes pointer the answer is the refusal, not a CUDA error
  const gm_window_geometry geom{56, 56, 7, 0};
  auto* bogus = reinterpret_cast<int32_t*>(std::uintptr_t{0x1000});
  CHECK(gm_token_windows(bogus, bogus, 10, 1, geom, nullptr, bogus, bogus, nullptr) == cudaErrorInvalidValue);
  CHECK(std::string(gm_last_refusal()).find("null") != std::string::npos);
  CHECK(gm_build_partition(nullptr, nullptr, nullptr, nullptr, 0, nullptr, 0, nullptr, nullptr, 49, 1, nullptr, nullptr,
                           nullptr, nullptr, nullptr) == cudaErrorInvalidValue);
  CHECK(gm_build_partition(nullptr, &bytes, nullptr, nullptr, 0, nullptr, 0, nullptr, nullptr, 0, 1, nullptr, nullptr,
                           nullptr, nullptr, nullptr) == cudaErrorInvalidValue);
  CHECK(gm_build_partition(nullptr, &bytes, nullptr, nullptr, -1, nullptr, 0, nullptr, nullptr, 49, 1, nullptr, nullptr,
                           nullptr, nullptr, nullptr) == cudaErrorInvalidValue);
}

// The C enums keep C's size in C++ (fixed underlying type int32_t): any stored value is readable.
static_assert(sizeof(gm_dtype) == sizeof(int) && sizeof(gm_algo) == sizeof(int), "C ABI enum size");

TEST_CASE("kernels ABI: names, sizes, empty problems, no device") {
  CHECK(std::string(gm_dtype_name(GM_BFLOAT16)) == "bfloat16");
  CHECK(std::string(gm_dtype_name(static_cast<gm_dtype>(42))) == "invalid");
  CHECK(gm_dtype_size(GM_FLOAT32) == 4);
  CHECK(gm_dtype_size(GM_FLOAT16) == 2);
  CHECK(gm_dtype_size(static_cast<gm_dtype>(42)) == 0);
  // an empty batch is a valid no-op: nothing is launched, so it succeeds even without a device
  gm_attention_fwd_args a = good_fwd();
  a.q.extent[0] = a.k.extent[0] = a.v.extent[0] = a.o.extent[0] = a.lse.extent[0] = 0;
  CHECK(gm_attention_fwd(&a, nullptr) == cudaSuccess);
  if (!gm_test::cuda_available()) {
    // valid arguments, no device: the launch fails with an error code, nothing crashes
    gm_attention_fwd_args f = good_fwd();
    CHECK(gm_attention_fwd(&f, nullptr) != cudaSuccess);
    (void)cudaGetLastError();
    gm_attention_bwd_args b = good_bwd();
    std::size_t bytes = 0;
    REQUIRE(gm_attention_bwd_workspace_size(&b, &bytes) == cudaSuccess);
    CHECK(gm_attention_bwd(&b, fake(30), bytes, nullptr) != cudaSuccess);
    (void)cudaGetLastError();
    gm_partition_args p = good_partition();
    CHECK(gm_partition_tokens(&p, nullptr) != cudaSuccess);
    (void)cudaGetLastError();
    MESSAGE("no CUDA device: launches with valid arguments returned errors as expected");
  }
}

TEST_CASE("kernels C++ header: views convert to the C descriptors") {
  namespace gk = greenmim::kernels;
  gk::attention_forward_args<__nv_bfloat16> a;
  auto* base = static_cast<__nv_bfloat16*>(fake(1));
  a.q = greenmim::make_view<const __nv_bfloat16>(base, B, N, H, D);
  a.k = greenmim::make_view<const __nv_bfloat16>(static_cast<__nv_bfloat16*>(fake(2)), B, N, H, D);
  a.v = greenmim::make_view<const __nv_bfloat16>(static_cast<__nv_bfloat16*>(fake(3)), B, N, H, D);
  a.o = greenmim::make_view(static_cast<__nv_bfloat16*>(fake(4)), B, N, H, D);
  a.part = greenmim::partition_view{fake_idx(20), fake_idx(21), fake_idx(22), fake_idx(23), G, NG, N};
  CHECK(gk::can_implement(a) == cudaSuccess);
  const gm_attention_fwd_args c = gk::to_c(a);
  CHECK(c.dtype == GM_BFLOAT16);
  CHECK(c.q.stride[0] == N * H * D);
  CHECK(c.bias_table.data == nullptr);
  a.alg = gk::algo::mma;
  CHECK(gk::can_implement(a) == cudaSuccess);
  a.part.group_size = 100;  // the tensor-core query tiles
  CHECK(gk::can_implement(a) == cudaSuccess);
  a.part.group_size = 257;
  CHECK(gk::can_implement(a) == cudaErrorInvalidValue);

  // window_slot_table: offsets are the sums of the sizes before each window in its group
  greenmim::plan p;
  p.group_size = 10;
  p.group_offsets = {0, 2, 3};
  p.windows = {0, 2, 3};
  p.fills = {7, 6};
  const std::vector<index_t> sizes = {3, 0, 4, 6};
  std::vector<index_t> grp, off;
  REQUIRE(gk::window_slot_table(p, greenmim::span<const index_t>(sizes), grp, off) == greenmim::status::success);
  CHECK(grp == std::vector<index_t>{0, -1, 0, 1});
  CHECK(off == std::vector<index_t>{0, -1, 3, 0});
}
