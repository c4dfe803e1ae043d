//! \file cuda_emu.hpp
//! A CPU emulator of the CUDA execution model, for testing greenmim's kernels on machines with
//! no GPU. The kernel sources (kernels/*.cu) are compiled as host C++ with
//! GREENMIM_CUDA_EMULATION defined; they then include this header instead of the CUDA runtime's
//! device side, launch through `gm_emu::launch`, and call the runtime API functions that
//! cuda_emu.cpp defines (the test binary does not link cudart).
//!
//! Model. Each CTA runs on its own set of fibers, one per CUDA thread, scheduled cooperatively:
//! a thread runs until it reaches a barrier (__syncthreads*, or any warp collective: shuffles,
//! votes, reductions, __syncwarp, ldmatrix, mma), then yields. So:
//! - every barrier and collective has its real semantics, and a divergent one is detected: lanes
//!   of a warp meeting different collectives, a barrier some threads never reach, a collective
//!   after some lanes exited; the launch then fails with cudaErrorLaunchFailure and a message
//!   (gm_emu::last_fault());
//! - between two barriers threads run in the order of the schedule (forward, reverse or random
//!   per pass, `set_schedule`). A data race between barriers makes the result depend on that
//!   order: tests run a kernel under several schedules and demand bitwise-identical output;
//! - ldmatrix and mma.sync m16n8k16 are warp collectives implemented from the PTX ISA fragment
//!   tables, independently of the kernel's own layout maps (kernels/detail/mma_layout.hpp);
//! - cp.async lands at one of the two ends of its window on the device (`set_cp_async_timing`):
//!   by default at the last moment, when cp.async.wait_group retires its group (or the thread
//!   exits), so a kernel that reads a stage before waiting for it reads stale bytes; or at once,
//!   when issued, so a copy into a buffer that other threads still read changes what they read
//!   (schedule dependence, like any race);
//! - cudaMalloc'd buffers and the dynamic shared memory end at a guard page (accesses past them
//!   abort with a message, like compute-sanitizer's memcheck), and both start filled with 0xFF
//!   bytes, a NaN in every float type, so reads of never-written memory show up as NaN (a
//!   cudaMalloc'd buffer over 1 GiB starts zeroed instead: its pages are committed only where
//!   touched, so a test can address 2^31 elements without gigabytes of memory);
//! - launch configuration is checked against sm_90 limits (block size, grid y/z, dynamic
//!   shared memory above 48 KB only after cudaFuncSetAttribute, up to the opt-in limit).
//! What it cannot show: timing, occupancy, register pressure, the real memory model (a CTA runs
//! alone, every access is sequentially consistent), and the compiler's code generation.
#pragma once

#if !defined(GREENMIM_CUDA_EMULATION)
#error "cuda_emu.hpp is only for the host (emulation) build of the kernels"
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>

