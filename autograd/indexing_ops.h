// The differentiable shape and index ops: cat, stack, split, chunk, unbind,
// repeat_interleave, gather, scatter_add, index_select, index_add, cumsum,
// sort and topk (values), plus the integer-valued one_hot, argmax and argsort.
// PyTorch's semantics (Note [Indexing ops] in kernels/indexing.h); each
// differentiable op passes the float64 gradcheck (tests/autograd).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "accrue/core/tensor.h"
#include "accrue/kernels/indexing.h"

namespace accrue {

// ---- joining and splitting ------------------------------------------------------
// The gradient of each input is its slice of the output's gradient.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
// Differentiable views (narrow): split(x, 2, 1) pieces of 2 (the last may
// be smaller), split(x, {1, 3}, 1) pieces of 1 and 3; chunk(x, n, d) at most
// n pieces of ceil(size / n).
std::vector<Tensor> split(const Tensor& x, const SplitSizes& sizes, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);
// The slices of x along dim, that dim removed (select views): q, k, v of a
// packed [B, T, 3, H, D] tensor are unbind(qkv, 2).
std::vector<Tensor> unbind(const Tensor& x, int64_t dim = 0);
// [a, b] -> [a, a, b, b] along dim (repeats 2): grouped-query attention's
// key/value heads for a reference path. The gradient sums each group.
Tensor repeat_interleave(const Tensor& x, int64_t repeats, int64_t dim);

// ---- gathers and scatter-adds (index i64; checked: Note [Deferred index checks]) ----
// The gradients pair up: gather's is a scatter_add into zeros, scatter_add's
// src gets a gather; index_select's is an index_add into zeros, index_add's
// src gets an index_select (times alpha). x's gradient through scatter_add
// and index_add is the output's. The index gets none.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src,
                 double alpha = 1.0);
// Not differentiable (an integer or bool result): [..., num_classes].
Tensor one_hot(const Tensor& index, int64_t num_classes = -1, DType dtype = DType::i64);

// ---- scans and orderings --------------------------------------------------------
// The gradient is the reversed cumsum of the output's.
Tensor cumsum(const Tensor& x, int64_t dim);
// The first maximum's position along dim (over the flattened tensor without a
// dim); i64, not differentiable.
Tensor argmax(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
// values are differentiable (their gradient goes back to the positions in
// indices); indices are i64. Stable, NaN ordered above every number.
SortResult sort(const Tensor& x, int64_t dim = -1, bool descending = false);
Tensor argsort(const Tensor& x, int64_t dim = -1, bool descending = false);
SortResult topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true,
                bool sorted = true);

}  // namespace accrue
