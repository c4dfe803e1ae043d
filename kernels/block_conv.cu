//! \file block_conv.cu
//! EXPERIMENTAL (docs/sparse-conv.md "The fused block conv: experimental, and why"): the C ABI's
//! fused kernel = stride block conv on visible tokens (Twins' GSA sub-sampling, patch embedding),
//! forward and backward, as gather + GEMM (block tables from include/greenmim/sparse_conv.hpp).
//! The PyTorch package reaches it only with `block_conv(..., algo="fused")`: by default it runs a
//! GEMM over a view of x (whole blocks) or a row gather + cuBLAS, 1.3-3.1x faster on an H200.
//! This file is the entry point: argument checks, the workspace, the launchers (which kernel,
//! which split) and the C ABI. The three products are operators (detail/block_conv_ops.cuh) run
//! by one of three GEMM kernels: fp32 on CUDA cores (detail/gather_gemm_simt.cuh), fp16/bf16 on
//! tensor cores (detail/gather_gemm_mma.cuh), the forward with aligned rows through a cp.async
//! ring (detail/gather_gemm_async.cuh). Where the output tiles alone are too few CTAs the
//! reduction is split (split-K: grid.z, detail/conv_split.hpp, a function of the shapes only):
//! each split writes fp32 partials to the workspace and a second kernel sums them in split order
//! and stores (deterministic, no atomics):
//! - forward  Y[b*N_next + n, o] = sum_k A[., k] W'[o, k] + bias[o], A[n, p*C_in + c] =
//!   x[b, gather[n*s*s + p], c], W'[o, p*C_in + c] = weight[o, c, p] (PyTorch's layout);
//! - dx: zeroed, then dA = dY W' scattered to x's rows through the table (each input in at most
//!   one block: plain stores);
//! - dweight = dY^T A over all rows, with dbias as one more column of the gathered operand (all
//!   ones), so both share the GEMM and its split.
//! Table entries outside [0, N) read as zero / are skipped (never an out-of-bounds access).
#include <greenmim/kernels.h>

#include <cstdint>
#include <type_traits>

#include <greenmim/sparse_conv.hpp>

#include "detail/block_conv_ops.cuh"
#include "detail/conv_split.hpp"
#include "detail/device_common.cuh"
#include "detail/gather_gemm_async.cuh"
#include "detail/gather_gemm_simt.cuh"
#include "detail/host_checks.hpp"
#include "detail/launch.cuh"

