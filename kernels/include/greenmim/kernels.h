/*! \file kernels.h
 *  greenmim CUDA kernels: the one installed public header, a plain C ABI.
 *
 *  Group Window Attention on the visible tokens of a masked image (GreenMIM, NeurIPS 2022):
 *  fused forward and backward attention that read and write the visible-token layout directly
 *  through the partition indices (no grouped copy), stand-alone partition/unpartition
 *  (gather/scatter) of token features, and device-side partition-index building with CUB.
 *
 *  Conventions (see docs/kernels.md):
 *  - Every entry point returns cudaError_t. Bad arguments are refused with cudaErrorInvalidValue
 *    before anything is launched; a launch failure is reported through cudaGetLastError() right
 *    after the launch. Nothing here throws, allocates device memory, or synchronizes the stream.
 *  - Tensors are described by `gm_tensor` (data pointer, extents, strides in ELEMENTS). The
 *    attention tensors q, k, v, o, do, dq, dk, dv are [B, N, heads, head_dim] with a unit-stride
 *    last dimension; N is the token axis of the partition (visible tokens of one sample with a
 *    shared mask, or all tokens of the batch flattened with B = 1 for per-sample masks).
 *  - The partition indices (`gm_partition`) and all index arrays are device pointers to int32.
 *  - Every launch is asynchronous on the given stream.
 */
#ifndef GREENMIM_KERNELS_H_
#define GREENMIM_KERNELS_H_

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "kernel_limits.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GM_KERNELS_ABI_VERSION 2

/* In C++ the enums get a fixed underlying type (int32_t, the size of a C enum here), so that any
 * value a C caller stores is a valid value to read and is refused by the checks, not undefined
 * behaviour. */
#ifdef __cplusplus
#define GM_ENUM_BASE : int32_t
#else
#define GM_ENUM_BASE
#endif

/*! Element type of the attention and feature tensors. The bias table, lse and dbias are always
 *  float32; accumulation is always float32. */
typedef enum gm_dtype GM_ENUM_BASE {
  GM_FLOAT32 = 0,
  GM_FLOAT16 = 1,
  GM_BFLOAT16 = 2
} gm_dtype;

/*! Which attention implementation to run. AUTO picks the fastest one that can implement the
 *  arguments. SIMT: CUDA-core kernels, any dtype, G <= GM_SIMT_MAX_GROUP. MMA: tensor-core
 *  (mma.sync m16n8k16) kernels, fp16/bf16, head_dim 32/64, 16-byte aligned rows (for the
 *  backward: of q, k, v, o, d_o, dq, dk, dv), shared memory within the device's limit, and
 *  G <= 256 (forward: one pass up to 64, 64-slot query tiles above; backward: one pass up to
 *  64, two tiled kernels above); refused otherwise (gm_last_refusal says why). AUTO takes MMA
 *  wherever it applies, else SIMT. Forward and backward choose independently. */
typedef enum gm_algo GM_ENUM_BASE {
  GM_ALGO_AUTO = 0,
  GM_ALGO_SIMT = 1,
  GM_ALGO_MMA = 2
} gm_algo;
#undef GM_ENUM_BASE

/* GM_SIMT_MAX_GROUP (largest group), GM_MMA_MAX_GROUP (largest group of the tensor-core
 * kernels), GM_MAX_WINDOW (largest window of the bias table): kernel_limits.h. */

/*! A strided tensor view of rank <= 4: `extent[i]` and `stride[i]` (in elements) for
 *  i < rank; entries beyond rank are ignored. Inputs are read through `data` (const is the
 *  caller's promise; the kernels never write an input). */
typedef struct gm_tensor {
  void* data;
  int32_t rank;
  int64_t extent[4];
  int64_t stride[4];
} gm_tensor;

/*! Partition indices (device pointers), the C twin of greenmim::partition_view
 *  (include/greenmim/partition_types.hpp): group g owns slots [g*G, (g+1)*G).
 *  gather[slot] = token or -1 (padding); scatter[token] = slot; slot_window[slot] = window id or
 *  -1; slot_coord[slot] = packed (h << 16 | w) absolute coordinate (0 for padding). */
typedef struct gm_partition {
  const int32_t* gather;      /*!< [num_groups * group_size] */
  const int32_t* scatter;     /*!< [num_tokens] */
  const int32_t* slot_window; /*!< [num_groups * group_size] */
  const int32_t* slot_coord;  /*!< [num_groups * group_size]; may be NULL when there is no bias */
  int32_t group_size;         /*!< G > 0 */
  int32_t num_groups;         /*!< n_g >= 0 */
  int32_t num_tokens;         /*!< N: length of the token axis */
} gm_partition;

