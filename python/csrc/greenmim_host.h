/*! \file greenmim_host.h
 *  A plain C ABI over greenmim's host side: stage planning and partition indices from a mask,
 *  patch-merging indices, Twins' plans and sparse-conv tables, and the CPU reference attention
 *  and convolutions (float32/float64). It is what the
 *  PyTorch package calls through ctypes (python/greenmim/_lib.py), so the package needs no C++
 *  extension built against torch: one build serves every torch version (docs/design.md).
 *
 *  Conventions, as kernels.h:
 *  - Every function returns 0 (GMH_OK) or a positive code; on failure `gmh_last_error()` holds
 *    one line saying why (thread-local), and no output was written. Nothing throws across the ABI.
 *  - Tensors are `gmh_tensor` (the same layout as kernels.h's gm_tensor): data, rank <= 4,
 *    extents and strides in ELEMENTS. Index arrays are int32, host memory.
 */
#ifndef GREENMIM_HOST_H_
#define GREENMIM_HOST_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GMH_ABI_VERSION 5

enum {
  GMH_OK = 0,
  GMH_INVALID_ARGUMENT = 1, /*!< a refused argument: the message says which and why */
  GMH_INTERNAL = 2          /*!< an unexpected failure (e.g. out of memory) */
};

/*! Element types of the reference attention (kernels.h numbers, plus float64). */
enum { GMH_FLOAT32 = 0, GMH_FLOAT64 = 3 };

/*! Planner strategies (greenmim::strategy). */
enum { GMH_FAST = 0, GMH_PAPER = 1, GMH_PER_WINDOW = 2, GMH_SINGLE = 3 };

typedef struct gmh_tensor {
  void* data;
  int32_t rank;
  int64_t extent[4];
  int64_t stride[4];
} gmh_tensor;

/*! Host partition indices (kernels.h's gm_partition layout). */
typedef struct gmh_partition {
  const int32_t* gather;
  const int32_t* scatter;
  const int32_t* slot_window;
  const int32_t* slot_coord;
  int32_t group_size;
  int32_t num_groups;
  int32_t num_tokens;
} gmh_partition;

/*! ABI version of this library (GMH_ABI_VERSION) and greenmim's version as major*10000+minor*100+patch. */
int32_t gmh_abi_version(void);
int32_t gmh_version(void);

/*! Why the last call on this thread failed; "" after a success. Never NULL. */
const char* gmh_last_error(void);

/* ---- Stage partition: mask -> windows -> plan -> partition indices ------------------------- */

/*! Swin's small-stage rule (greenmim::make_window_geometry): the window and shift a grid really
 *  uses (a grid no larger than the window is one window, no shift) and its window count. */
int gmh_window_geometry(int32_t height, int32_t width, int32_t window, int32_t shift, int32_t* out_window,
                        int32_t* out_shift, int32_t* num_windows);

/*! One stage of a hierarchical encoder under a mask. `visible` is [num_masks, height, width]
 *  uint8 (nonzero = visible, row-major). num_masks == 1: one mask shared by the batch, the token
 *  axis is that mask's visible tokens in row-major order. num_masks == B: per-sample masks, the
 *  token axis is all samples' visible tokens, sample-major, row-major within a sample. The window
 *  geometry applies Swin's small-stage rule (a grid no larger than the window is one window,
 *  no shift); `info.window` / `info.shift` report what was used. */
typedef struct gmh_stage_args {
  const uint8_t* visible;
  int32_t num_masks;
  int32_t height, width;
  int32_t window, shift;
  int32_t strategy;   /*!< GMH_FAST (default), GMH_PAPER, GMH_PER_WINDOW, GMH_SINGLE */
  int32_t group_size; /*!< > 0 fixes G; 0 lets the planner sweep */
  int32_t channels;   /*!< C of the FLOPs cost model (> 0) */
  int32_t max_group_size; /*!< > 0: the sweep keeps G <= it (see gmh_fast_path_max_group); 0: no cap */
} gmh_stage_args;

typedef struct gmh_stage_info {
  int32_t group_size, num_groups, num_tokens, num_windows;
  int32_t window, shift;     /*!< after Swin's small-stage rule */
  int32_t budget_exhausted;  /*!< the planner's work budget ended the sweep (plan still valid) */
  double cost, lower_bound;  /*!< FLOPs of the plan and a lower bound on any plan's */
  double plan_us;            /*!< planner wall time */
} gmh_stage_info;

typedef struct gmh_stage gmh_stage; /*!< opaque: the built indices */