namespace greenmim {
namespace detail {
namespace cuda {
namespace {

cudaError_t check_block_args(const gm_block_conv_args* a, bool backward) {
  clear_refusal();
  GM_REFUSE_IF(a == nullptr, "args is null");
  GM_REFUSE_IF(!valid_dtype(a->dtype), "dtype must be GM_FLOAT32, GM_FLOAT16 or GM_BFLOAT16");
  GM_REFUSE_IF(a->stride < 1 || a->stride > 64, "stride must be in [1, 64]");
  GM_REFUSE_IF(a->x.rank != 3, "x must have rank 3");
  const gm_tensor& out = backward ? a->dy : a->y;
  GM_REFUSE_IF(out.rank != 3, backward ? "dy must have rank 3" : "y must have rank 3");
  const std::int64_t B = a->x.extent[0], N = a->x.extent[1], Ci = a->x.extent[2];
  const std::int64_t Nn = out.extent[1], Co = out.extent[2], P = static_cast<std::int64_t>(a->stride) * a->stride;
  GM_REFUSE_IF(B < 0 || N < 0 || Ci < 0 || Nn < 0 || Co < 0, "negative extent");
  GM_REFUSE_IF(B > 0x7fffffff || N > 0x7fffffff || Nn > 0x7fffffff || mul_sat(B, Nn) > 0x7fffffff ||
                   mul_sat(mul_sat(B, N), Ci) > 0x7fffffff || mul_sat(P, Ci) > 0x7fffffff || Co > 0x7fffffff,
               "extents too large for int32 GEMM indices");
  GM_REFUSE_IF((B * Nn + k_bm - 1) / k_bm > 65535 || (Co + k_bm - 1) / k_bm > 65535, "too many rows for the grid");
  GM_REFUSE_IF(P * Ci > 0x7fffffff - 8,
               "extents too large for int32 GEMM indices (s * s * C_in + 1, rounded up to 8 for the tensor cores)");
  const std::size_t es = dtype_bytes(a->dtype);
  const std::int64_t xe[3] = {B, N, Ci}, oe[3] = {B, Nn, Co};
  GM_TRY(check_tensor(a->x, 3, xe, es, true, false, "x must be [B, N, C_in], element-aligned, unit last stride"));
  GM_REFUSE_IF(Nn > 0 && a->gather == nullptr, "gather is null");
  GM_REFUSE_IF(Co > 0 && Ci > 0 && a->weight == nullptr, "weight is null");
  GM_REFUSE_IF(!aligned4(a->gather) || !aligned4(a->weight), "gather and weight must be 4-byte aligned");
  GM_REFUSE_IF(backward ? !aligned4(a->dweight) || !aligned4(a->dbias) : !aligned4(a->bias),
               backward ? "dweight and dbias must be 4-byte aligned" : "bias must be 4-byte aligned");
  if (!backward) {
    GM_TRY(check_tensor(a->y, 3, oe, es, true, true,
                        "y must be [B, N_next, C_out], element-aligned, unit last stride, injective"));
    GM_REFUSE_IF(overlap(a->x, es, a->y, es), "x and y overlap");
  } else {
    GM_TRY(check_tensor(a->dy, 3, oe, es, true, false, "dy must be [B, N_next, C_out], element-aligned, unit last stride"));
    GM_TRY(check_tensor(a->dx, 3, xe, es, true, true, "dx must be [B, N, C_in], element-aligned, unit last stride, injective"));
    GM_REFUSE_IF(overlap(a->x, es, a->dx, es) || overlap(a->dy, es, a->dx, es), "dx overlaps x or dy");
  }
  return cudaSuccess;
}

//! The operators that gather_gemm_async can run (the forward), where they set `async` (k_per is a
//! multiple of 16 and K of 8 there, so no chunk straddles a split's end).
template <class Op>
constexpr bool k_has_async = std::is_same<Op, bc_fwd_op<typename Op::elem>>::value;

//! gather_gemm_async where op allows it, else gather_gemm_mma (16-bit element types).
template <class Op>
cudaError_t launch_mma(const Op& op, const dim3 grid, int k_per, float* partial, cudaStream_t stream) {
  if constexpr (k_has_async<Op>)
    if (op.async)
      return launch(gather_gemm_async<Op>, grid, k_tc_threads, gather_gemm_async_smem<Op>(), stream, op, k_per, partial);
  return launch(gather_gemm_mma<Op>, grid, k_tc_threads, gather_gemm_mma_smem<Op>(), stream, op, k_per, partial);
}

//! op's GEMM split as gemm_split_for(M, split_n, K) says (split_n: the N the split is computed
//! for, >= op.N; the dweight GEMM passes P * C_in + 1 whichever gradients are requested, so
//! dweight's bits do not depend on whether dbias is wanted); `workspace` holds the partials.
template <class Op>
cudaError_t launch_gemm(const Op& op, float* workspace, cudaStream_t stream, std::int64_t split_n = 0) {
  if (op.M == 0 || op.N == 0) return cudaSuccess;
  const gemm_split sp = gemm_split_for(op.M, split_n > op.N ? split_n : op.N, op.K);
  const dim3 grid(static_cast<unsigned>((op.N + k_bn - 1) / k_bn), static_cast<unsigned>((op.M + k_bm - 1) / k_bm),
                  static_cast<unsigned>(sp.splits));
  float* partial = sp.splits > 1 ? workspace : nullptr;
  if constexpr (std::is_same<typename Op::elem, float>::value)
    GM_TRY(launch(gather_gemm<Op>, grid, k_gemm_threads, 0, stream, op, sp.k_per, partial));
  else
    GM_TRY(launch_mma(op, grid, sp.k_per, partial, stream));
  if (!partial) return cudaSuccess;
  const std::int64_t mn = static_cast<std::int64_t>(op.M) * op.N;
  return launch(splitk_reduce<Op>, dim3(static_cast<unsigned>((mn + k_bc_elem_threads - 1) / k_bc_elem_threads)), k_bc_elem_threads,
                0, stream, op, sp.splits, static_cast<const float*>(partial));
}

//! The three GEMMs' (M, N, K): forward, dx, dweight (+ dbias column).
struct block_gemms {
  std::int64_t rows = 0, P = 0, cin = 0, cout = 0;  // rows = B * N_next
  std::int64_t dw_cols(const gm_block_conv_args* a) const {
    return (a->dweight ? P * cin : 0) + (a->dbias ? 1 : 0);
  }
  //! The N the dweight GEMM's split is computed for: all columns, whichever are requested.
  std::int64_t dw_split_n() const { return P * cin + 1; }
};

block_gemms gemm_shapes(const gm_block_conv_args* a, const gm_tensor& out) {
  block_gemms s;
  s.rows = a->x.extent[0] * out.extent[1];
  s.P = static_cast<std::int64_t>(a->stride) * a->stride;
  s.cin = a->x.extent[2];
  s.cout = out.extent[2];
  return s;
}

//! The workspace: W' in the element type (16-bit dtypes: the tensor cores' B operand), then the
//! split-K partials at a 256-byte offset.
struct block_workspace {
  std::size_t weight_bytes = 0, partial_bytes = 0;
  std::size_t partial_offset() const { return (weight_bytes + 255) / 256 * 256; }
  std::size_t total() const { return partial_bytes == 0 ? weight_bytes : partial_offset() + partial_bytes; }
};

//! W' rows of the tensor-core path: P * C_in rounded up to 8 elements (16-byte rows).
std::int64_t weight_ld(const block_gemms& s) { return (s.P * s.cin + 7) / 8 * 8; }

std::size_t weight_bytes(const gm_block_conv_args* a, const block_gemms& s) {
  if (a->dtype == GM_FLOAT32 || s.rows == 0) return 0;  // SIMT reads the fp32 weight; no rows: no GEMM
  return static_cast<std::size_t>(s.cout * weight_ld(s)) * dtype_bytes(a->dtype);
}

block_workspace block_fwd_workspace(const gm_block_conv_args* a) {
  const block_gemms s = gemm_shapes(a, a->y);
  const std::int64_t K = s.P * s.cin;
  block_workspace w;
  w.weight_bytes = weight_bytes(a, s);
  w.partial_bytes = static_cast<std::size_t>(gemm_split_for(s.rows, s.cout, K).partial_floats(s.rows, s.cout)) * sizeof(float);
  return w;
}

block_workspace block_bwd_workspace(const gm_block_conv_args* a) {
  const block_gemms s = gemm_shapes(a, a->dy);
  const std::int64_t dx = gemm_split_for(s.rows, s.P * s.cin, s.cout).partial_floats(s.rows, s.P * s.cin);
  const std::int64_t cols = s.dw_split_n();  // an upper bound of the requested columns
  const std::int64_t dw = (a->dweight || a->dbias) ? gemm_split_for(s.cout, cols, s.rows).partial_floats(s.cout, cols) : 0;
  block_workspace w;
  w.weight_bytes = weight_bytes(a, s);
  w.partial_bytes = static_cast<std::size_t>(dx > dw ? dx : dw) * sizeof(float);
  return w;
}

std::size_t block_fwd_workspace_bytes(const gm_block_conv_args* a) { return block_fwd_workspace(a).total(); }
std::size_t block_bwd_workspace_bytes(const gm_block_conv_args* a) { return block_bwd_workspace(a).total(); }

//! The geometry's W' for the tensor cores (16-bit T): converted into the workspace's head.
template <class T>
cudaError_t stage_weight(block_geom& g, const gm_block_conv_args* a, void* workspace, cudaStream_t stream) {
  if constexpr (std::is_same<T, float>::value) {
    return cudaSuccess;
  } else {
    const block_gemms s = gemm_shapes(a, a->x);  // only P and C_in are read
    g.ldw = static_cast<int>(weight_ld(s));
    g.wt = workspace;
    const std::int64_t n = static_cast<std::int64_t>(g.cout) * g.ldw;
    if (n == 0) return cudaSuccess;
    return launch(convert_weight<T>, dim3(static_cast<unsigned>((n + k_bc_elem_threads - 1) / k_bc_elem_threads)), k_bc_elem_threads, 0,
                  stream, a->weight, static_cast<T*>(workspace), g.cout, g.cin, g.P, g.ldw);
  }
}

cudaError_t check_workspace(std::size_t need, const void* workspace, std::size_t bytes, const char* size_fn) {
  GM_REFUSE_IF(bytes < need, size_fn);
  GM_REFUSE_IF(need > 0 && (workspace == nullptr || reinterpret_cast<std::uintptr_t>(workspace) % 16 != 0),
               "workspace must be non-null and 16-byte aligned");
  return cudaSuccess;
}

block_geom make_geom(const gm_block_conv_args* a, const gm_tensor& out) {
  block_geom g;
  g.gather = a->gather;
  g.batch = static_cast<int>(a->x.extent[0]);
  g.tokens = static_cast<int>(a->x.extent[1]);
  g.cin = static_cast<int>(a->x.extent[2]);
  g.n_next = static_cast<int>(out.extent[1]);
  g.cout = static_cast<int>(out.extent[2]);
  g.P = a->stride * a->stride;
  g.w = a->weight;
  return g;
}

//! The split-K partials' part of the workspace.
float* partials(void* workspace, const block_workspace& w) {
  return w.partial_bytes == 0 ? nullptr : reinterpret_cast<float*>(static_cast<char*>(workspace) + w.partial_offset());
}

template <class T>
cudaError_t run_block_fwd(const gm_block_conv_args* a, void* workspace, cudaStream_t stream) {
  const block_workspace w = block_fwd_workspace(a);
  bc_fwd_op<T> op;
  op.g = make_geom(a, a->y);
  if (op.g.batch * op.g.n_next > 0) GM_TRY(stage_weight<T>(op.g, a, workspace, stream));
  op.x = static_cast<const T*>(a->x.data);
  op.y = static_cast<T*>(a->y.data);
  op.bias = a->bias;
  op.x_s0 = a->x.stride[0]; op.x_s1 = a->x.stride[1];
  op.y_s0 = a->y.stride[0]; op.y_s1 = a->y.stride[1];
  op.M = op.g.batch * op.g.n_next;
  op.N = op.g.cout;
  op.K = op.g.P * op.g.cin;
  op.async = op.async_ok();
  return launch_gemm(op, partials(workspace, w), stream);
}

template <class T>
cudaError_t run_block_bwd(const gm_block_conv_args* a, void* workspace, cudaStream_t stream) {
  const block_workspace w = block_bwd_workspace(a);
  block_geom g = make_geom(a, a->dy);
  if (g.batch * g.n_next > 0) GM_TRY(stage_weight<T>(g, a, workspace, stream));
  const T* dy = static_cast<const T*>(a->dy.data);
  const std::int64_t xs = static_cast<std::int64_t>(g.batch) * g.tokens * g.cin;
  if (xs > 0)
    GM_TRY(launch(zero_rows<T>, dim3(static_cast<unsigned>((xs + k_bc_elem_threads - 1) / k_bc_elem_threads)), k_bc_elem_threads, 0,
                  stream, static_cast<T*>(a->dx.data), a->dx.stride[0], a->dx.stride[1], g.batch, g.tokens, g.cin));
  bc_dx_op<T> dx;
  dx.g = g;
  dx.dy = dy;
  dx.dx = static_cast<T*>(a->dx.data);
  dx.dy_s0 = a->dy.stride[0]; dx.dy_s1 = a->dy.stride[1];
  dx.dx_s0 = a->dx.stride[0]; dx.dx_s1 = a->dx.stride[1];
  dx.M = g.batch * g.n_next;
  dx.N = g.P * g.cin;
  dx.K = g.cout;
  GM_TRY(launch_gemm(dx, partials(workspace, w), stream));
  if (!a->dweight && !a->dbias) return cudaSuccess;
  const block_gemms shapes = gemm_shapes(a, a->dy);
  bc_dw_op<T> dw;
  dw.g = g;
  dw.x = static_cast<const T*>(a->x.data);
  dw.dy = dy;
  dw.dw = a->dweight;
  dw.db = a->dbias;
  dw.x_s0 = a->x.stride[0]; dw.x_s1 = a->x.stride[1];
  dw.dy_s0 = a->dy.stride[0]; dw.dy_s1 = a->dy.stride[1];
  dw.jbase = a->dweight ? 0 : g.P * g.cin;
  dw.M = g.cout;
  dw.N = static_cast<int>(shapes.dw_cols(a));
  dw.K = g.batch * g.n_next;
  if (dw.K == 0) {  // no rows: zero gradients
    if (a->dweight && g.cout > 0 && g.P * g.cin > 0)
      GM_TRY(cudaMemsetAsync(a->dweight, 0, static_cast<std::size_t>(g.cout) * g.P * g.cin * sizeof(float), stream));
    if (a->dbias && g.cout > 0) GM_TRY(cudaMemsetAsync(a->dbias, 0, static_cast<std::size_t>(g.cout) * sizeof(float), stream));
    return cudaSuccess;
  }
  GM_TRY(launch_gemm(dw, partials(workspace, w), stream, shapes.dw_split_n()));
  return cudaSuccess;
}

}  // namespace
}  // namespace cuda
}  // namespace detail
}  // namespace greenmim

