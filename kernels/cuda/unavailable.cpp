// The CUDA backend of a build without CUDA (ACCRUE_CUDA=OFF or no nvcc): every
// function of kernels/backend_functions.inc exists, so dispatch links, and
// throws. No CUDA tensor can exist in such a build (the allocator refuses), so
// reaching one of these means a bug, reported rather than crashing.
#include <string>

#include "kernels/backend.h"
#include "kernels/batch_norm_backend.h"
#include "kernels/conv_backend.h"
#include "kernels/index_checks_backend.h"

namespace accrue::kernels::cuda {

namespace {

[[noreturn]] void unavailable(const std::string& op) {
  ACCRUE_FAIL(op, ": accrue was built without CUDA");
}

}  // namespace

void binary(BinaryOp op, const Tensor&, const Tensor&, const Tensor&) {
  unavailable(op_name(op));
}
void binary_scalar(BinaryOp op, const Tensor&, double, bool, const Tensor&) {
  unavailable(op_name(op));
}
void unary(UnaryOp op, const Tensor&, double, const Tensor&) {
  unavailable(op_name(op));
}
void unary_backward(UnaryOp op, const Tensor&, const Tensor&, const Tensor&, double,
                    const Tensor&) {
  unavailable(std::string(op_name(op)) + "_backward");
}
void compare(CompareOp, const Tensor&, const Tensor&, const Tensor&) {
  unavailable("compare");
}
void where(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  unavailable("where");
}
void axpy(const Tensor&, double, const Tensor&) {
  unavailable("axpy_");
}
void reduce_last(ReduceOp, const Tensor&, const Tensor&) {
  unavailable("reduce");
}
void sum_rows(const Tensor&, const Tensor&, bool) {
  unavailable("sum_rows_into");
}
void softmax(const Tensor&, const Tensor&, bool log) {
  unavailable(log ? "log_softmax" : "softmax");
}
void softmax_backward(const Tensor&, const Tensor&, const Tensor&, bool log) {
  unavailable(log ? "log_softmax_backward" : "softmax_backward");
}
void gemm(const Tensor&, const Tensor&, const Tensor&, double, double) {
  unavailable("gemm");
}
void embedding(const Tensor&, const Tensor&, const Tensor&) {
  unavailable("embedding");
}
int64_t count_out_of_range(const Tensor&, int64_t, int64_t, bool) {
  unavailable("count_out_of_range");
}
void record_index_fault(const Tensor&, const IndexCheckCall&, const Tensor&, const Tensor&) {
  unavailable("record_index_fault");
}
void embedding_backward(const Tensor&, const Tensor&, const Tensor&, bool) {
  unavailable("embedding_backward");
}
void cross_entropy(const Tensor&, const Tensor&, int64_t, const Tensor&, const Tensor&) {
  unavailable("cross_entropy");
}
void cross_entropy_backward(const Tensor&, const Tensor&, int64_t, const Tensor&, const Tensor&) {
  unavailable("cross_entropy_backward");
}
void layer_norm(const Tensor&, const Tensor&, const Tensor&, double, const Tensor&, const Tensor&,
                const Tensor&) {
  unavailable("layer_norm");
}
void layer_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, const Tensor&, const Tensor&, bool) {
  unavailable("layer_norm_backward");
}

void max_pool2d(const Tensor&, const Tensor&, const Tensor&, const Conv2dGeometry&, bool) {
  unavailable("max_pool2d");
}
void max_pool2d_backward(const Tensor&, const Tensor&, const Tensor&, const Conv2dGeometry&, bool) {
  unavailable("max_pool2d_backward");
}

void batch_norm_forward(const Tensor&, const Tensor&, const Tensor&, double, const BatchNormLayout&,
                        const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  unavailable("batch_norm");
}
void batch_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const BatchNormLayout&, const Tensor&, const Tensor&, const Tensor&) {
  unavailable("batch_norm_backward");
}
void batch_norm_merge_statistics(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                 const Tensor&, double) {
  unavailable("batch_norm_merge_statistics");
}
void batch_norm_adopt_statistics(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                 const Tensor&, double) {
  unavailable("batch_norm_adopt_statistics");
}

}  // namespace accrue::kernels::cuda
