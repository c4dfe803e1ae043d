//! \file attention_fwd.cu
//! Forward entry points of group window attention (C ABI) and the instantiations of the forward
//! kernels: SIMT for {fp32, fp16, bf16} x head_dim {32, 64}; tensor-core for {fp16, bf16} x {32,
//! 64}, one pass up to k_mma_one_pass_max_group slots (several heads per CTA at head_dim 32),
//! 64-slot query tiles above, up to GM_MMA_MAX_GROUP.
#include <greenmim/kernels.h>

#include "detail/attention_checks.hpp"
#include "detail/attention_fwd_mma.cuh"
#include "detail/attention_fwd_mma_tiled.cuh"
#include "detail/attention_simt.cuh"
#include "detail/attention_traits.hpp"
#include "detail/fwd_tuning.hpp"
#include "detail/launch.cuh"

namespace greenmim {
namespace detail {
namespace cuda {

namespace {

//! Checks; on success `d` describes the problem and `use_mma` the chosen implementation.
cudaError_t check_fwd(const gm_attention_fwd_args* a, attn_dims& d, bool& use_mma) {
  clear_refusal();
  GM_REFUSE_IF(a == nullptr, "args is null");
  GM_TRY(check_attention_core(a->dtype, a->q, a->bias_table, a->part, a->window, a->scale, a->algo, d));
  GM_TRY(check_like_q(a->k, d, a->dtype, false, "k: shape must equal q's; null, misaligned or non-unit last stride"));
  GM_TRY(check_like_q(a->v, d, a->dtype, false, "v: shape must equal q's; null, misaligned or non-unit last stride"));
  GM_TRY(check_like_q(a->o, d, a->dtype, true, "o: shape must equal q's; null, misaligned, non-unit last stride or self-overlapping"));
  if (a->lse.data != nullptr)
    GM_TRY(check_lse(a->lse, d, true, "lse must be float32 [B, N, heads], non-negative strides, not self-overlapping"));
  const std::size_t es = dtype_bytes(a->dtype);
  const gm_tensor* ins[3] = {&a->q, &a->k, &a->v};
  for (const gm_tensor* in : ins) {
    GM_REFUSE_IF(overlap(a->o, es, *in, es), "o overlaps an input");
    if (a->lse.data != nullptr) GM_REFUSE_IF(overlap(a->lse, 4, *in, es), "lse overlaps an input");
  }
  if (a->lse.data != nullptr) GM_REFUSE_IF(overlap(a->lse, 4, a->o, es), "lse overlaps o");
  if (d.with_bias) {
    GM_REFUSE_IF(overlap(a->o, es, a->bias_table, 4), "o overlaps the bias table");
    if (a->lse.data != nullptr) GM_REFUSE_IF(overlap(a->lse, 4, a->bias_table, 4), "lse overlaps the bias table");
  }
  const bool vec = rows_aligned16(a->q, es) && rows_aligned16(a->k, es) && rows_aligned16(a->v, es) &&
                   rows_aligned16(a->o, es);
  // tensor cores: one pass, or query tiles (both within the default shared memory for any window
  // the checks accept)
  const int G = a->part.group_size;
  const bool one_pass = G <= k_mma_one_pass_max_group;
  const std::size_t mma_smem = one_pass ? (d.D == 32 ? mma_tile<32>::smem_fwd(d.bias_rows) : mma_tile<64>::smem_fwd(d.bias_rows))
                                        : (d.D == 32 ? mma_tile<32>::smem_fwd_tiled(d.bias_rows)
                                                     : mma_tile<64>::smem_fwd_tiled(d.bias_rows));
  const bool mma_ok = a->dtype != GM_FLOAT32 && G <= k_mma_max_group && vec && mma_smem <= k_default_smem_bytes;
  if (a->algo == GM_ALGO_MMA)
    GM_REFUSE_IF(!mma_ok, "GM_ALGO_MMA needs fp16/bf16, group_size <= " GM_STRINGIFY(GM_MMA_MAX_GROUP)
                          ", 16-byte aligned rows and window <= " GM_STRINGIFY(GM_MAX_WINDOW));
  use_mma = a->algo == GM_ALGO_MMA || (a->algo == GM_ALGO_AUTO && mma_ok);
  return cudaSuccess;
}

template <class T, int D>
cudaError_t run_fwd(const gm_attention_fwd_args& a, const attn_dims& d, bool use_mma, const fwd_tuning& tuning,
                    cudaStream_t stream) {
  fwd_params<T> p;
  set_shared_params<T>(p, a, d);
  p.o = to_rows<T>(a.o);
  const std::size_t es = sizeof(T);
  p.vec = rows_aligned16(a.q, es) && rows_aligned16(a.k, es) && rows_aligned16(a.v, es) && rows_aligned16(a.o, es);
  if (use_mma) {
    if constexpr (!std::is_same<T, float>::value) {
      using C = mma_tile<D>;
      if (a.part.group_size > k_mma_one_pass_max_group) {  // query tiles, grid as the SIMT kernel's
        p.q_tiles = d.q_tiles;
        const dim3 grid(static_cast<unsigned>(a.part.num_groups * d.q_tiles), static_cast<unsigned>(d.H),
                        static_cast<unsigned>(d.B));
        return launch(attention_fwd_mma_tiled<T, D>, grid, C::THREADS, C::smem_fwd_tiled(d.bias_rows), stream, p);
      }
      p.q_tiles = 1;
      if constexpr (D == 32) {  // several heads per CTA (head_dim 64: see fwd_heads_min_ctas)
        auto fits = [&](int hpc) { return C::smem_fwd_heads(d.bias_rows, hpc) <= k_default_smem_bytes; };
        int hpc = 1;  // the automatic choice (fwd_tuning.hpp says why)
        if (tuning.heads_per_cta > 0) {
          hpc = tuning.heads_per_cta < d.H ? tuning.heads_per_cta : static_cast<int>(d.H);
          while (hpc > 1 && !fits(hpc)) --hpc;
        }
        if (hpc > 1) {
          const unsigned head_ctas = static_cast<unsigned>((d.H + hpc - 1) / hpc);
          const dim3 grid(static_cast<unsigned>(a.part.num_groups), head_ctas, static_cast<unsigned>(d.B));
          return launch(attention_fwd_mma_heads<T, D>, grid, C::THREADS, C::smem_fwd_heads(d.bias_rows, hpc), stream, p,
                        hpc);
        }
      }
      const dim3 grid(static_cast<unsigned>(a.part.num_groups), static_cast<unsigned>(d.H), static_cast<unsigned>(d.B));
      return launch(attention_fwd_mma<T, D>, grid, C::THREADS, C::smem_fwd(d.bias_rows), stream, p);
    }
    return refuse("internal: mma path for float32");
  }
  p.q_tiles = d.q_tiles;
  const dim3 grid(static_cast<unsigned>(a.part.num_groups * d.q_tiles), static_cast<unsigned>(d.H),
                  static_cast<unsigned>(d.B));
  return launch(attention_fwd_simt<T, D>, grid, simt_tile<D>::THREADS, simt_tile<D>::smem_fwd(a.part.group_size), stream,
                p);
}

template <class T>
cudaError_t run_fwd_d(const gm_attention_fwd_args& a, const attn_dims& d, bool use_mma, const fwd_tuning& tuning,
                      cudaStream_t stream) {
  return d.D == 32 ? run_fwd<T, 32>(a, d, use_mma, tuning, stream) : run_fwd<T, 64>(a, d, use_mma, tuning, stream);
}

}  // namespace

cudaError_t attention_fwd(const gm_attention_fwd_args* args, const fwd_tuning& tuning, cudaStream_t stream) {
  return no_throw([&]() -> cudaError_t {
    attn_dims d;
    bool use_mma = false;
    GM_TRY(check_fwd(args, d, use_mma));
    if (d.B == 0 || d.N == 0 || d.H == 0 || args->part.num_groups == 0) return cudaSuccess;
    return with_element_type(args->dtype, [&](auto t) {
      using T = typename decltype(t)::type;
      return run_fwd_d<T>(*args, d, !std::is_same<T, float>::value && use_mma, tuning, stream);
    });
  });
}

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim

extern "C" cudaError_t gm_attention_fwd_can_implement(const gm_attention_fwd_args* args) {
  using namespace greenmim::detail::cuda;
  return no_throw([&]() -> cudaError_t {
    attn_dims d;
    bool use_mma = false;
    return check_fwd(args, d, use_mma);
  });
}

extern "C" cudaError_t gm_attention_fwd(const gm_attention_fwd_args* args, cudaStream_t stream) {
  return greenmim::detail::cuda::attention_fwd(args, greenmim::detail::cuda::fwd_tuning{}, stream);
}