/*! Builds a stage's partition. On success *out owns the indices (free with gmh_stage_free). */
int gmh_stage_build(const gmh_stage_args* args, gmh_stage** out);
int gmh_stage_info_get(const gmh_stage* stage, gmh_stage_info* info);
/*! Copies the indices into caller arrays sized from the info: gather, slot_window, slot_coord
 *  [num_groups*group_size], scatter and token_window [num_tokens], window_sizes [num_windows]
 *  (windows of all samples, sample-major). Any pointer may be NULL (skipped). */
int gmh_stage_copy(const gmh_stage* stage, int32_t* gather, int32_t* scatter, int32_t* slot_window,
                   int32_t* slot_coord, int32_t* token_window, int32_t* window_sizes);
void gmh_stage_free(gmh_stage* stage);

/*! Plans window sizes (e.g. counted on the device by gm_token_windows) and writes the per-window
 *  table gm_build_partition takes: window_group[w], window_slot_offset[w] (-1 for empty
 *  windows). `info` gets group_size, num_groups, cost, lower_bound, plan_us (other fields 0). */
int gmh_plan_table(const int32_t* sizes, int32_t num_windows, int32_t strategy, int32_t group_size,
                   int32_t max_group_size, int32_t channels, int32_t* window_group, int32_t* window_slot_offset,
                   gmh_stage_info* info);

/*! The group-size cap that keeps a stage of (effective) window `window` on the tensor-core
 *  attention (greenmim::fast_path_max_group): 256 for windows up to 16, else 0 (no cap). */
int32_t gmh_fast_path_max_group(int32_t window);

/*! Patch-merging indices of a stage (height, width even): `visible` as in gmh_stage_args. Writes
 *  gather4 [N_next*4] (indices into the stage's token axis, Swin's order (0,0), (1,0), (0,1),
 *  (1,1)); `capacity` is gather4's length (the stage's visible count always suffices); the count
 *  N_next*4 goes to *written. A 2x2 block partly visible is refused (misaligned). */
int gmh_merge_indices(const uint8_t* visible, int32_t num_masks, int32_t height, int32_t width,
                      int32_t* gather4, int64_t capacity, int64_t* written);

/* ---- Encoder plan: every stage of an encoder for one mask, in one arena (encoder_plan.hpp) ---- */

/*! An array of the arena: int32 entries [offset, offset + size). */
typedef struct gmh_range {
  int64_t offset, size;
} gmh_range;

/*! One stage's partition (plain or shifted windows): the gmh_stage_info fields and its arrays. */
typedef struct gmh_plan_partition {
  int32_t group_size, num_groups, num_windows, window, shift, budget_exhausted;
  double cost, lower_bound, plan_us;
  gmh_range gather, scatter, slot_window, slot_coord; /*!< [n_g*G] except scatter [N] */
} gmh_plan_partition;

/*! One stage. part[1] equals part[0] when the stage has no shift (a single window). */
typedef struct gmh_plan_stage {
  int32_t height, width, num_tokens, reserved;
  gmh_plan_partition part[2];
  gmh_range position;   /*!< [N] flat position of each token: h*W + w, or b*H*W + h*W + w per sample */
  gmh_range merge;      /*!< [4 * N_next] patch-merging gather (Swin's order); empty at the last stage */
  gmh_range cu_seqlens; /*!< [M+1] per-sample offsets of the token axis; empty with a shared mask */
  gmh_range unit_rank;  /*!< last stage only, [M*H*W]: rank among visible units (>= 0), or -1 - rank among masked */
} gmh_plan_stage;

#define GMH_MAX_STAGES 8

/*! A square Swin-like encoder under a mask. `visible` is [num_masks, mask_height, mask_width]
 *  uint8 (nonzero = visible) at any resolution dividing the stage-1 grid `grid` (image / patch);
 *  per_sample = 0 needs num_masks == 1 (one mask shared by the batch). Stage s has a grid >> s
 *  grid, windows of `window` (shifted by window/2 on odd blocks, Swin's small-stage rule) and
 *  embed_dim << s channels for the cost model. group_size > 0 fixes G at every stage, 0 lets the
 *  planner sweep, -1 fixes each stage's G at its window's area (fast and paper). max_group_size
 *  > 0 caps G at every stage, 0 sets no cap, < 0 caps each stage at gmh_fast_path_max_group(its
 *  window) (fast and paper, G swept). */
typedef struct gmh_encoder_args {
  const uint8_t* visible;
  int32_t num_masks, mask_height, mask_width, per_sample;
  int32_t grid, window, num_stages, embed_dim;
  int32_t strategy, group_size, max_group_size;
} gmh_encoder_args;

typedef struct gmh_encoder_info {
  int32_t num_stages, num_masks;
  int64_t arena_size; /*!< int32 entries */
  double build_us;    /*!< wall time of the whole build */
  gmh_plan_stage stage[GMH_MAX_STAGES];
} gmh_encoder_info;