namespace gm_emu {

// ---- configuration -------------------------------------------------------------------------------
enum class schedule { forward, reverse, random, greedy };
//! Order in which runnable threads are resumed between barriers (random: reshuffled every pass,
//! from `seed`; greedy: the lowest-numbered runnable thread always runs next, so warp 0 runs ahead
//! to each __syncthreads before warp 1 starts: the most skew between warps). Default: forward.
void set_schedule(schedule s, std::uint64_t seed = 0);
schedule get_schedule();
//! When cp.async's shared-memory writes land: at wait_group (default) or when issued.
enum class cp_async_timing { at_wait, at_issue };
void set_cp_async_timing(cp_async_timing t);

//! The message of the last kernel fault (divergent barrier, deadlock, misuse), "" if none.
std::string last_fault();
//! Clears the sticky error of a fault (the emulator's own tests provoke faults on purpose).
void clear_fault();
//! Number of CTAs run so far (tests check that a kernel ran at all).
std::uint64_t blocks_run();

// ---- state of the running CUDA thread --------------------------------------------------------------
const uint3& thread_idx();
extern uint3 g_block_idx;
extern dim3 g_block_dim;
extern dim3 g_grid_dim;

void* dynamic_smem_ptr();
template <class T>
T* dynamic_smem() {
  return static_cast<T*>(dynamic_smem_ptr());
}

// ---- barriers and collectives -------------------------------------------------------------------
enum collective : int { k_syncwarp = 1, k_shfl, k_vote, k_reduce, k_ldmatrix, k_mma };
enum block_barrier : int { k_sync = 1, k_and, k_or, k_count };

//! __syncthreads and its reductions: returns the number of threads with pred != 0.
int block_sync(block_barrier kind, int pred);
//! Writes `bytes` (<= slot_bytes) of `in` into this lane's slot, waits until every lane of the
//! warp has done the same at a collective of the same kind, and returns the 32 slots (slot i at
//! offset i * slot_bytes), valid until this lane's next collective.
constexpr std::size_t slot_bytes = 64;
const unsigned char* warp_exchange(collective kind, unsigned mask, const void* in, std::size_t bytes);
int lane_id();
//! Reports a fault from inside a kernel: the CTA stops, the launch fails. Does not return.
[[noreturn]] void fault(const std::string& why);

void ldmatrix_x4(unsigned (&r)[4], const void* p, bool trans);
//! cp.async.cg 16 bytes (read now, written to `dst` when its group retires), commit_group, and
//! wait_group n (retires every committed group but the newest n), per emulated thread.
void cp_async16(void* dst, const void* src);
void cp_async_commit();
void cp_async_wait(int n);
void mma_m16n8k16_bf16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1);
void mma_m16n8k16_f16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1);
template <class T>
inline void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  static_assert(std::is_same<T, __half>::value || std::is_same<T, __nv_bfloat16>::value, "mma: f16 or bf16");
  if constexpr (std::is_same<T, __half>::value) mma_m16n8k16_f16(d, a, b0, b1);
  else mma_m16n8k16_bf16(d, a, b0, b1);
}

// ---- launch ----------------------------------------------------------------------------------------
cudaError_t launch_impl(const void* kernel, dim3 grid, dim3 block, std::size_t smem, cudaStream_t stream,
                        const std::function<void()>& body);

template <class... Params>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t stream,
                   Params... args) {
  return launch_impl(reinterpret_cast<const void*>(kernel), grid, block, smem, stream, [&]() { kernel(args...); });
}

}  // namespace gm_emu

// cuda_runtime.h's typed overload (this header stands in for cuda_runtime.h)
template <class T>
inline cudaError_t cudaFuncSetAttribute(T* entry, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(entry), attr, value);
}

// ---- the CUDA names the kernels use ------------------------------------------------------------------
#undef __global__
#define __global__
#undef __device__
#define __device__
#undef __host__
#define __host__
#undef __forceinline__
#define __forceinline__ inline
#undef __launch_bounds__
#define __launch_bounds__(...)
// Static shared memory: one instance per kernel instantiation, shared by the CTA's fibers (CTAs
// run one at a time).
#undef __shared__
#define __shared__ static

#define threadIdx (::gm_emu::thread_idx())
#define blockIdx (::gm_emu::g_block_idx)
#define blockDim (::gm_emu::g_block_dim)
#define gridDim (::gm_emu::g_grid_dim)

