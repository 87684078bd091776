// The backend function lists as X-macros: how a function of a CPU or CUDA
// backend is declared, once. Private to kernels/.
//
// Note [Backend function lists]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Each op family lists the functions its backends implement in one file,
// kernels/<family>_functions.inc (backend_functions.inc for the elementwise,
// reduction, matmul and nn ops), one line per function, its contract in a
// comment above it:
//   ACCRUE_BACKEND_FN(ret, name, (params))  both backends implement it;
//   ACCRUE_CPU_FN(ret, name, (params))      only the CPU (a reference that
//                                           CUDA reaches by another path);
//   ACCRUE_CUDA_FN(ret, name, (params))     only CUDA (a fused epilogue, a
//                                           kernel the CPU composes).
// The family's *_backend.h includes its .inc into both accrue::kernels::cpu
// and accrue::kernels::cuda, where every line is a declaration (types the
// functions share stay in the header, outside those namespaces). A
// one-backend line is declared in both namespaces but defined in one, so a
// call to the other fails to link, naming the function. The .inc files have
// no include guard: kernels/cuda/unavailable.cpp includes every one again,
// with the macros redefined, to define the CUDA side of a build without
// CUDA, so that build has no hand-kept list of stubs. Dispatch calls a
// function through ACCRUE_BACKEND_CALL (kernels/dispatch_util.h), which picks
// the backend by the tensor's device. docs/ARCHITECTURE.md ("Adding an op")
// has the recipe.
#pragma once

#define ACCRUE_BACKEND_FN(ret, name, params) ret name params;
#define ACCRUE_CPU_FN(ret, name, params) ret name params;
#define ACCRUE_CUDA_FN(ret, name, params) ret name params;
