//! \file cub.cuh
//! Private: the CUB device algorithms index_build.cu uses, or under GREENMIM_CUDA_EMULATION their
//! sequential stand-ins (kernels/emu/cub_emu.hpp, same two-phase temporary-storage protocol).
#pragma once

#if defined(GREENMIM_CUDA_EMULATION)
#include "cub_emu.hpp"
#else
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>
#endif
