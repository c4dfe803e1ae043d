//! \file greenmim.hpp
//! Umbrella header: everything header-only that needs no Eigen and no CUDA.
#pragma once

#include "config.hpp"
#include "status.hpp"
#include "view.hpp"
#include "geometry.hpp"
#include "cost_model.hpp"
#include "plan.hpp"
#include "planner.hpp"
#include "random_masks.hpp"
#include "windows.hpp"
#include "models.hpp"
#include "partition_types.hpp"
#include "partition.hpp"
#include "attention_mask.hpp"
#include "merging.hpp"
#include "sparse_conv.hpp"
