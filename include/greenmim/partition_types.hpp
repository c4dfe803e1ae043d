//! \file partition_types.hpp
//! The partition-index layout shared by the index builders (partition.hpp), the CPU reference
//! (reference/) and the CUDA kernels. A kernel reads nothing but these arrays.
//!
//! Token axis: tokens are addressed by a flat index t in [0, num_tokens). With one shared mask
//! (the paper's case) t indexes the visible tokens of one sample in row-major order of their
//! (h, w) and the same indices serve every sample of the batch (batch stride applies). With
//! per-sample masks the token axis is the flattened (sample, token) axis of the whole batch
//! (cu_seqlens style) and the batch extent is 1.
//!
//! Slots: group g owns slots [g*G, (g+1)*G). A group's windows are laid out in plan order, each
//! window's tokens in ascending token order, padding at the end of the group.
#pragma once

#include <vector>

#include "config.hpp"
#include "view.hpp"

namespace greenmim {

//! Owning host-side partition indices (built by partition.hpp).
struct partition_indices {
  index_t group_size = 0;           //!< G
  index_t num_groups = 0;           //!< n_g
  index_t num_tokens = 0;           //!< N: length of the token axis
  std::vector<index_t> gather;      //!< [n_g*G] token index of each slot, `pad_index` for padding
  std::vector<index_t> scatter;     //!< [N] slot of each token (the inverse of gather)
  std::vector<index_t> slot_window; //!< [n_g*G] window id of each slot, `pad_index` for padding
  std::vector<index_t> slot_coord;  //!< [n_g*G] packed absolute (h, w) (`pack_coord`), 0 for padding

  index_t num_slots() const { return group_size * num_groups; }
};

//! Non-owning, trivially copyable view of partition indices: what crosses into kernels.
struct partition_view {
  const index_t* gather = nullptr;
  const index_t* scatter = nullptr;
  const index_t* slot_window = nullptr;
  const index_t* slot_coord = nullptr;
  index_t group_size = 0;
  index_t num_groups = 0;
  index_t num_tokens = 0;

  GREENMIM_HOST_DEVICE constexpr index_t num_slots() const { return group_size * num_groups; }
};

inline partition_view make_partition_view(const partition_indices& p) {
  return partition_view{p.gather.data(), p.scatter.data(), p.slot_window.data(), p.slot_coord.data(),
                        p.group_size,    p.num_groups,     p.num_tokens};
}

}  // namespace greenmim
