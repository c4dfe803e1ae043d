/*! \file kernel_limits.h
 *  What greenmim's CUDA attention kernels accept, as plain C macros with no CUDA include: kernels.h
 *  includes it, and host code that plans for the kernels (the planner cap, the CLI's "cuda" note,
 *  the package) reads the same numbers without the CUDA headers (kernel_limits.hpp).
 */
#ifndef GREENMIM_KERNEL_LIMITS_H_
#define GREENMIM_KERNEL_LIMITS_H_

/*! Largest group size the kernels accept. */
#define GM_SIMT_MAX_GROUP 1024
/*! Largest group size of the tensor-core kernels (GM_ALGO_MMA, forward and backward). */
#define GM_MMA_MAX_GROUP 256
/*! Largest window p of the relative-position bias table. */
#define GM_MAX_WINDOW 32

/*! A macro's value as a string literal (refusal messages quote the limits above). */
#define GM_STRINGIFY_(x) #x
#define GM_STRINGIFY(x) GM_STRINGIFY_(x)

#endif /* GREENMIM_KERNEL_LIMITS_H_ */
