/* kernels.h is a C header: this translation unit must compile as C99 (ctest kernels_h_is_c). */
#include <greenmim/kernels.h>

int gm_c_abi_check(void) {
  gm_attention_fwd_args a = {0};
  a.dtype = GM_BFLOAT16;
  a.algo = GM_ALGO_AUTO;
  return (int)a.dtype + (int)a.algo + (int)sizeof(gm_partition_args) * 0;
}
