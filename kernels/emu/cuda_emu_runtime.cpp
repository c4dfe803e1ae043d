//! \file cuda_emu_runtime.cpp
//! The slice of the CUDA runtime API that greenmim's kernels, tests and benchmarks call, on the
//! emulated device (sm_90 limits): errors, device queries, guarded allocations, copies, events.
#include "cuda_emu.hpp"
#include "emu_state.hpp"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include <sys/mman.h>
#include <unistd.h>

// =====================================================================================================
// The CUDA runtime API, as far as greenmim's kernels and tests use it. Streams are synchronous.
// =====================================================================================================
namespace gm_emu {
namespace internal {

std::size_t page_size() {
  static const std::size_t p = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

std::map<const char*, region> g_regions;  // by user pointer (the emulator is single-threaded)
region g_smem;             // the running CTA's dynamic shared memory
std::size_t g_smem_bytes = 0;
std::map<const void*, int> g_max_dyn_smem;  // cudaFuncAttributeMaxDynamicSharedMemorySize per kernel

// ---- errors --------------------------------------------------------------------------------------
cudaError_t g_last_error = cudaSuccess;    // returned and cleared by cudaGetLastError
cudaError_t g_sticky_error = cudaSuccess;  // a kernel fault: every later call fails
std::string g_fault;
std::uint64_t g_blocks_run = 0;

cudaError_t record(cudaError_t e) {
  if (e != cudaSuccess) g_last_error = e;
  return e;
}

region make_region(std::size_t bytes, std::size_t align, const char* what) {
  const std::size_t pg = page_size();
  const std::size_t body = round_up(std::max<std::size_t>(bytes, 1), pg);
  region r;
  r.map_bytes = body + 2 * pg;
  // MAP_NORESERVE: a large buffer that a test touches only in places (cudaMalloc) needs no swap
  // reserved for the rest
  void* m = mmap(nullptr, r.map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return r;
  r.map = static_cast<char*>(m);
  mprotect(r.map, pg, PROT_NONE);
  mprotect(r.map + pg + body, pg, PROT_NONE);
  r.user = r.map + pg + body - round_up(std::max<std::size_t>(bytes, 1), align);
  r.bytes = bytes;
  r.what = what;
  return r;
}
void drop_region(region& r) {
  if (r.map) munmap(r.map, r.map_bytes);
  r = region{};
}

}  // namespace internal
}  // namespace gm_emu

using namespace gm_emu;
using namespace gm_emu::internal;

extern "C" {

cudaError_t cudaGetLastError(void) {
  if (g_sticky_error != cudaSuccess) return g_sticky_error;
  const cudaError_t e = g_last_error;
  g_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return g_sticky_error != cudaSuccess ? g_sticky_error : g_last_error; }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    default: return "cudaError (emulated)";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  if (e == cudaErrorLaunchFailure) return "unspecified launch failure (emulated kernel fault, see gm_emu::last_fault)";
  return cudaGetErrorName(e);
}

cudaError_t cudaGetDeviceCount(int* n) {
  if (n == nullptr) return record(cudaErrorInvalidValue);
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  if (d == nullptr) return record(cudaErrorInvalidValue);
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : record(cudaErrorInvalidDevice); }

cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr attr, int device) {
  if (v == nullptr || device != 0) return record(cudaErrorInvalidValue);
  switch (attr) {
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = k_smem_optin; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = k_smem_default; return cudaSuccess;
    case cudaDevAttrMultiProcessorCount: *v = k_sm_count; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; return cudaSuccess;
    case cudaDevAttrWarpSize: *v = 32; return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock: *v = 1024; return cudaSuccess;
    default: return record(cudaErrorNotSupported);
  }
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (func == nullptr) return record(cudaErrorInvalidValue);
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || value > k_smem_optin) return record(cudaErrorInvalidValue);
    g_max_dyn_smem[func] = value;
    return cudaSuccess;
  }
  return cudaSuccess;
}

constexpr std::size_t k_poison_max_bytes = std::size_t(1) << 30;
cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (p == nullptr) return record(cudaErrorInvalidValue);
  if (g_sticky_error != cudaSuccess) return g_sticky_error;
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  region r = make_region(bytes, 256, "cudaMalloc buffer");
  if (r.user == nullptr) return record(cudaErrorMemoryAllocation);
  // never-written memory reads as NaN / -1; a buffer over 1 GiB is left as the kernel maps it (zero
  // pages, committed only where touched), so that a test can address rows 2^31 elements apart
  // (64-bit offsets) without committing gigabytes
  if (bytes <= k_poison_max_bytes) std::memset(r.user, 0xFF, bytes);
  g_regions[r.user] = r;
  *p = r.user;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  const auto it = g_regions.find(static_cast<const char*>(p));
  if (it == g_regions.end()) return record(cudaErrorInvalidValue);
  drop_region(it->second);
  g_regions.erase(it);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (g_sticky_error != cudaSuccess) return g_sticky_error;
  if (bytes > 0 && (dst == nullptr || src == nullptr)) return record(cudaErrorInvalidValue);
  if (bytes > 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  if (g_sticky_error != cudaSuccess) return g_sticky_error;
  if (bytes > 0 && p == nullptr) return record(cudaErrorInvalidValue);
  if (bytes > 0) std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) { return cudaMemset(p, value, bytes); }

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr || device != 0) return record(cudaErrorInvalidValue);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "greenmim CPU emulator (sm_90 limits)");
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = k_sm_count;
  prop->l2CacheSize = 50 * 1024 * 1024;
  prop->totalGlobalMem = std::size_t(80) << 30;
  prop->sharedMemPerBlock = k_smem_default;
  prop->sharedMemPerBlockOptin = k_smem_optin;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  return cudaSuccess;
}

// Events: host timestamps (streams are synchronous, so an event completes when recorded).
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  if (e == nullptr) return record(cudaErrorInvalidValue);
  *e = reinterpret_cast<cudaEvent_t>(new std::chrono::steady_clock::time_point());
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<std::chrono::steady_clock::time_point*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  if (e == nullptr) return record(cudaErrorInvalidValue);
  *reinterpret_cast<std::chrono::steady_clock::time_point*>(e) = std::chrono::steady_clock::now();
  return g_sticky_error;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return e == nullptr ? record(cudaErrorInvalidValue) : g_sticky_error; }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  if (ms == nullptr || a == nullptr || b == nullptr) return record(cudaErrorInvalidValue);
  const auto d = *reinterpret_cast<std::chrono::steady_clock::time_point*>(b) -
                 *reinterpret_cast<std::chrono::steady_clock::time_point*>(a);
  *ms = std::chrono::duration<float, std::milli>(d).count();
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { return g_sticky_error; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return g_sticky_error; }

}  // extern "C"