/*! Window geometry of one stage, the C twin of greenmim::window_geometry (pass the result of
 *  greenmim::make_window_geometry: a grid no larger than the window is one window, no shift). */
typedef struct gm_window_geometry {
  int32_t height;
  int32_t width;
  int32_t window; /*!< p */
  int32_t shift;  /*!< 0 or p/2 */
} gm_window_geometry;

/* ---------------------------------------------------------------------------------------------
 * Fused group window attention
 * ------------------------------------------------------------------------------------------- */

/*! Forward arguments. Per (sample b, group g, head h) the G slots of group g are read through
 *  `part.gather`; for the query slot i and key slot j of the same window (attends()):
 *    s_ij = (scale * q_i) . k_j + bias_table[rel_pos_index(coord_i, coord_j, window), h]
 *  pairs across windows and padding are skipped exactly (-inf semantics: no value, not even a
 *  NaN, of another window reaches a row); o_i = softmax_j(s_ij) v_j, lse_i = log sum_j exp(s_ij)
 *  (natural log). Only rows of real tokens are written (o and lse); padding is never written. */
typedef struct gm_attention_fwd_args {
  gm_dtype dtype;        /*!< of q, k, v, o */
  gm_tensor q, k, v;     /*!< [B, N, heads, head_dim] inputs */
  gm_tensor o;           /*!< [B, N, heads, head_dim] output */
  gm_tensor lse;         /*!< [B, N, heads] float32 output; data NULL = not written */
  gm_tensor bias_table;  /*!< [(2p-1)^2, heads] float32 input; data NULL = no bias */
  gm_partition part;     /*!< part.num_tokens == N */
  int32_t window;        /*!< p of the bias table (required with a bias, 1..GM_MAX_WINDOW) */
  float scale;           /*!< 0 selects head_dim^-0.5 */
  gm_algo algo;
} gm_attention_fwd_args;

/*! Backward arguments: o and lse are the forward's outputs for the same inputs; `d_o` is the
 *  incoming gradient. dq, dk, dv are overwritten (every real token row); d_bias_table is
 *  ACCUMULATED into (+=, zero it for a plain gradient) in a fixed order: bitwise identical from
 *  run to run (per-CTA partials in the workspace, then a fixed-order reduction; no float atomics). */
typedef struct gm_attention_bwd_args {
  gm_dtype dtype;           /*!< of q, k, v, o, d_o, dq, dk, dv */
  gm_tensor q, k, v, o, d_o; /*!< [B, N, heads, head_dim] inputs */
  gm_tensor lse;            /*!< [B, N, heads] float32 input (required) */
  gm_tensor bias_table;     /*!< [(2p-1)^2, heads] float32; data NULL = no bias */
  gm_tensor dq, dk, dv;     /*!< [B, N, heads, head_dim] outputs */
  gm_tensor d_bias_table;   /*!< [(2p-1)^2, heads] float32, accumulated; data NULL = skipped */
  gm_partition part;
  int32_t window;
  float scale;              /*!< 0 selects head_dim^-0.5 */
  gm_algo algo;
} gm_attention_bwd_args;

/*! Checks the forward arguments without touching the device: non-null pointers, extents that
 *  agree, head_dim in {32, 64}, unit-stride last dimension, element-aligned pointers, dtype,
 *  G in [1, GM_SIMT_MAX_GROUP], window, grid limits, and for GM_ALGO_MMA its extra conditions.
 *  Returns cudaSuccess or cudaErrorInvalidValue. Thread-safe; O(1). */
cudaError_t gm_attention_fwd_can_implement(const gm_attention_fwd_args* args);

/*! Runs the forward on `stream` (asynchronous). Refuses (cudaErrorInvalidValue) whatever
 *  gm_attention_fwd_can_implement refuses, without launching. */
cudaError_t gm_attention_fwd(const gm_attention_fwd_args* args, cudaStream_t stream);

/*! Checks the backward arguments (as the forward, plus do/dq/dk/dv/lse/d_bias_table). */
cudaError_t gm_attention_bwd_can_implement(const gm_attention_bwd_args* args);

