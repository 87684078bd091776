// ACCRUE_HD marks a function that both the CPU loops and the CUDA kernels
// call: __host__ __device__ (inlined) when nvcc compiles it, plain inline
// otherwise. Formulas written once this way (the optimizer updates, the
// Philox draws, the dropout and attention masks, strided indexing) round the
// same operations in the same order on both backends.
#pragma once

#if defined(__CUDACC__)
#define ACCRUE_HD __host__ __device__ __forceinline__
#else
#define ACCRUE_HD inline
#endif