using namespace greenmim::detail::cuda;

namespace {

//! The workspace_size entry points (the forward's, the backward's).
cudaError_t block_workspace_size(const gm_block_conv_args* args, bool backward, size_t* bytes) {
  return no_throw([&]() -> cudaError_t {
    GM_TRY(check_block_args(args, backward));
    GM_REFUSE_IF(bytes == nullptr, "bytes is null");
    *bytes = backward ? block_bwd_workspace_bytes(args) : block_fwd_workspace_bytes(args);
    return cudaSuccess;
  });
}

//! The forward and backward entry points: checks, the workspace's, then the launches.
cudaError_t block_entry(const gm_block_conv_args* args, bool backward, void* workspace, size_t workspace_bytes,
                        cudaStream_t stream) {
  return no_throw([&]() -> cudaError_t {
    GM_TRY(check_block_args(args, backward));
    GM_TRY(check_workspace(backward ? block_bwd_workspace_bytes(args) : block_fwd_workspace_bytes(args), workspace,
                           workspace_bytes,
                           backward ? "workspace too small (gm_block_conv_bwd_workspace_size)"
                                    : "workspace too small (gm_block_conv_fwd_workspace_size)"));
    return with_element_type(args->dtype, [&](auto t) {
      using T = typename decltype(t)::type;
      return backward ? run_block_bwd<T>(args, workspace, stream) : run_block_fwd<T>(args, workspace, stream);
    });
  });
}

}  // namespace

extern "C" cudaError_t gm_block_conv_fwd_can_implement(const gm_block_conv_args* args) {
  return no_throw([&] { return check_block_args(args, false); });
}

extern "C" cudaError_t gm_block_conv_fwd_workspace_size(const gm_block_conv_args* args, size_t* bytes) {
  return block_workspace_size(args, false, bytes);
}

extern "C" cudaError_t gm_block_conv_fwd(const gm_block_conv_args* args, void* workspace, size_t workspace_bytes,
                                         cudaStream_t stream) {
  return block_entry(args, false, workspace, workspace_bytes, stream);
}

extern "C" cudaError_t gm_block_conv_bwd_can_implement(const gm_block_conv_args* args) {
  return no_throw([&] { return check_block_args(args, true); });
}

extern "C" cudaError_t gm_block_conv_bwd_workspace_size(const gm_block_conv_args* args, size_t* bytes) {
  return block_workspace_size(args, true, bytes);
}

extern "C" cudaError_t gm_block_conv_bwd(const gm_block_conv_args* args, void* workspace, size_t workspace_bytes,
                                         cudaStream_t stream) {
  return block_entry(args, true, workspace, workspace_bytes, stream);
}