/*! Device workspace the backward needs, in bytes (CUB style: the caller allocates, the library
 *  never does). Fails like gm_attention_bwd_can_implement. */
cudaError_t gm_attention_bwd_workspace_size(const gm_attention_bwd_args* args, size_t* bytes);

/*! Runs the backward on `stream`. `workspace` (device, 256-byte aligned) must hold
 *  gm_attention_bwd_workspace_size bytes; its contents on entry do not matter. */
cudaError_t gm_attention_bwd(const gm_attention_bwd_args* args, void* workspace, size_t workspace_bytes,
                             cudaStream_t stream);

/* ---------------------------------------------------------------------------------------------
 * Partition / unpartition of token features  [B, N, C] <-> [B, n_g*G, C]
 * ------------------------------------------------------------------------------------------- */

/*! x is [B, N, C] (token layout), y is [B, n_g*G, C] (slot layout); unit-stride last dimension,
 *  any other strides; x and y must not overlap. 16-byte vectorized when every row is 16-byte
 *  aligned and C * sizeof(element) is a multiple of 16, element-wise otherwise. */
typedef struct gm_partition_args {
  gm_dtype dtype;   /*!< element type (only its size matters: a copy) */
  gm_tensor x;      /*!< [B, N, C] */
  gm_tensor y;      /*!< [B, n_g*G, C] */
  gm_partition part;
} gm_partition_args;

cudaError_t gm_partition_can_implement(const gm_partition_args* args);

/*! y[b, s, :] = x[b, gather[s], :] for real slots, zero for padding slots (every row of y is
 *  written). Its backward is gm_unpartition_tokens of the gradient. */
cudaError_t gm_partition_tokens(const gm_partition_args* args, cudaStream_t stream);

/*! x[b, t, :] = y[b, scatter[t], :] for every token (padding slots are never read; a token whose
 *  scatter entry is out of range gets a zero row). Its backward is gm_partition_tokens. */
cudaError_t gm_unpartition_tokens(const gm_partition_args* args, cudaStream_t stream);

/* ---------------------------------------------------------------------------------------------
 * Device-side partition-index building (CUB)
 *
 * Flow: mask -> gm_select_visible -> gm_token_windows (per-window sizes) -> host copies the
 * sizes and plans (greenmim::make_plan) -> upload a per-window (group, slot offset) table
 * (greenmim::kernels::window_slot_table in kernels.hpp) -> gm_build_partition. The result equals
 * greenmim::build_partition (include/greenmim/partition.hpp) over build_windows (num_masks = 1,
 * shared mask) or build_windows_per_sample (num_masks = B, flattened token axis).
 * Functions taking `d_temp_storage` follow CUB: with d_temp_storage == NULL they only write the
 * required size into *temp_storage_bytes and return.
 * ------------------------------------------------------------------------------------------- */

/*! Compacts the visible positions of `num_masks` masks of height x width (uint8, nonzero =
 *  visible, row-major, mask after mask) into d_positions (capacity num_masks*height*width):
 *  flat positions b*H*W + h*W + w in increasing order; the count goes to *d_num_visible (device).
 *  cub::DeviceSelect::Flagged. */
cudaError_t gm_select_visible(void* d_temp_storage, size_t* temp_storage_bytes, const uint8_t* d_mask,
                              int32_t num_masks, int32_t height, int32_t width, int32_t* d_positions,
                              int32_t* d_num_visible, cudaStream_t stream);

/*! For the first *d_num_positions entries of d_positions (capacity entries are launched; the
 *  count is read on the device): d_coords[t] = packed (h, w), d_token_window[t] = the window of
 *  token t, b * num_windows + window_id(h, w) with b = position / (H*W); and
 *  d_window_sizes[num_masks * num_windows] = tokens per window (zeroed first; int atomics, exact).
 *  geom.height/width must equal the mask's. num_windows = the geometry's window count. */
cudaError_t gm_token_windows(const int32_t* d_positions, const int32_t* d_num_positions, int32_t capacity,
                             int32_t num_masks, gm_window_geometry geom, int32_t* d_coords,
                             int32_t* d_token_window, int32_t* d_window_sizes, cudaStream_t stream);

