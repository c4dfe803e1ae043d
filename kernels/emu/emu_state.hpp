//! \file emu_state.hpp
//! Private to the emulator's sources (cuda_emu.cpp, cuda_emu_mma.cpp, cuda_emu_runtime.cpp): the
//! emulated device's limits, guarded memory regions and the state they share. Single-threaded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "cuda_emu.hpp"

namespace gm_emu {
namespace internal {

// ---- emulated device limits (sm_90) ------------------------------------------------------------------
constexpr int k_smem_default = 48 * 1024;
constexpr int k_smem_optin = 227 * 1024;
constexpr int k_sm_count = 132;

std::size_t page_size();
inline std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

//! A guarded region: [guard page][ ... user bytes ending at a page boundary ][guard page].
struct region {
  char* map = nullptr;     // mmap base
  std::size_t map_bytes = 0;
  char* user = nullptr;    // what the caller gets
  std::size_t bytes = 0;   // what the caller asked for
  const char* what = "";
};
region make_region(std::size_t bytes, std::size_t align, const char* what);
void drop_region(region& r);

extern std::map<const char*, region> g_regions;  // cudaMalloc'd buffers, by user pointer
extern region g_smem;                            // the running CTA's dynamic shared memory
extern std::size_t g_smem_bytes;
extern std::map<const void*, int> g_max_dyn_smem;  // cudaFuncAttributeMaxDynamicSharedMemorySize per kernel

extern cudaError_t g_last_error;    // returned and cleared by cudaGetLastError
extern cudaError_t g_sticky_error;  // a kernel fault: every later call fails
extern std::string g_fault;
extern std::uint64_t g_blocks_run;
//! Records a failed call's error for cudaGetLastError; returns `e`.
cudaError_t record(cudaError_t e);

}  // namespace internal
}  // namespace gm_emu
