//! \file cuda_api.cpp
//! The one source of the shared libraries greenmim_cuda (the kernels, nvcc) and greenmim_emu
//! (the same kernel sources on the CPU emulator, kernels/emu): their exported symbols are the C
//! ABI of kernels.h (gm_kernels_abi_version and gm_abi_layout included, for a loader to check
//! the library against its own struct declarations), linked in whole from the static kernel
//! library; this file adds nothing.
#include <greenmim/kernels.h>