/*! Fills the partition arrays (device, sized as gm_partition's) of a plan: token t of window w
 *  with rank r among window w's tokens (ascending token order; cub::DeviceRadixSort, stable) goes
 *  to slot window_group[w] * G + window_slot_offset[w] + r. Padding: gather = slot_window = -1,
 *  slot_coord = 0. window_group[w] = -1 for windows in no group (they must be empty).
 *  d_window_sizes: as written by gm_token_windows (exclusive-scanned here, cub::DeviceScan).
 *  Tokens of a window not in the plan, or overflowing their group, are dropped (scatter = -1):
 *  validate the plan on the host (greenmim::validate_plan). */
cudaError_t gm_build_partition(void* d_temp_storage, size_t* temp_storage_bytes, const int32_t* d_coords,
                               const int32_t* d_token_window, int32_t num_tokens,
                               const int32_t* d_window_sizes, int32_t num_windows,
                               const int32_t* d_window_group, const int32_t* d_window_slot_offset,
                               int32_t group_size, int32_t num_groups, int32_t* d_gather,
                               int32_t* d_scatter, int32_t* d_slot_window, int32_t* d_slot_coord,
                               cudaStream_t stream);

/* ---------------------------------------------------------------------------------------------
 * Convolutions on visible tokens (Twins; docs/sparse-conv.md)
 *
 * Index tables are built on the host by include/greenmim/sparse_conv.hpp and uploaded as int32:
 * the k x k submanifold neighbour table `nbr` [N, k*k] (-1 = masked or outside) and the
 * kernel = stride block table `gather` [N_next, s*s] (row-major within a block). Features are
 * [B, N, C] with a unit-stride last dimension in `dtype`; weights, biases and their gradients are
 * float32, contiguous, in PyTorch's layouts; accumulation is float32. Gradients are overwritten.
 * Table entries outside [0, N) read as zero (never an out-of-bounds access): validate tables on
 * the host. The CPU reference is include/greenmim/reference/conv.hpp. Speed: unverified.
 * ------------------------------------------------------------------------------------------- */

/*! Depthwise k x k submanifold conv (Twins' PEG: k = 3; ConvNeXt: k = 7; k odd, 1..7), K = k*k:
 *  y[b,t,c] = bias[c] + sum_o weight[c*K + o] * x[b, nbr[t*K + o], c] (+ x[b,t,c] if residual).
 *  An even k or k > 7 is refused with the reason (gm_last_refusal). k = 3 runs PEG's kernels
 *  (8 tokens a thread, rows kept across them); any other k one token a thread, a stencil row of
 *  loads at a time (docs/sparse-conv.md).
 *  Backward: dx through the same table at mirrored offsets (no atomics); dweight / dbias bitwise
 *  deterministic (fixed 32-token tiles of per-tile partials in the workspace, summed in a fixed
 *  order). 16-byte vectorized when C % 8 == 0 and every row is 16-byte aligned. */
typedef struct gm_depthwise_conv_args {
  gm_dtype dtype;       /*!< element type of x, y, dy, dx */
  gm_tensor x;          /*!< [B, N, C] */
  gm_tensor y;          /*!< forward output [B, N, C] */
  gm_tensor dy;         /*!< backward input [B, N, C] */
  gm_tensor dx;         /*!< backward output [B, N, C] */
  const int32_t* nbr;   /*!< [N, k*k] neighbour table (greenmim::neighbor_table::nbr) */
  int32_t kernel;       /*!< k: 1, 3, 5 or 7 */
  const float* weight;  /*!< [C, k*k] (= [C, 1, k, k]) */
  const float* bias;    /*!< [C] or NULL (forward) */
  float* dweight;       /*!< backward output [C, k*k], or NULL */
  float* dbias;         /*!< backward output [C], or NULL */
  int32_t residual;     /*!< nonzero: + x (Twins' PosCNN, the default); 0: as the released GreenMIM code */
} gm_depthwise_conv_args;

cudaError_t gm_depthwise_conv_fwd_can_implement(const gm_depthwise_conv_args* args);
cudaError_t gm_depthwise_conv_fwd(const gm_depthwise_conv_args* args, cudaStream_t stream);
cudaError_t gm_depthwise_conv_bwd_can_implement(const gm_depthwise_conv_args* args);
/*! Workspace of the backward (16-byte aligned): (k*k + 1) * C floats per piece of the
 *  deterministic dweight/dbias reduction (pieces of 32+ tokens x 8+ samples; k = 3: at most
 *  2^20 / C of them, 40 MiB; other k: at most 2^20 / (k C), 30 MiB at k = 7), 0 when neither
 *  dweight nor dbias is requested or the input is empty. */
