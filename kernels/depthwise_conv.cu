//! \file depthwise_conv.cu
//! The depthwise k x k submanifold conv on visible tokens (Twins' PEG: 3 x 3; ConvNeXt: 7 x 7; any
//! odd k up to 7), forward and backward
//! (docs/sparse-conv.md; neighbour tables from include/greenmim/sparse_conv.hpp, built on the
//! host). fp32/fp16/bf16 features, fp32 weights and accumulation. This file is the entry point:
//! argument checks, the workspace size, the launchers (which path, which grid) and the C ABI.
//! The kernels live in concern headers under detail/:
//! - dw_apply.cuh: forward and dx, one kernel. A block is `rows` token rows x `gb` channel groups
//!   of V channels (V = 8: 16-byte vectors, C % 8 == 0 and 16-byte aligned rows; else V = 1),
//!   gb = min(C / V, 32); it walks several token tiles and samples (dw_apply_split_for). Where
//!   enough tiles remain (dw_apply_walks), a thread walks 8 tokens (a row of a Morton-ordered
//!   group of 64) and keeps the last token's rows where the next token's taps are the same cells;
//!   else it takes one token. dx gathers through the mirrored offsets of the forward table (no
//!   scatter, no atomics): dx[s] = sum_o w[o] dy[nbr[s, 8 - o]] (+ dy[s]).
//! - dw_grad.cuh: dweight and dbias, deterministic: (tokens x samples) is cut into pieces (the cut
//!   depends on the shapes only); in a piece each thread sums its (9 + 1) x V products (V = 2 or
//!   1) over its tokens and samples in a fixed order, the block sums its token rows in shared
//!   memory in a fixed order into one partial per piece, and a second kernel sums the pieces'
//!   partials in ascending order (no float atomics).
//! - dw_taps.cuh: every other odd k (1, 5, 7), forward, dx, dweight and dbias, k a runtime value:
//!   one token a thread, the stencil a row at a time; dweight cut and summed as dw_grad.cuh's, a
//!   CTA per tap row. k = 3 always takes the kernels above (their bits and registers).
//! - dw_weights.cuh (the block's weights in shared memory, tap-major), row_io.cuh (row loads and
//!   stores), ptx.cuh (predicated loads), conv_split.hpp (grids and pieces: host arithmetic).
//! Table entries outside [0, N) read as zero (never an out-of-bounds access).
#include <greenmim/kernels.h>

#include <cstdint>

#include <greenmim/sparse_conv.hpp>

#include "detail/conv_split.hpp"
#include "detail/device_common.cuh"
#include "detail/dw_apply.cuh"
#include "detail/dw_grad.cuh"
#include "detail/dw_taps.cuh"
#include "detail/dw_weights.cuh"
#include "detail/host_checks.hpp"
#include "detail/launch.cuh"

