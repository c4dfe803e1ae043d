//! \file attention_params.hpp
//! Private: the kernel-argument structs of the attention kernels (trivially copyable, passed by
//! value). Their tile shapes: attention_traits.hpp.
#pragma once

#include <cstdint>

#include <greenmim/config.hpp>
#include <greenmim/partition_types.hpp>

#include "attention_traits.hpp"

namespace greenmim {
namespace detail {
namespace cuda {

//! Row of a [B, N, heads, head_dim] tensor: element (b, t, h, 0) = data + b*s[0] + t*s[1] + h*s[2].
template <class T>
struct rows4 {
  T* data = nullptr;
  std::int64_t s[3] = {0, 0, 0};
  GREENMIM_HOST_DEVICE T* row(std::int64_t b, std::int64_t t, std::int64_t h) const {
    return data + b * s[0] + t * s[1] + h * s[2];
  }
};

//! [B, N, heads] float (lse).
struct rows3f {
  float* data = nullptr;
  std::int64_t s[3] = {0, 0, 0};
  GREENMIM_HOST_DEVICE float* at(std::int64_t b, std::int64_t t, std::int64_t h) const {
    return data + b * s[0] + t * s[1] + h * s[2];
  }
};

//! [(2p-1)^2, heads] float table (bias or its gradient).
struct table2f {
  float* data = nullptr;
  std::int64_t s0 = 0, s1 = 0;
  int rows = 0;
};

template <class T>
struct fwd_params {
  rows4<const T> q, k, v;
  rows4<T> o;
  rows3f lse;             // data null: not written
  table2f bias;           // data null: no bias
  partition_view part;
  int batch = 0, heads = 0, window = 1;
  float scale = 1.f;
  bool vec = false;       // every row of q, k, v, o is 16-byte aligned
  int q_tiles = 1;        // query tiles per group (SIMT and tiled tensor-core kernels)
};

template <class T>
struct bwd_params {
  rows4<const T> q, k, v, o, d_o;
  rows4<T> dq, dk, dv;
  rows3f lse;
  table2f bias;           // data null: no bias
  partition_view part;
  int batch = 0, heads = 0, window = 1;
  float scale = 1.f;
  bool vec = false;       // every row of all eight tensors is 16-byte aligned
  int q_tiles = 1;        // query (and key) tiles per group
  float* delta = nullptr; // workspace [B][heads][n_g*G]: rowsum(dO * O) per slot
  float* dbias_partial = nullptr;  // workspace [B*n_g*q_tiles][heads][rows]; null: no dbias
};

}  // namespace cuda
}  // namespace detail
}  // namespace greenmim
