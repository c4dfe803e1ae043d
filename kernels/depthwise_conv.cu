//! \file depthwise_conv.cu
//! The depthwise 3x3 submanifold conv of Twins' PEG on visible tokens, forward and backward
//! (docs/sparse-conv.md; neighbour tables from include/greenmim/sparse_conv.hpp, built on the
//! host). fp32/fp16/bf16 features, fp32 weights and accumulation.
//! - forward and dx: a block is `rows` token rows x `gb` channel groups of V channels (V = 8:
//!   16-byte vectors, C % 8 == 0 and 16-byte aligned rows; else V = 1), gb = min(C / V, 32), and
//!   walks several token tiles and samples (dw_apply_split_for); it stages its channels' 9 weights
//!   and bias in shared memory (tap-major). Where enough tiles remain (dw_apply_walks), a thread
//!   walks 8 tokens (a row of a Morton-ordered group of 64) and keeps the last token's rows where
//!   the next token's taps are the same cells; else it takes one token (dw_apply). dx
//!   gathers through the mirrored offsets of the forward table (no scatter, no atomics):
//!   dx[s] = sum_o w[o] dy[nbr[s, 8 - o]] (+ dy[s]).
//! - dweight and dbias, deterministic: (tokens x samples) is cut into pieces (conv_split.hpp: the
//!   cut depends on the shapes only); in a piece each thread sums its (9 + 1) x V products (V = 2
//!   or 1) over its tokens and samples in a fixed order, the block sums its token rows in shared
//!   memory in a fixed order into one partial per piece, and a second kernel sums the pieces'
//!   partials in ascending order (no float atomics).
//! Table entries outside [0, N) read as zero (never an out-of-bounds access).
#include <greenmim/kernels.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include <greenmim/sparse_conv.hpp>

#include "detail/conv_split.hpp"
#include "detail/device_common.cuh"
#include "detail/host_checks.hpp"
#include "detail/launch.cuh"