namespace greenmim {
namespace detail {
namespace cuda {
namespace {

cudaError_t check_dw_args(const gm_depthwise_conv_args* a, bool backward) {
  clear_refusal();
  GM_REFUSE_IF(a == nullptr, "args is null");
  GM_REFUSE_IF(!valid_dtype(a->dtype), "dtype must be GM_FLOAT32, GM_FLOAT16 or GM_BFLOAT16");
  GM_REFUSE_IF(a->kernel % 2 == 0, "kernel must be odd (a submanifold stencil is centred on its token)");
  GM_REFUSE_IF(a->kernel < 1 || a->kernel > k_dwk_max_kernel,
               "kernel must be 1, 3, 5 or 7 (the kernels' stencils; the CPU reference takes any odd k up to 15)");
  GM_REFUSE_IF(a->x.rank != 3, "x must have rank 3");
  const std::int64_t B = a->x.extent[0], N = a->x.extent[1], C = a->x.extent[2];
  const std::int64_t taps = static_cast<std::int64_t>(a->kernel) * a->kernel;
  GM_REFUSE_IF(B < 0 || N < 0 || C < 0, "negative extent");
  // B < 2^30: the forward's sample index b + grid.z (grid.z <= 65535) stays an int
  GM_REFUSE_IF(N > 0x7fffffff / taps || C > 0x7fffffff / (taps + 1) || B >= (std::int64_t(1) << 30),
               "extents too large (B < 2^30, N * k * k < 2^31, C * (k * k + 1) < 2^31)");
  GM_REFUSE_IF(a->kernel == 3 && C > 65535LL * k_dw_max_groups, "too many channels (C > 2,097,120)");
  GM_REFUSE_IF(a->kernel != 3 && C > 65535LL * k_dwk_groups, "too many channels (C > 1,048,560 for k != 3)");
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
  if (a->kernel != 3)
    return static_cast<std::size_t>(dw_grad_split_taps(N, B, C, a->kernel).parts() * C *
                                    (static_cast<std::int64_t>(a->kernel) * a->kernel + 1)) * sizeof(float);
  return static_cast<std::size_t>(dw_grad_split_for(N, B, C).parts() * C * (k_dw_taps + 1)) * sizeof(float);
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

//! The apply kernels' parameters for `in` -> `out` (x -> y, or dy -> dx through the mirrored
//! table): the fields `dw_params` (3x3) and `dw_taps_params` (k x k) share.
template <class Params>
Params apply_params(const gm_depthwise_conv_args* a, const gm_tensor& in, const gm_tensor& out) {
  Params p;
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

//! An empty batch's weight and bias gradients: zeros (C x taps and C floats), as the reference's.
cudaError_t zero_empty_grads(const gm_depthwise_conv_args* a, int taps, cudaStream_t stream) {
  const auto C = static_cast<std::size_t>(a->x.extent[2]);
  if (C == 0 || (a->x.extent[0] != 0 && a->x.extent[1] != 0)) return cudaSuccess;
  if (a->dweight) GM_TRY(cudaMemsetAsync(a->dweight, 0, C * static_cast<std::size_t>(taps) * sizeof(float), stream));
  if (a->dbias) GM_TRY(cudaMemsetAsync(a->dbias, 0, C * sizeof(float), stream));
  return cudaSuccess;
}

//! The weight-gradient kernels' parameters (x and dy, the table, the workspace's partial sums):
//! the fields `dw_grad_params` (3x3) and `dw_grad_taps_params` (k x k) share.
template <class Grad>
Grad grad_params(const gm_depthwise_conv_args* a, void* workspace) {
  Grad g;
  g.x = a->x.data;
  g.dy = a->dy.data;
  g.x_s0 = a->x.stride[0]; g.x_s1 = a->x.stride[1];
  g.dy_s0 = a->dy.stride[0]; g.dy_s1 = a->dy.stride[1];
  g.nbr = a->nbr;
  g.partial = static_cast<float*>(workspace);
  g.batch = static_cast<int>(a->x.extent[0]);
  g.tokens = static_cast<int>(a->x.extent[1]);
  g.channels = static_cast<int>(a->x.extent[2]);
  return g;
}

template <class T>
cudaError_t run_dw_fwd(const gm_depthwise_conv_args* a, cudaStream_t stream) {
  dw_params p = apply_params<dw_params>(a, a->x, a->y);
  p.bias = a->bias;
  if (p.batch == 0 || p.tokens == 0 || p.channels == 0) return cudaSuccess;
  return dw_vectorizable(a, false) ? launch_dw_apply<T, 8>(p, stream) : launch_dw_apply<T, 1>(p, stream);
}

template <class T>
cudaError_t run_dw_bwd(const gm_depthwise_conv_args* a, void* workspace, cudaStream_t stream) {
  const int B = static_cast<int>(a->x.extent[0]), N = static_cast<int>(a->x.extent[1]), C = static_cast<int>(a->x.extent[2]);
  const bool vec = dw_vectorizable(a, true);
  GM_TRY(zero_empty_grads(a, k_dw_taps, stream));
  if (B == 0 || N == 0 || C == 0) return cudaSuccess;
  dw_params p = apply_params<dw_params>(a, a->dy, a->dx);
  p.mirrored = 1;
  GM_TRY((vec ? launch_dw_apply<T, 8>(p, stream) : launch_dw_apply<T, 1>(p, stream)));
  if (!a->dweight && !a->dbias) return cudaSuccess;
  dw_grad_params g = grad_params<dw_grad_params>(a, workspace);
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
  const std::int64_t outs = static_cast<std::int64_t>(C) * (k_dw_taps + 1);
  return launch(dw_grad_reduce, dim3(static_cast<unsigned>((outs + 31) / 32)), k_dw_red_threads,
                0, stream, static_cast<const float*>(workspace), g.split.parts(), C, a->dweight, a->dbias);
}


// ---- any other odd k (dw_taps.cuh) ------------------------------------------------------------

template <class T, int V>
cudaError_t launch_dw_apply_taps(dw_taps_params p, cudaStream_t stream) {
  const int groups = p.channels / V;
  p.gb = dw_taps_block_groups(groups);
  const std::int64_t rows = k_dw_threads / p.gb, cblocks = (groups + p.gb - 1) / p.gb;
  const std::int64_t tiles = (p.tokens + rows - 1) / rows;
  const dw_apply_split sp = dw_apply_split_for(tiles, cblocks, p.batch);
  p.tiles_per_cta = sp.tiles_per_cta;
  const dim3 grid(static_cast<unsigned>(sp.grid_x), static_cast<unsigned>(cblocks), static_cast<unsigned>(sp.grid_z));
  if (dw_offsets_fit_int32(p.tokens, p.in_s1, p.channels))
    return launch(dw_apply_taps<T, V, std::uint32_t>, grid, k_dw_threads, 0, stream, p);
  return launch(dw_apply_taps<T, V, std::int64_t>, grid, k_dw_threads, 0, stream, p);
}

dw_taps_params taps_params(const gm_depthwise_conv_args* a, const gm_tensor& in, const gm_tensor& out) {
  dw_taps_params p = apply_params<dw_taps_params>(a, in, out);
  p.kernel = a->kernel;
  return p;
}

template <class T>
cudaError_t run_dw_taps_fwd(const gm_depthwise_conv_args* a, cudaStream_t stream) {
  dw_taps_params p = taps_params(a, a->x, a->y);
  p.bias = a->bias;
  if (p.batch == 0 || p.tokens == 0 || p.channels == 0) return cudaSuccess;
  return dw_vectorizable(a, false) ? launch_dw_apply_taps<T, 8>(p, stream) : launch_dw_apply_taps<T, 1>(p, stream);
}

template <class T>
cudaError_t run_dw_taps_bwd(const gm_depthwise_conv_args* a, void* workspace, cudaStream_t stream) {
  const int B = static_cast<int>(a->x.extent[0]), N = static_cast<int>(a->x.extent[1]), C = static_cast<int>(a->x.extent[2]);
  const int k = a->kernel, taps = k * k;
  const bool vec = dw_vectorizable(a, true);
  GM_TRY(zero_empty_grads(a, taps, stream));
  if (B == 0 || N == 0 || C == 0) return cudaSuccess;
  dw_taps_params p = taps_params(a, a->dy, a->dx);
  p.mirrored = 1;
  GM_TRY((vec ? launch_dw_apply_taps<T, 8>(p, stream) : launch_dw_apply_taps<T, 1>(p, stream)));
  if (!a->dweight && !a->dbias) return cudaSuccess;
  dw_grad_taps_params g = grad_params<dw_grad_taps_params>(a, workspace);
  g.kernel = k;
  g.split = dw_grad_split_taps(N, B, C, k);
  const int groups = vec ? C / 2 : C;
  g.gb = dw_block_groups((C + 1) / 2);  // from C alone (the sums' order must not depend on alignment)
  const std::int64_t cblocks = (groups + g.gb - 1) / g.gb;
  const dim3 grid(static_cast<unsigned>(cblocks * k), static_cast<unsigned>(g.split.tiles),
                  static_cast<unsigned>(g.split.chunks));
  const bool off32 = dw_offsets_fit_int32(N, g.x_s1, C) && dw_offsets_fit_int32(N, g.dy_s1, C);
  if (vec && off32)
    GM_TRY((launch(dw_grad_taps_partial<T, 2, std::uint32_t>, grid, k_dw_threads, 0, stream, g)));
  else if (vec)
    GM_TRY((launch(dw_grad_taps_partial<T, 2, std::int64_t>, grid, k_dw_threads, 0, stream, g)));
  else if (off32)
    GM_TRY((launch(dw_grad_taps_partial<T, 1, std::uint32_t>, grid, k_dw_threads, 0, stream, g)));
  else
    GM_TRY((launch(dw_grad_taps_partial<T, 1, std::int64_t>, grid, k_dw_threads, 0, stream, g)));
  const std::int64_t outs = static_cast<std::int64_t>(C) * (taps + 1);
  return launch(dw_grad_taps_reduce, dim3(static_cast<unsigned>((outs + 31) / 32)), k_dw_red_threads, 0, stream,
                static_cast<const float*>(workspace), g.split.parts(), C, taps, a->dweight, a->dbias);
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
    return with_element_type(args->dtype, [&](auto t) {
      using T = typename decltype(t)::type;
      return args->kernel == 3 ? run_dw_fwd<T>(args, stream) : run_dw_taps_fwd<T>(args, stream);
    });
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
    return with_element_type(args->dtype, [&](auto t) {
      using T = typename decltype(t)::type;
      return args->kernel == 3 ? run_dw_bwd<T>(args, workspace, stream) : run_dw_taps_bwd<T>(args, workspace, stream);
    });
  });
}