typedef struct gmh_encoder_planner gmh_encoder_planner; /*!< opaque: planners and scratch, reused */

/*! A planner object: keep one per thread and reuse it (it keeps its scratch between plans). */
int gmh_encoder_planner_create(gmh_encoder_planner** out);
void gmh_encoder_planner_destroy(gmh_encoder_planner* planner);

/*! Plans every stage and lays out the arena: *info gets its size and every array's range. */
int gmh_encoder_plan_prepare(gmh_encoder_planner* planner, const gmh_encoder_args* args, gmh_encoder_info* info);
/*! Writes the arena of the planner's last successful prepare (info.arena_size int32 entries). */
int gmh_encoder_plan_write(const gmh_encoder_planner* planner, int32_t* arena);

/* ---- Twins plan: every stage of a Twins-SVT encoder for one mask, in one arena (twins_plan.hpp) */

/*! One stage of a Twins plan. Counts are per sample with a shared mask, of the whole flat axis
 *  with per-sample masks. Tokens are in block-major order (twins_plan.hpp: the last stage's cells
 *  row-major, Z order inside each); `position` says where each one lies. */
typedef struct gmh_twins_stage {
  int32_t height, width, num_tokens, num_keys;
  int32_t max_tokens, max_keys; /*!< the largest sample's tokens and GSA keys */
  int32_t uniform;              /*!< every sample has max_tokens tokens and max_keys keys */
  int32_t key_holes, embed_holes; /*!< a GSA / patch-embedding block is partly visible (-1 entries) */
  int32_t reshape;  /*!< bit 0: the GSA keys' block table is a reshape of the tokens (whole blocks in
                        block-major order: tap (i, j) of key n is token n*sr*sr + Morton rank of (i, j));
                        bit 1: the patch embedding's (twins_plan.hpp) */
  gmh_plan_partition lsa;     /*!< the LSA windows (never shifted) */
  gmh_range position;         /*!< [N] flat position: h*W + w, or b*H*W + h*W + w per sample */
  gmh_range cu_seqlens;       /*!< [M+1] per-sample token offsets; empty with a shared mask */
  gmh_range neighbors;        /*!< [N*9] PEG 3x3 neighbour table, -1 = masked or outside */
  gmh_range keys;             /*!< [K*sr*sr] GSA sub-sampling block table (sr > 1); empty at sr 1 */
  gmh_range key_cu_seqlens;   /*!< [M+1] per-sample key offsets; empty with a shared mask */
  gmh_range query_slot;       /*!< [N] slot of each token in [M, max_tokens] (per sample, not uniform) */
  gmh_range key_gather;       /*!< [M*max_keys] key of each padded slot or -1 (per sample, not uniform) */
  gmh_range embed;            /*!< [N_next*4] patch-embedding block table to the next stage; empty last */
  gmh_range unit_rank;        /*!< last stage, [M*H*W]: rank among visible (>= 0), or -1 - rank among masked */
} gmh_twins_stage;

/*! A square Twins encoder under a mask (`visible` as in gmh_encoder_args). Stage s has a
 *  grid >> s grid, LSA windows window[s] and GSA sub-sampling sr_ratio[s] (both dividing the
 *  grid), channels[s] for the cost model. strategy, group_size, max_group_size as
 *  gmh_encoder_args. Block convs keep every block with a visible input (spconv's rule). */
typedef struct gmh_twins_args {
  const uint8_t* visible;
  int32_t num_masks, mask_height, mask_width, per_sample;
  int32_t grid, num_stages;
  int32_t window[GMH_MAX_STAGES], sr_ratio[GMH_MAX_STAGES], channels[GMH_MAX_STAGES];
  int32_t strategy, group_size, max_group_size;
} gmh_twins_args;

typedef struct gmh_twins_info {
  int32_t num_stages, num_masks;
  int64_t arena_size; /*!< int32 entries */
  double build_us;
  gmh_twins_stage stage[GMH_MAX_STAGES];
} gmh_twins_info;

typedef struct gmh_twins_planner gmh_twins_planner; /*!< opaque, reused: one per thread */

int gmh_twins_planner_create(gmh_twins_planner** out);
void gmh_twins_planner_destroy(gmh_twins_planner* planner);
/*! Plans every stage and lays out the arena (*info: its size and every array's range). */
int gmh_twins_plan_prepare(gmh_twins_planner* planner, const gmh_twins_args* args, gmh_twins_info* info);
/*! Writes the arena of the planner's last successful prepare. */
int gmh_twins_plan_write(const gmh_twins_planner* planner, int32_t* arena);