namespace greenmim {
namespace detail {
namespace cuda {
namespace {

constexpr int k_taps = 9;          // 3 x 3
constexpr int k_dw_threads = 256;
constexpr int k_red_threads = 256;

//! Channel groups per block for `groups` groups of channels: all of them up to 32.
inline int dw_block_groups(int groups) { return groups < k_dw_max_groups ? groups : k_dw_max_groups; }

// ---- V-element row access ----------------------------------------------------------------------
// load = widen(fetch): `fetch` is the row as loaded (raw), `widen` its V
// floats, so that a thread can hold several rows' loads in flight before it converts any of them.
template <class T, int V>
struct row_io {  // V = 1 (and the generic case): element accesses
  struct raw { T e[V]; };
  __device__ __forceinline__ static raw fetch(const T* p) {
    raw r;
#pragma unroll
    for (int i = 0; i < V; ++i) r.e[i] = __ldg(p + i);
    return r;
  }
  __device__ __forceinline__ static void widen(const raw& r, float (&x)[V]) {
#pragma unroll
    for (int i = 0; i < V; ++i) x[i] = to_float(r.e[i]);
  }
  __device__ __forceinline__ static void load(const T* p, float (&x)[V]) { widen(fetch(p), x); }
  //! r = the row at p where `cond`, else r unchanged
  __device__ __forceinline__ static void fetch_if(raw& r, const T* p, bool cond) {
    if (cond) r = fetch(p);
  }
  __device__ __forceinline__ static void store(T* p, const float (&x)[V]) {
#pragma unroll
    for (int i = 0; i < V; ++i) p[i] = from_float<T>(x[i]);
  }
};

//! The 16 bytes at p into (a, b, c, d) where `cond`, else (a, b, c, d) unchanged: one predicated
//! load into the registers that hold the value kept, so that a row kept from the token before and
//! the row loaded in its place share registers (in C++, ptxas gave the load registers of its own,
//! and dw_apply spilled 120 bytes).
__device__ __forceinline__ void ldg16_if(unsigned& a, unsigned& b, unsigned& c, unsigned& d, const void* p, bool cond) {
#if defined(GREENMIM_CUDA_EMULATION)
  if (cond) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    a = v.x; b = v.y; c = v.z; d = v.w;
  }
#else
  asm("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %5, 0;\n\t@q ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
      : "+r"(a), "+r"(b), "+r"(c), "+r"(d)
      : "l"(p), "r"(static_cast<unsigned>(cond)));
#endif
}

template <>
struct row_io<float, 8> {
  struct raw { float4 a, b; };
  __device__ __forceinline__ static raw fetch(const float* p) {
    return raw{__ldg(reinterpret_cast<const float4*>(p)), __ldg(reinterpret_cast<const float4*>(p) + 1)};
  }
  __device__ __forceinline__ static void widen(const raw& r, float (&x)[8]) {
    x[0] = r.a.x; x[1] = r.a.y; x[2] = r.a.z; x[3] = r.a.w; x[4] = r.b.x; x[5] = r.b.y; x[6] = r.b.z; x[7] = r.b.w;
  }
  __device__ __forceinline__ static void load(const float* p, float (&x)[8]) { widen(fetch(p), x); }
  __device__ __forceinline__ static void fetch_if(raw& r, const float* p, bool cond) {
    unsigned u[8];
    std::memcpy(u, &r, sizeof u);
    ldg16_if(u[0], u[1], u[2], u[3], p, cond);
    ldg16_if(u[4], u[5], u[6], u[7], p + 4, cond);
    std::memcpy(&r, u, sizeof u);
  }
  __device__ __forceinline__ static void store(float* p, const float (&x)[8]) {
    reinterpret_cast<float4*>(p)[0] = make_float4(x[0], x[1], x[2], x[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(x[4], x[5], x[6], x[7]);
  }
};

//! bf16 -> fp32 of the low / high half of a 32-bit word: the bf16's bits are the float's top half
//! (what __bfloat162float does), one integer instruction each where the conversion through the
//! library made two for the high half (PRMT, then a shift).
__device__ __forceinline__ float bf16_lo(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }

template <class T>
struct row_io16 {  // 8 x 2-byte elements in one 16-byte access
  using raw = uint4;
  __device__ __forceinline__ static raw fetch(const T* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
  __device__ __forceinline__ static void fetch_if(raw& r, const T* p, bool cond) { ldg16_if(r.x, r.y, r.z, r.w, p, cond); }
  __device__ __forceinline__ static void widen(const raw& v, float (&x)[8]) {
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
#pragma unroll
      for (int i = 0; i < 4; ++i) { x[2 * i] = bf16_lo(w[i]); x[2 * i + 1] = bf16_hi(w[i]); }
    } else {
      T e[8];
      std::memcpy(e, &v, sizeof v);
#pragma unroll
      for (int i = 0; i < 8; ++i) x[i] = to_float(e[i]);
    }
  }
  __device__ __forceinline__ static void load(const T* p, float (&x)[8]) { widen(fetch(p), x); }
  __device__ __forceinline__ static void store(T* p, const float (&x)[8]) {
    T e[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) e[i] = from_float<T>(x[i]);
    uint4 v;
    std::memcpy(&v, e, sizeof v);
    *reinterpret_cast<uint4*>(p) = v;
  }
};
template <>
struct row_io<__half, 8> : row_io16<__half> {};
template <>
struct row_io<__nv_bfloat16, 8> : row_io16<__nv_bfloat16> {};

// 2 elements in one access (4 bytes for fp16/bf16, 8 for fp32): the gradient kernel's rows
template <class T>
struct row_io_pair {
  using T2 = typename elem16<T>::pair;
  __device__ __forceinline__ static void load(const T* p, float (&x)[2]) {
    const float2 f = elem16<T>::to_floats(__ldg(reinterpret_cast<const T2*>(p)));
    x[0] = f.x; x[1] = f.y;
  }
};
template <>
struct row_io<__half, 2> : row_io_pair<__half> {};
template <>
struct row_io<__nv_bfloat16, 2> {
  __device__ __forceinline__ static void load(const __nv_bfloat16* p, float (&x)[2]) {  // bf16_lo/hi
    const unsigned w = __ldg(reinterpret_cast<const unsigned*>(p));
    x[0] = bf16_lo(w); x[1] = bf16_hi(w);
  }
};
template <>
struct row_io<float, 2> {
  __device__ __forceinline__ static void load(const float* p, float (&x)[2]) {
    const float2 f = __ldg(reinterpret_cast<const float2*>(p));
    x[0] = f.x; x[1] = f.y;
  }
};

// ---- depthwise 3x3 submanifold conv ----------------------------------------------------------------
struct dw_params {
  const void* in = nullptr;   // forward: x; dx: dy
  const void* res = nullptr;  // residual source (x or dy), null = no residual
  void* out = nullptr;        // y or dx
  std::int64_t in_s0 = 0, in_s1 = 0, out_s0 = 0, out_s1 = 0;  // elements
  const index_t* nbr = nullptr;
  const float* w = nullptr;
  const float* bias = nullptr;
  int batch = 0, tokens = 0, channels = 0;
  int gb = 1;             // channel groups per block (dw_block_groups)
  int tiles_per_cta = 1;  // token tiles per CTA (dw_apply_split)
  int mirrored = 0;       // 1: dx (read the table at mirrored offsets)
  int run = 0;            // tokens a thread walks: k_dw_run (rows kept across them) or 1; 0: the
                          // launcher chooses (dw_apply_walks)
};

//! `p` unchanged, but opaque to the optimizer: dw_apply's per-sample base pointer stays one
//! register pair, so that each tap's address is a single wide multiply-add of its 32-bit offset
//! (ptxas otherwise recomputed sample * stride + offset in 64 bits at every tap: 4-6 instructions).
template <class P>
__device__ __forceinline__ P* opaque(P* p) {
#if !defined(GREENMIM_CUDA_EMULATION)
  asm("" : "+l"(p));
#endif
  return p;
}

//! Where the block's channel `cl` (group cl / V, element cl % V) keeps a tap's weight in
//! dw_apply's ws[tap][.]. V = 8: a group's two 4-float halves lie 4 * k_dw_max_groups floats
//! apart, so a quarter warp's 16-byte reads of consecutive groups are 128 contiguous bytes, free
//! of bank conflicts (the plain [group][8] layout made every read a 2-way conflict).
template <int V>
__device__ __forceinline__ int ws_slot(int cl) {
  if constexpr (V == 8) return ((cl & 7) >> 2) * (k_dw_max_groups * 4) + (cl >> 3) * 4 + (cl & 3);
  else return cl;
}

//! j's bits at the even positions: the Morton rank of (0, j), of (i, 0) shifted left by one.
__device__ __forceinline__ int morton_spread(int j) { return (j & 1) | ((j & 2) << 1) | ((j & 4) << 2); }

//! Tokens a thread walks (dw_apply): one row of a group of 8 x 8 consecutive tokens taken in
//! Morton order, as Twins' block-major plans order each unit (twins_plan.hpp), so that at stage 1
//! each token after the first is its predecessor's right neighbour and finds 6 of its 9 rows in
//! the registers of the one before.
constexpr int k_dw_run = 8;
static_assert(k_dw_run == 8, "morton_spread spreads 3 bits");
static_assert(k_dw_threads / k_dw_max_groups >= k_dw_run, "a walking block needs a whole group of token rows");

//! Block (x, y, z): channel groups [y * gb, + gb) of the token tiles [x * tpc, + tpc) of samples
//! z, z + gridDim.z, ... (tpc = p.tiles_per_cta, dw_apply_split). Walking (p.run == 8, where
//! dw_apply_walks: enough tiles to fill the GPU), a tile is rows8 / 8 groups of 64 consecutive
//! tokens (rows8: the block's token rows, 256 / gb, down to a multiple of 8), and token row r
//! walks row r % 8 of its group as if the group were an 8 x 8 square in Morton order (the
//! order of a Twins plan's unit: at stage 1 a unit is such a square), tokens group +
//! morton(r % 8, j), j = 0..7, one sample at a time, and keeps the last token's 9 rows in
//! registers: where the next token's tap o is the last one's tap o + 1 (o % 3 != 2), the same cell
//! one column on, the table says so (equal entries) and the row is not loaded again. The 8 rows
//! of a group cover its 64 tokens whatever the geometry, and the test is on the entries, so any
//! table and any token order are served exactly; only the rows loaded change. On Twins-L's
//! tables (25% visible units, tokens block-major) a walking token loads 3.75 / 4.3 rows at stages
//! 1-2 (5.3 / 6.4 at stages 3-4, which do not walk per-sample; host count of this walk), against
//! 10 for the kernel before (9 taps and the residual, which is now tap 4's row where the table has
//! the token there): fewer L1 wavefronts, which ncu measured as the limit. dx walks its rows backwards: through the mirrored table the
//! last token's tap o + 1 is then again the next one's tap o. Not walking (p.run == 1: small
//! stages, where 8 tokens a thread would leave most SMs idle), a tile is `rows` tokens, one a
//! thread, every row loaded.
//! The taps' element offsets within a sample are `Off` (uint32_t where every offset fits,
//! dw_offsets_fit_int32; else int64_t), and each tap's address is one multiply-add onto the
//! sample's base pointer (opaque). A token's loads (those not kept) issue before any row is used,
//! with no branch around them: a missing neighbour reads the token's own row, its product dropped
//! by a predicate.
//! Every output is bias (+ x) + taps 0..8 in order, whatever the run, Off or the split: the bits
//! of the kernel before.
//! History (docs/perf/kernel-journal.md): on an H100 (docs/perf/NVIDIA_H100_80GB_HBM3_2026-11-27/)
//! the kernel before this one (all taps' loads issued together, two samples a thread where B > 1;
//! bench/gpu/ab/peg_run_ab.cu keeps it) ran at 27-37% of a copy's rate, 18.4 us at Twins-L stage 1
//! per-sample, with ncu showing L1 at 78% of its throughput: 10 rows read per output. Staging a
//! tile in shared memory (the same SRAM) was 1.1-1.7x slower; holding the weights in registers
//! (occupancy) and 2 tokens a thread without reuse were slower before that. This version's speed
//! is unmeasured (peg_run_ab.cu will tell).
template <class T, int V, class Off>
__global__ void __launch_bounds__(k_dw_threads, sizeof(T) == 4 && V == 8 ? 2 : 3) dw_apply(const dw_params p) {
  // [tap][ws_slot<V>(channel in block)], and the bias as a 10th row
  __shared__ __align__(16) float ws[k_taps + 1][k_dw_max_groups * 8];
  const int groups = p.channels / V, gb = p.gb, rows = k_dw_threads / gb;
  const int g_first = static_cast<int>(blockIdx.y) * gb;
  const int gl = static_cast<int>(threadIdx.x) % gb, r = static_cast<int>(threadIdx.x) / gb;
  {  // the block's weights, read contiguously ([C, 9] rows of its channels), stored tap-major
    const int c_first = g_first * V, cw = gb * V;
    for (int i = static_cast<int>(threadIdx.x); i < k_taps * cw; i += k_dw_threads) {
      const int cl = i / k_taps, o = i % k_taps;
      ws[o][ws_slot<V>(cl)] = c_first + cl < p.channels ? __ldg(p.w + static_cast<std::int64_t>(c_first) * k_taps + i) : 0.f;
    }
    for (int cl = static_cast<int>(threadIdx.x); cl < cw; cl += k_dw_threads)
      ws[k_taps][ws_slot<V>(cl)] = p.bias && c_first + cl < p.channels ? __ldg(p.bias + c_first + cl) : 0.f;
  }
  __syncthreads();  // the only barrier: inactive threads leave after it
  const int g = g_first + gl;
  if (r >= rows || g >= groups) return;
  const int c0 = g * V;
  const T* in = static_cast<const T*>(p.in);
  const T* res = static_cast<const T*>(p.res);
  T* out = static_cast<T*>(p.out);
  // tap o's (o = 9: the bias) V weights of this thread's channels
  auto weights = [&](int o, float (&w)[V]) {
    if constexpr (V == 8) {  // the group's halves, ws_slot<8>
      const float4 lo = *reinterpret_cast<const float4*>(&ws[o][gl * 4]);
      const float4 hi = *reinterpret_cast<const float4*>(&ws[o][k_dw_max_groups * 4 + gl * 4]);
      w[0] = lo.x; w[1] = lo.y; w[2] = lo.z; w[3] = lo.w; w[4] = hi.x; w[5] = hi.y; w[6] = hi.z; w[7] = hi.w;
    } else {
#pragma unroll
      for (int v = 0; v < V; ++v) w[v] = ws[o][ws_slot<V>(gl * V + v)];
    }
  };
  using io = row_io<T, V>;
  const bool own_residual = res == in;  // the residual is the input (always, from the entry points)
  // this thread's tokens in a tile: walking (p.run == 8), row r % 8 of a group of 8 x 8 tokens in
  // Morton order (block-major Twins plans order each unit so), group + morton(r % 8, j), j = 0..7
  // (dx: 7..0); else token r alone
  const bool walks = p.run == k_dw_run;
  const int rows_used = walks ? rows / k_dw_run * k_dw_run : rows;  // dw_walk_rows
  if (r >= rows_used) return;
  const std::int64_t tile_tokens = static_cast<std::int64_t>(rows_used) * p.run;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * p.tiles_per_cta * tile_tokens +
                             (walks ? static_cast<std::int64_t>(r / k_dw_run) * (k_dw_run * k_dw_run) : r);
  const int lane = walks ? 2 * morton_spread(r % k_dw_run) : 0;  // the row's Morton offset
  for (int k = 0; k < p.tiles_per_cta; ++k) {
    const std::int64_t group = first + k * tile_tokens;  // the thread's group of 64 (walking), or token
    if (group >= p.tokens) break;
    for (int b = static_cast<int>(blockIdx.z); b < p.batch; b += static_cast<int>(gridDim.z)) {
      const T* xs = opaque(in + static_cast<std::int64_t>(b) * p.in_s0);
      typename io::raw x[k_taps] = {};  // the last token's rows of taps 0..8
      index_t prev[k_taps];             // the last token's table entries (read mirrored for dx)
      bool have_prev = false;
#pragma unroll 1
      for (int i = 0; i < p.run; ++i) {
        const std::int64_t tt = group + lane + (walks ? morton_spread(p.mirrored ? k_dw_run - 1 - i : i) : 0);
        if (tt >= p.tokens) continue;
        const int t = static_cast<int>(tt);
        // the token's 9 table entries (dx: read mirrored, o <-> 8 - o), then each tap's element
        // offset in a sample; a missing neighbour reads the token's own row instead (a real row,
        // so that every load is unconditional) and its product is dropped by a predicate, which
        // leaves acc bit for bit as skipping the tap does, Inf and NaN included
        index_t s[k_taps];
        const index_t* row = p.nbr + static_cast<std::int64_t>(t) * k_taps;
#pragma unroll
        for (int o = 0; o < k_taps; ++o) s[o] = __ldg(row + (p.mirrored ? k_taps - 1 - o : o));
        const Off own = static_cast<Off>(t) * static_cast<Off>(p.in_s1) + c0;
        unsigned pad = 0;  // bit o: tap o has no neighbour
        // tap o's row: the previous token's tap o + 1 where the table says it is the same cell (no
        // load), else loaded; o ascending reads each kept row before it is replaced
#pragma unroll
        for (int o = 0; o < k_taps; ++o) {
          const bool in_range = static_cast<unsigned>(s[o]) < static_cast<unsigned>(p.tokens);
          pad |= in_range ? 0u : 1u << o;
          const int src = o % 3 != 2 ? o + 1 : o;  // the previous token's tap at the same cell, if any
          const bool kept = src != o && have_prev && s[o] == prev[src];
          x[o] = x[src];
          io::fetch_if(x[o], xs + (in_range ? static_cast<Off>(s[o]) * static_cast<Off>(p.in_s1) + c0 : own), !kept);
        }
#pragma unroll
        for (int o = 0; o < k_taps; ++o) prev[o] = s[o];
        have_prev = true;
        float acc[V];
        weights(k_taps, acc);
        if (res) {  // the residual's row: tap 4's where the table has the token there
          float rv[V];
          if (own_residual && s[4] == t) io::widen(x[4], rv);
          else io::load(res + static_cast<std::int64_t>(b) * p.in_s0 + own, rv);
#pragma unroll
          for (int v = 0; v < V; ++v) acc[v] += rv[v];
        }
#pragma unroll
        for (int o = 0; o < k_taps; ++o) {
          const bool skip = (pad >> o) & 1u;
          float w[V], xv[V];
          weights(o, w);
          io::widen(x[o], xv);
#pragma unroll
          for (int v = 0; v < V; ++v) acc[v] = skip ? acc[v] : fmaf(w[v], xv[v], acc[v]);
        }
        io::store(out + (static_cast<std::int64_t>(b) * p.out_s0 + static_cast<std::int64_t>(t) * p.out_s1 + c0), acc);
      }
    }
  }
}

struct dw_grad_params {
  const void* x = nullptr;
  const void* dy = nullptr;
  std::int64_t x_s0 = 0, x_s1 = 0, dy_s0 = 0, dy_s1 = 0;
  const index_t* nbr = nullptr;
  float* partial = nullptr;  // [parts, C, 10]
  int batch = 0, tokens = 0, channels = 0;
  int gb = 1;                // channel groups per block (dw_block_groups)
  dw_grad_split split;
};

//! One piece's partials of dweight (taps 0..8) and dbias (slot 9): block (x, y, z) = channel
//! groups [x * gb, + gb) x tokens of tile y x samples of chunk z; partial index z * tiles + y.
//! 3 CTAs per SM (at most 80 registers; no spills on sm_80 or sm_90). Before the 32-bit offsets,
//! `__launch_bounds__(256, 1)` made ptxas schedule the branch-free taps better (80 registers
//! instead of 75) and the PEG backward at Twins-L stage 1 took 56 us instead of 68 (H100); the
//! 32-bit path now takes 69-71 registers whatever the minimum, and the minimum of 3 keeps the
//! others (V = 1, or 64-bit offsets: 88-93 registers with a minimum of 1) at 3 CTAs per SM.
//! H100, 2026-11-27: 27.0 us at Twins-L stage 1 per-sample (38.8 before the 32-bit offsets);
//! latency-bound (ncu: L1 34%, occupancy 35%). 4 channels a thread (92 registers, 2 CTAs per SM)
//! was 1.07-1.33x slower.
template <class T, int V, class Off>
__global__ void __launch_bounds__(k_dw_threads, 3) dw_grad_partial(const dw_grad_params p) {
  constexpr int K = (k_taps + 1) * V;  // a thread's sums: [tap or bias][v]
  __shared__ float red[K][k_dw_threads];
  const int groups = p.channels / V, gb = p.gb, rows = k_dw_threads / gb;
  const int gl = static_cast<int>(threadIdx.x) % gb, r = static_cast<int>(threadIdx.x) / gb;
  const int g = static_cast<int>(blockIdx.x) * gb + gl, c0 = g * V;
  const int tile = static_cast<int>(blockIdx.y), chunk = static_cast<int>(blockIdx.z);
  const std::int64_t t_end = static_cast<std::int64_t>(tile + 1) * p.split.tile;   // int64: no wrap near 2^31
  const std::int64_t b_end = static_cast<std::int64_t>(chunk + 1) * p.split.chunk;
  const int t0 = tile * p.split.tile, t1 = t_end < p.tokens ? static_cast<int>(t_end) : p.tokens;
  const int b0 = chunk * p.split.chunk, b1 = b_end < p.batch ? static_cast<int>(b_end) : p.batch;
  const T* x = static_cast<const T*>(p.x);
  const T* dy = static_cast<const T*>(p.dy);
  float acc[K];
#pragma unroll
  for (int k = 0; k < K; ++k) acc[k] = 0.f;
  if (r < rows && g < groups) {
    for (int t = t0 + r; t < t1; t += rows) {
      // each tap's x row offset in a sample, computed once per token (an offset
      // per tap and sample was a 64-bit multiply-add: most of this loop's instructions); a missing
      // neighbour reads x's own row instead (a real row) and its product is dropped by a
      // predicate, which leaves acc bit for bit as skipping the tap does, even where that row
      // holds Inf or NaN, and keeps the taps free of branches so that the loads of (t, b) issue
      // together (the PEG backward at Twins-L stage 1 took 56 us instead of 92 on an H100)
      const index_t* row = p.nbr + static_cast<std::int64_t>(t) * k_taps;
      const Off own = static_cast<Off>(t) * static_cast<Off>(p.x_s1) + c0;
      Off xo[k_taps];
      unsigned pad = 0;  // bit o: tap o has no neighbour
#pragma unroll
      for (int o = 0; o < k_taps; ++o) {
        const index_t s = __ldg(row + o);
        const bool in_range = static_cast<unsigned>(s) < static_cast<unsigned>(p.tokens);
        xo[o] = in_range ? static_cast<Off>(s) * static_cast<Off>(p.x_s1) + c0 : own;
        pad |= in_range ? 0u : 1u << o;
      }
      const Off dyo = static_cast<Off>(t) * static_cast<Off>(p.dy_s1) + c0;
      for (int b = b0; b < b1; ++b) {
        const T* xb = opaque(x + static_cast<std::int64_t>(b) * p.x_s0);
        float d[V];
        row_io<T, V>::load(dy + static_cast<std::int64_t>(b) * p.dy_s0 + dyo, d);
#pragma unroll
        for (int v = 0; v < V; ++v) acc[k_taps * V + v] += d[v];
#pragma unroll
        for (int o = 0; o < k_taps; ++o) {
          const bool skip = (pad >> o) & 1u;
          float xv[V];
          row_io<T, V>::load(xb + xo[o], xv);
#pragma unroll
          for (int v = 0; v < V; ++v) {
            const float f = fmaf(d[v], xv[v], acc[o * V + v]);
            acc[o * V + v] = skip ? acc[o * V + v] : f;
          }
        }
      }
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) red[k][threadIdx.x] = acc[k];
  __syncthreads();
  // the block's gb x K sums over its token rows, rows ascending
  const std::int64_t part = static_cast<std::int64_t>(chunk) * p.split.tiles + tile;
  for (int j = static_cast<int>(threadIdx.x); j < gb * K; j += k_dw_threads) {
    const int jl = j / K, k = j % K, gg = static_cast<int>(blockIdx.x) * gb + jl;
    if (gg >= groups) continue;
    float s = 0.f;
    for (int rr = 0; rr < rows; ++rr) s += red[k][rr * gb + jl];
    const int o = k / V, v = k % V;
    p.partial[(part * p.channels + gg * V + v) * (k_taps + 1) + o] = s;
  }
}

//! dweight[c, o] / dbias[c] = the pieces' partials summed in a fixed order (below).
__global__ void __launch_bounds__(k_red_threads) dw_grad_reduce(const float* partial, std::int64_t parts, int channels,
                                                               float* dweight, float* dbias) {
  // 32 outputs per CTA (one per lane, coalesced); warp w sums the parts w, w + 8, ... in order, then
  // lane 0's warp adds the 8 warps' sums in warp order: a fixed order, from the shapes alone
  constexpr int warps = k_red_threads / 32;
  __shared__ float sums[warps][32];
  const int lane = static_cast<int>(threadIdx.x) % 32, w = static_cast<int>(threadIdx.x) / 32;
  const std::int64_t outs = static_cast<std::int64_t>(channels) * (k_taps + 1);
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * 32 + lane;
  float s = 0.f;
  if (i < outs) {
#pragma unroll 4
    for (std::int64_t part = w; part < parts; part += warps) s += partial[part * outs + i];
  }
  sums[w][lane] = s;
  __syncthreads();
  if (w != 0 || i >= outs) return;
  float t = sums[0][lane];
#pragma unroll
  for (int k = 1; k < warps; ++k) t += sums[k][lane];
  const int c = static_cast<int>(i / (k_taps + 1)), o = static_cast<int>(i % (k_taps + 1));
  if (o < k_taps) {
    if (dweight) dweight[static_cast<std::int64_t>(c) * k_taps + o] = t;
  } else if (dbias) {
    dbias[c] = t;
  }
}

cudaError_t check_dw_args(const gm_depthwise_conv_args* a, bool backward) {
  clear_refusal();
  GM_REFUSE_IF(a == nullptr, "args is null");
  GM_REFUSE_IF(!valid_dtype(a->dtype), "dtype must be GM_FLOAT32, GM_FLOAT16 or GM_BFLOAT16");
  GM_REFUSE_IF(a->kernel != 3, "kernel must be 3 (the kernels implement PEG's 3x3; the CPU reference takes any odd k)");
  GM_REFUSE_IF(a->x.rank != 3, "x must have rank 3");
  const std::int64_t B = a->x.extent[0], N = a->x.extent[1], C = a->x.extent[2];
  GM_REFUSE_IF(B < 0 || N < 0 || C < 0, "negative extent");
  // B < 2^30: the forward's sample index b + grid.z (grid.z <= 65535) stays an int
  GM_REFUSE_IF(N > 0x7fffffff / k_taps || C > 0x7fffffff / (k_taps + 1) || B >= (std::int64_t(1) << 30),
               "extents too large (B < 2^30, N <= 238,609,294)");
  GM_REFUSE_IF(C > 65535LL * k_dw_max_groups, "too many channels (C > 2,097,120)");
  const std::size_t es = dtype_bytes(a->dtype);
  const std::int64_t e[3] = {B, N, C};
  GM_TRY(check_tensor(a->x, 3, e, es, true, false, "x must be [B, N, C], element-aligned, unit last stride"));
  GM_REFUSE_IF(N > 0 && a->nbr == nullptr, "nbr is null");
  GM_REFUSE_IF(C > 0 && a->weight == nullptr, "weight is null");
  GM_REFUSE_IF(!aligned4(a->nbr) || !aligned4(a->weight), "nbr and weight must be 4-byte aligned");
  GM_REFUSE_IF(backward ? !aligned4(a->dweight) || !aligned4(a->dbias) : !aligned4(a->bias),
               backward ? "dweight and dbias must be 4-byte aligned" : "bias must be 4-byte aligned");
  if (!backward) {
    GM_TRY(check_tensor(a->y, 3, e, es, true, true, "y must be [B, N, C], element-aligned, unit last stride, injective"));
    GM_REFUSE_IF(overlap(a->x, es, a->y, es), "x and y overlap");
  } else {
    GM_TRY(check_tensor(a->dy, 3, e, es, true, false, "dy must be [B, N, C], element-aligned, unit last stride"));
    GM_TRY(check_tensor(a->dx, 3, e, es, true, true, "dx must be [B, N, C], element-aligned, unit last stride, injective"));
    GM_REFUSE_IF(overlap(a->x, es, a->dx, es) || overlap(a->dy, es, a->dx, es), "dx overlaps x or dy");
  }
  return cudaSuccess;
}

std::size_t dw_workspace_bytes(const gm_depthwise_conv_args* a) {
  if (a->dweight == nullptr && a->dbias == nullptr) return 0;
  const std::int64_t B = a->x.extent[0], N = a->x.extent[1], C = a->x.extent[2];
  if (B == 0 || N == 0 || C == 0) return 0;
  return static_cast<std::size_t>(dw_grad_split_for(N, B, C).parts() * C * (k_taps + 1)) * sizeof(float);
}

bool dw_vectorizable(const gm_depthwise_conv_args* a, bool backward) {
  const std::size_t es = dtype_bytes(a->dtype);
  if (a->x.extent[2] % 8 != 0) return false;
  if (!backward) return rows_aligned16(a->x, es) && rows_aligned16(a->y, es);
  return rows_aligned16(a->x, es) && rows_aligned16(a->dy, es) && rows_aligned16(a->dx, es);
}

template <class T, int V>
cudaError_t launch_dw_apply(dw_params p, cudaStream_t stream) {
  const int groups = p.channels / V;
  p.gb = dw_block_groups(groups);
  const std::int64_t rows = k_dw_threads / p.gb, cblocks = (groups + p.gb - 1) / p.gb;
  if (p.run == 0) p.run = dw_apply_walks(p.tokens, rows, cblocks, p.batch) ? k_dw_run : 1;  // 0: choose
  p.run = p.run == k_dw_run ? k_dw_run : 1;  // the kernel's two ways, whatever was asked
  const std::int64_t tile_tokens = p.run == k_dw_run ? dw_walk_rows(rows) * k_dw_run : rows;
  const std::int64_t tiles = (p.tokens + tile_tokens - 1) / tile_tokens;
  const dw_apply_split sp = dw_apply_split_for(tiles, cblocks, p.batch);
  p.tiles_per_cta = sp.tiles_per_cta;
  const dim3 grid(static_cast<unsigned>(sp.grid_x), static_cast<unsigned>(cblocks), static_cast<unsigned>(sp.grid_z));
  // 32-bit offsets within a sample where every row's (strides are non-negative) fits an int
  if (dw_offsets_fit_int32(p.tokens, p.in_s1, p.channels))
    return launch(dw_apply<T, V, std::uint32_t>, grid, k_dw_threads, 0, stream, p);
  return launch(dw_apply<T, V, std::int64_t>, grid, k_dw_threads, 0, stream, p);
}

//! The apply kernel's parameters for `in` -> `out` (x -> y, or dy -> dx through the mirrored table).
dw_params apply_params(const gm_depthwise_conv_args* a, const gm_tensor& in, const gm_tensor& out) {
  dw_params p;
  p.in = in.data;
  p.res = a->residual ? in.data : nullptr;
  p.out = out.data;
  p.in_s0 = in.stride[0]; p.in_s1 = in.stride[1];
  p.out_s0 = out.stride[0]; p.out_s1 = out.stride[1];
  p.nbr = a->nbr;
  p.w = a->weight;
  p.batch = static_cast<int>(a->x.extent[0]);
  p.tokens = static_cast<int>(a->x.extent[1]);
  p.channels = static_cast<int>(a->x.extent[2]);
  return p;
}

template <class T>
cudaError_t run_dw_fwd(const gm_depthwise_conv_args* a, cudaStream_t stream) {
  dw_params p = apply_params(a, a->x, a->y);
  p.bias = a->bias;
  if (p.batch == 0 || p.tokens == 0 || p.channels == 0) return cudaSuccess;
  return dw_vectorizable(a, false) ? launch_dw_apply<T, 8>(p, stream) : launch_dw_apply<T, 1>(p, stream);
}

template <class T>
cudaError_t run_dw_bwd(const gm_depthwise_conv_args* a, void* workspace, cudaStream_t stream) {
  const int B = static_cast<int>(a->x.extent[0]), N = static_cast<int>(a->x.extent[1]), C = static_cast<int>(a->x.extent[2]);
  const bool vec = dw_vectorizable(a, true);
  if (C > 0 && (a->dweight || a->dbias) && (B == 0 || N == 0)) {  // empty batch: zero gradients
    if (a->dweight) GM_TRY(cudaMemsetAsync(a->dweight, 0, static_cast<std::size_t>(C) * k_taps * sizeof(float), stream));
    if (a->dbias) GM_TRY(cudaMemsetAsync(a->dbias, 0, static_cast<std::size_t>(C) * sizeof(float), stream));
  }
  if (B == 0 || N == 0 || C == 0) return cudaSuccess;
  dw_params p = apply_params(a, a->dy, a->dx);
  p.mirrored = 1;
  GM_TRY((vec ? launch_dw_apply<T, 8>(p, stream) : launch_dw_apply<T, 1>(p, stream)));
  if (!a->dweight && !a->dbias) return cudaSuccess;
  dw_grad_params g;
  g.x = a->x.data;
  g.dy = a->dy.data;
  g.x_s0 = a->x.stride[0]; g.x_s1 = a->x.stride[1];
  g.dy_s0 = a->dy.stride[0]; g.dy_s1 = a->dy.stride[1];
  g.nbr = a->nbr;
  g.partial = static_cast<float*>(workspace);
  g.batch = B;
  g.tokens = N;
  g.channels = C;
  g.split = dw_grad_split_for(N, B, C);
  const int groups = vec ? C / 2 : C;  // V = 2 where the forward vectorizes (rows 16-byte aligned, C % 8 == 0)
  // groups per block from C alone, not from V: the token rows per block (256 / gb) set the order of
  // the sums, which must not depend on the inputs' alignment
  g.gb = dw_block_groups((C + 1) / 2);
  const dim3 grid(static_cast<unsigned>((groups + g.gb - 1) / g.gb), static_cast<unsigned>(g.split.tiles),
                  static_cast<unsigned>(g.split.chunks));
  // 32-bit row offsets within a sample where x's and dy's fit an int (dw_offsets_fit_int32)
  const bool off32 = dw_offsets_fit_int32(N, g.x_s1, C) && dw_offsets_fit_int32(N, g.dy_s1, C);
  if (vec && off32)
    GM_TRY((launch(dw_grad_partial<T, 2, std::uint32_t>, grid, k_dw_threads, 0, stream, g)));
  else if (vec)
    GM_TRY((launch(dw_grad_partial<T, 2, std::int64_t>, grid, k_dw_threads, 0, stream, g)));
  else if (off32)
    GM_TRY((launch(dw_grad_partial<T, 1, std::uint32_t>, grid, k_dw_threads, 0, stream, g)));
  else
    GM_TRY((launch(dw_grad_partial<T, 1, std::int64_t>, grid, k_dw_threads, 0, stream, g)));
  const std::int64_t outs = static_cast<std::int64_t>(C) * (k_taps + 1);
  return launch(dw_grad_reduce, dim3(static_cast<unsigned>((outs + 31) / 32)), k_red_threads,
                0, stream, static_cast<const float*>(workspace), g.split.parts(), C, a->dweight, a->dbias);
}

}  // namespace
}  // namespace cuda
}  // namespace detail
}  // namespace greenmim

using namespace greenmim::detail::cuda;

extern "C" cudaError_t gm_depthwise_conv_fwd_can_implement(const gm_depthwise_conv_args* args) {
  return no_throw([&] { return check_dw_args(args, false); });
}

extern "C" cudaError_t gm_depthwise_conv_fwd(const gm_depthwise_conv_args* args, cudaStream_t stream) {
  return no_throw([&]() -> cudaError_t {
    GM_TRY(check_dw_args(args, false));
    return with_element_type(args->dtype, [&](auto t) { return run_dw_fwd<typename decltype(t)::type>(args, stream); });
  });
}

extern "C" cudaError_t gm_depthwise_conv_bwd_can_implement(const gm_depthwise_conv_args* args) {
  return no_throw([&] { return check_dw_args(args, true); });
}

extern "C" cudaError_t gm_depthwise_conv_bwd_workspace_size(const gm_depthwise_conv_args* args, size_t* bytes) {
  return no_throw([&]() -> cudaError_t {
    GM_TRY(check_dw_args(args, true));
    GM_REFUSE_IF(bytes == nullptr, "bytes is null");
    *bytes = dw_workspace_bytes(args);
    return cudaSuccess;
  });
}

extern "C" cudaError_t gm_depthwise_conv_bwd(const gm_depthwise_conv_args* args, void* workspace,
                                             size_t workspace_bytes, cudaStream_t stream) {
  return no_throw([&]() -> cudaError_t {
    GM_TRY(check_dw_args(args, true));
    const std::size_t need = dw_workspace_bytes(args);
    GM_REFUSE_IF(workspace_bytes < need, "workspace too small (gm_depthwise_conv_bwd_workspace_size)");
    GM_REFUSE_IF(need > 0 && (workspace == nullptr || reinterpret_cast<std::uintptr_t>(workspace) % 16 != 0),
                 "workspace must be non-null and 16-byte aligned");
    return with_element_type(args->dtype, [&](auto t) { return run_dw_bwd<typename decltype(t)::type>(args, workspace, stream); });
  });
}
