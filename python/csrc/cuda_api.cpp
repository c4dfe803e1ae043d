//! \file cuda_api.cpp
//! The one source of the shared libraries greenmim_cuda (the kernels, nvcc) and greenmim_emu
//! (the same kernel sources on the CPU emulator, kernels/emu): their exported symbols are the C
//! ABI of kernels.h, linked in whole from the static kernel library. This file only adds a
//! version query, so a loader can check that the library and its own struct layouts agree.
#include <greenmim/kernels.h>

extern "C" __attribute__((visibility("default"))) int gm_kernels_abi_version(void) { return GM_KERNELS_ABI_VERSION; }