inline void __syncthreads() { (void)gm_emu::block_sync(gm_emu::k_sync, 0); }
inline int __syncthreads_and(int p) { return gm_emu::block_sync(gm_emu::k_and, p) == static_cast<int>(blockDim.x * blockDim.y * blockDim.z); }
inline int __syncthreads_or(int p) { return gm_emu::block_sync(gm_emu::k_or, p) > 0; }
inline int __syncthreads_count(int p) { return gm_emu::block_sync(gm_emu::k_count, p); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { (void)gm_emu::warp_exchange(gm_emu::k_syncwarp, mask, nullptr, 0); }

template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= gm_emu::slot_bytes, "shuffle of a small value");
  const unsigned char* all = gm_emu::warp_exchange(gm_emu::k_shfl, mask, &v, sizeof(T));
  const int lane = gm_emu::lane_id();
  int src = lane ^ lane_mask;
  if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;  // outside the segment: own value
  T r;
  std::memcpy(&r, all + static_cast<std::size_t>(src) * gm_emu::slot_bytes, sizeof(T));
  return r;
}
template <class T>
inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= gm_emu::slot_bytes, "shuffle of a small value");
  const unsigned char* all = gm_emu::warp_exchange(gm_emu::k_shfl, mask, &v, sizeof(T));
  const int lane = gm_emu::lane_id();
  const int src = (lane & ~(width - 1)) + (src_lane & (width - 1));
  T r;
  std::memcpy(&r, all + static_cast<std::size_t>(src) * gm_emu::slot_bytes, sizeof(T));
  return r;
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  const int p = pred != 0;
  const unsigned char* all = gm_emu::warp_exchange(gm_emu::k_vote, mask, &p, sizeof(p));
  unsigned b = 0;
  for (int i = 0; i < 32; ++i) {
    int x;
    std::memcpy(&x, all + static_cast<std::size_t>(i) * gm_emu::slot_bytes, sizeof(x));
    if (x) b |= 1u << i;
  }
  return b;
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == mask; }

namespace gm_emu {
template <class T, class Op>
inline T warp_reduce(unsigned mask, T v, Op op) {
  const unsigned char* all = warp_exchange(k_reduce, mask, &v, sizeof(T));
  T r;
  std::memcpy(&r, all, sizeof(T));
  for (int i = 1; i < 32; ++i) {
    T x;
    std::memcpy(&x, all + static_cast<std::size_t>(i) * slot_bytes, sizeof(T));
    r = op(r, x);
  }
  return r;
}
}  // namespace gm_emu
inline int __reduce_min_sync(unsigned mask, int v) { return gm_emu::warp_reduce(mask, v, [](int a, int b) { return a < b ? a : b; }); }
inline int __reduce_max_sync(unsigned mask, int v) { return gm_emu::warp_reduce(mask, v, [](int a, int b) { return a > b ? a : b; }); }
inline int __reduce_add_sync(unsigned mask, int v) {
  return gm_emu::warp_reduce(mask, v, [](int a, int b) { return static_cast<int>(static_cast<unsigned>(a) + static_cast<unsigned>(b)); });
}
inline unsigned __reduce_min_sync(unsigned mask, unsigned v) { return gm_emu::warp_reduce(mask, v, [](unsigned a, unsigned b) { return a < b ? a : b; }); }
inline unsigned __reduce_max_sync(unsigned mask, unsigned v) { return gm_emu::warp_reduce(mask, v, [](unsigned a, unsigned b) { return a > b ? a : b; }); }

// Atomics: a fiber never yields inside one, so plain read-modify-writes are atomic here. Integer
// only: the kernels promise no float atomics (determinism), and a float atomicAdd would not compile.
inline int atomicAdd(int* p, int v) { const int o = *p; *p = o + v; return o; }
inline unsigned atomicAdd(unsigned* p, unsigned v) { const unsigned o = *p; *p = o + v; return o; }
inline int atomicMin(int* p, int v) { const int o = *p; *p = v < o ? v : o; return o; }
inline int atomicMax(int* p, int v) { const int o = *p; *p = v > o ? v : o; return o; }

template <class T>
inline T __ldg(const T* p) { return *p; }

inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
//! The fast exp is ex2.approx(x * log2 e): the same two steps, in single precision.
inline float __expf(float x) { return std::exp2(static_cast<float>(x * 1.4426950408889634f)); }

// Device min / max: CUDA's overloads for mixed integer types promote like the usual arithmetic
// conversions; these do the same.
template <class A, class B, class = std::enable_if_t<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value>>
inline std::common_type_t<A, B> min(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(b) < static_cast<C>(a) ? static_cast<C>(b) : static_cast<C>(a);
}
template <class A, class B, class = std::enable_if_t<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value>>
inline std::common_type_t<A, B> max(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(b) : static_cast<C>(a);
}