/* ---- Sparse-conv tables of one stage mask (sparse_conv.hpp) ----------------------------------- */

enum { GMH_NEIGHBOR_TABLE = 0, GMH_BLOCK_TABLE = 1 };

/*! `visible` [num_masks, height, width] uint8 at token resolution (per_sample = 0 needs
 *  num_masks == 1). kind GMH_NEIGHBOR_TABLE: the k x k submanifold table (size = k, odd);
 *  GMH_BLOCK_TABLE: the kernel = stride = size block table, every block with a visible input an
 *  output (spconv's rule; masked inputs -1). */
typedef struct gmh_conv_table_args {
  const uint8_t* visible;
  int32_t num_masks, height, width, per_sample;
  int32_t kind, size;
} gmh_conv_table_args;

typedef struct gmh_conv_table_info {
  int32_t num_inputs;  /*!< N: visible tokens (the flat axis with per-sample masks) */
  int32_t num_outputs; /*!< N for a neighbour table, N_next for a block table */
  int32_t row;         /*!< entries per output: k*k or s*s */
  int32_t holes;       /*!< a -1 entry in a block table (a partly visible block) */
} gmh_conv_table_info;

typedef struct gmh_conv_table gmh_conv_table; /*!< opaque: the built table */

int gmh_conv_table_build(const gmh_conv_table_args* args, gmh_conv_table** out, gmh_conv_table_info* info);
/*! Copies table [num_outputs*row], the outputs' per-sample offsets [num_masks+1] and flat
 *  positions [num_outputs] (b*H'*W' + h*W' + w on the output grid); any pointer may be NULL. */
int gmh_conv_table_copy(const gmh_conv_table* table, int32_t* entries, int32_t* out_cu_seqlens, int32_t* out_position);
void gmh_conv_table_free(gmh_conv_table* table);

/* ---- CPU reference convolutions on visible tokens (greenmim/reference/conv.hpp) ---------------- */

/*! x, y, dy, dx [B, N, C] (any strides); weight [C, k*k] (depthwise) or [C_out, C_in, s, s]
 *  (block), bias / dbias [C_out] contiguous (data NULL = none), dweight like weight (data NULL =
 *  skipped), all of `dtype`. `table` holds table_size int32 entries ([N, k*k] or [N_next, s*s]).
 *  Gradients are overwritten. residual: the depthwise conv adds x (dy to dx). */
typedef struct gmh_conv_args {
  int32_t dtype;
  gmh_tensor x, y, dy, dx, weight, bias, dweight, dbias;
  const int32_t* table;
  int64_t table_size;
  int32_t size;     /*!< kernel k or stride s */
  int32_t residual;
} gmh_conv_args;

int gmh_depthwise_conv_fwd(const gmh_conv_args* args);
int gmh_depthwise_conv_bwd(const gmh_conv_args* args);
int gmh_block_conv_fwd(const gmh_conv_args* args);
int gmh_block_conv_bwd(const gmh_conv_args* args);

/* ---- CPU reference grouped window attention (greenmim/reference/attention.hpp) -------------- */

/*! Same semantics as kernels.h's gm_attention_fwd_args / gm_attention_bwd_args, on host memory:
 *  q, k, v, o, d_o, dq, dk, dv [B, N, heads, head_dim] (any strides), lse [B, N, heads],
 *  bias_table / d_bias_table [(2p-1)^2, heads] (data NULL = none), all of `dtype`. The forward
 *  writes o and lse (lse may be NULL); the backward overwrites dq, dk, dv and ACCUMULATES into
 *  d_bias_table. scale 0 selects head_dim^-0.5. */
typedef struct gmh_attention_args {
  int32_t dtype;
  gmh_tensor q, k, v, o, lse, d_o, dq, dk, dv, bias_table, d_bias_table;
  gmh_partition part;
  int32_t window;
  double scale;
} gmh_attention_args;

int gmh_attention_fwd(const gmh_attention_args* args);
int gmh_attention_bwd(const gmh_attention_args* args);

/* ---- The ABI's struct layouts (abi_layout.cpp) ------------------------------------------------ */

/*! One entry of the layout table: struct `name`, and either the struct itself (`field` NULL,
 *  offset 0, size = sizeof) or its member `field` at byte `offset`, `size` bytes. */
typedef struct gmh_abi_entry {
  const char* name;
  const char* field;
  size_t offset;
  size_t size;
} gmh_abi_entry;

/*! Every struct of this header as the library was compiled: *count entries, each struct's own
 *  entry followed by its fields'. The Python package checks its ctypes copies against it. */
const gmh_abi_entry* gmh_abi_layout(size_t* count);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GREENMIM_HOST_H_ */