cudaError_t gm_depthwise_conv_bwd_workspace_size(const gm_depthwise_conv_args* args, size_t* bytes);
cudaError_t gm_depthwise_conv_bwd(const gm_depthwise_conv_args* args, void* workspace, size_t workspace_bytes,
                                  cudaStream_t stream);

/*! Block conv, kernel = stride = s (GSA sub-sampling, patch embedding), as gather + GEMM:
 *  y[b,n,o] = bias[o] + sum_{c,p} weight[(o*C_in + c)*s*s + p] * x[b, gather[n*s*s + p], c].
 *  Backward: dx (zeroed, then scattered: each input in at most one block), dweight, dbias; all
 *  deterministic (no atomics; a split reduction is summed in a fixed order that depends on the
 *  shapes only). fp16/bf16: tensor cores (mma.sync, fp32 accumulation; the weight rounded once
 *  per call to the element type, as cuDNN under autocast); fp32: a SIMT tiled GEMM. Both split
 *  along the reduction where the output tiles are too few CTAs; the splits' fp32 partials (and the
 *  rounded weight) live in the caller's workspace. */
typedef struct gm_block_conv_args {
  gm_dtype dtype;        /*!< element type of x, y, dy, dx */
  gm_tensor x;           /*!< [B, N, C_in] */
  gm_tensor y;           /*!< forward output [B, N_next, C_out] */
  gm_tensor dy;          /*!< backward input [B, N_next, C_out] */
  gm_tensor dx;          /*!< backward output [B, N, C_in] */
  const int32_t* gather; /*!< [N_next, s*s] block table (greenmim::block_table::gather) */
  int32_t stride;        /*!< s (= kernel), 1..64 */
  const float* weight;   /*!< [C_out, C_in, s, s] */
  const float* bias;     /*!< [C_out] or NULL (forward) */
  float* dweight;        /*!< backward output [C_out, C_in, s, s], or NULL */
  float* dbias;          /*!< backward output [C_out], or NULL */
} gm_block_conv_args;

cudaError_t gm_block_conv_fwd_can_implement(const gm_block_conv_args* args);
/*! Workspace of the forward / backward (16-byte aligned): for fp16/bf16 the weight in the element
 *  type (C_out x s*s*C_in, rows padded to 8), then the split GEMMs' fp32 partials (at most 64 MiB);
 *  0 for fp32 when no GEMM splits, and when there are no output rows. */
cudaError_t gm_block_conv_fwd_workspace_size(const gm_block_conv_args* args, size_t* bytes);
cudaError_t gm_block_conv_fwd(const gm_block_conv_args* args, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream);
cudaError_t gm_block_conv_bwd_can_implement(const gm_block_conv_args* args);
cudaError_t gm_block_conv_bwd_workspace_size(const gm_block_conv_args* args, size_t* bytes);
cudaError_t gm_block_conv_bwd(const gm_block_conv_args* args, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream);

/* ---------------------------------------------------------------------------------------------
 * Misc
 * ------------------------------------------------------------------------------------------- */

/*! Name of a dtype ("float32", "float16", "bfloat16", or "invalid"). Never NULL. */
const char* gm_dtype_name(gm_dtype dtype);

/*! Size in bytes of one element of `dtype` (0 for an invalid dtype). */
size_t gm_dtype_size(gm_dtype dtype);

/*! Human-readable reason for the last cudaErrorInvalidValue returned by a can_implement check
 *  (or an entry point refusing its arguments) on the calling thread; "" when none. Never NULL. */
const char* gm_last_refusal(void);

/* ---------------------------------------------------------------------------------------------
 * The ABI itself
 * ------------------------------------------------------------------------------------------- */

/*! GM_KERNELS_ABI_VERSION of the library's build. */
int gm_kernels_abi_version(void);

/*! One entry of the layout table: struct `name`, and either the struct itself (`field` NULL,
 *  offset 0, size = sizeof) or its member `field` at byte `offset`, `size` bytes. */
typedef struct gm_abi_entry {
  const char* name;
  const char* field;
  size_t offset;
  size_t size;
} gm_abi_entry;

/*! The layout of every struct of this header as the library was compiled: *count entries, each
 *  struct's own entry followed by its fields'. For loaders that declare the structs again (the
 *  Python package checks its ctypes copies against it at import). Static storage; never fails. */
const gm_abi_entry* gm_abi_layout(size_t* count);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GREENMIM_KERNELS_H_ */
