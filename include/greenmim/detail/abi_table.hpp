//! \file detail/abi_table.hpp
//! Private: the macro the two C ABIs (kernels.h, python/csrc/greenmim_host.h) build their struct
//! layout tables with (`gm_abi_layout`, `gmh_abi_layout`): one line per struct,
//! `GREENMIM_ABI_STRUCT(type, field, field, ...)`, gives one entry for the struct (field null,
//! size = sizeof) and one per listed field (offset, size). A loader that declares the structs
//! again (the Python package's ctypes classes) checks its copies against the table: every field
//! by name, offset and size, and the struct's size, so a field added in C and forgotten in the
//! loader (or in the table's line) shows up as a mismatch.
#pragma once

#include <cstddef>

#define GREENMIM_ABI_FIELD_(S, F) {#S, #F, offsetof(S, F), sizeof(static_cast<S*>(nullptr)->F)},

// GREENMIM_ABI_EACH_(S, f1, ..., fn): GREENMIM_ABI_FIELD_(S, fi) for each field, n <= 24.
#define GREENMIM_ABI_N_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18, _19, _20, \
                        _21, _22, _23, _24, N, ...)                                                             \
  N
#define GREENMIM_ABI_COUNT_(...) \
  GREENMIM_ABI_N_(__VA_ARGS__, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define GREENMIM_ABI_CAT_(a, b) a##b
#define GREENMIM_ABI_CAT(a, b) GREENMIM_ABI_CAT_(a, b)
#define GREENMIM_ABI_E1_(S, F) GREENMIM_ABI_FIELD_(S, F)
#define GREENMIM_ABI_E2_(S, F, ...) GREENMIM_ABI_FIELD_(S, F) GREENMIM_ABI_E1_(S, __VA_ARGS__)
#define GREENMIM_ABI_E3_(S, F, ...) GREENMIM_ABI_FIELD_(S, F) GREENMIM_ABI_E2_(S, __VA_ARGS__)
#define GREENMIM_ABI_E4_(S, F, ...) GREENMIM_ABI_FIELD_(S, F) GREENMIM_ABI_E3_(S, __VA_ARGS__)
#define GREENMIM_ABI_E5_(S, F, ...) GREENMIM_ABI_FIELD_(S, F) GREENMIM_ABI_E4_(S, __VA_ARGS__)
#define GREENMIM_ABI_E6_(S, F, ...) GREENMIM_ABI_FIELD_(S, F) GREENMIM_ABI_E5_(S, __VA_ARGS__)
#define GREENMIM_ABI_E7_(S, F, ...) GREENMIM_ABI_FIELD_(S, F) GREENMIM_ABI_E6_(S, __VA_ARGS__)
#define GREENMIM_ABI_E8_(S, F, ...) GREENMIM_ABI_FIELD_(S, F) GREENMIM_ABI_E7_(S, __VA_ARGS__)
#define GREENMIM_ABI_E9_(S, F, ...) GREENMIM_ABI_FIELD_(S, F) GREENMIM_ABI_E8_(S, __VA_ARGS__)
#define GREENMIM_ABI_E10_(S, F, ...) GREENMIM_ABI_FIELD_(S, F) GREENMIM_ABI_E9_(S, __VA_ARGS__)
#define GREENMIM_ABI_E11_(S, F, ...) GREENMIM_ABI_FIELD_(S, F) GREENMIM_ABI_E10_(S, __VA_ARGS__)
#define GREENMIM_ABI_E12_(S, F, ...) GREENMIM_ABI_FIELD_(S, F) GREENMIM_ABI_E11_(S, __VA_ARGS__)
#define GREENMIM_ABI_E13_(S, F, ...) GREENMIM_ABI_FIELD_(S, F) GREENMIM_ABI_E12_(S, __VA_ARGS__)
#define GREENMIM_ABI_E14_(S, F, ...) GREENMIM_ABI_FIELD_(S, F) GREENMIM_ABI_E13_(S, __VA_ARGS__)
#define GREENMIM_ABI_E15_(S, F, ...) GREENMIM_ABI_FIELD_(S, F) GREENMIM_ABI_E14_(S, __VA_ARGS__)
#define GREENMIM_ABI_E16_(S, F, ...) GREENMIM_ABI_FIELD_(S, F) GREENMIM_ABI_E15_(S, __VA_ARGS__)
#define GREENMIM_ABI_E17_(S, F, ...) GREENMIM_ABI_FIELD_(S, F) GREENMIM_ABI_E16_(S, __VA_ARGS__)
#define GREENMIM_ABI_E18_(S, F, ...) GREENMIM_ABI_FIELD_(S, F) GREENMIM_ABI_E17_(S, __VA_ARGS__)
#define GREENMIM_ABI_E19_(S, F, ...) GREENMIM_ABI_FIELD_(S, F) GREENMIM_ABI_E18_(S, __VA_ARGS__)
#define GREENMIM_ABI_E20_(S, F, ...) GREENMIM_ABI_FIELD_(S, F) GREENMIM_ABI_E19_(S, __VA_ARGS__)
#define GREENMIM_ABI_E21_(S, F, ...) GREENMIM_ABI_FIELD_(S, F) GREENMIM_ABI_E20_(S, __VA_ARGS__)
#define GREENMIM_ABI_E22_(S, F, ...) GREENMIM_ABI_FIELD_(S, F) GREENMIM_ABI_E21_(S, __VA_ARGS__)
#define GREENMIM_ABI_E23_(S, F, ...) GREENMIM_ABI_FIELD_(S, F) GREENMIM_ABI_E22_(S, __VA_ARGS__)
#define GREENMIM_ABI_E24_(S, F, ...) GREENMIM_ABI_FIELD_(S, F) GREENMIM_ABI_E23_(S, __VA_ARGS__)

//! The table entries of struct S: {"S", nullptr, 0, sizeof(S)}, then one per field.
#define GREENMIM_ABI_STRUCT(S, ...) \
  {#S, nullptr, 0, sizeof(S)}, GREENMIM_ABI_CAT(GREENMIM_ABI_E, GREENMIM_ABI_CAT(GREENMIM_ABI_COUNT_(__VA_ARGS__), _))(S, __VA_ARGS__)
