#include "accrue/dist/process_group.h"

namespace accrue::dist {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::max:
      return "max";
  }
  return "?";
}

void check_collective_tensor(const Tensor& t, Device device, const char* collective,
                             const char* what) {
  ACCRUE_CHECK(t.defined(), collective, ": ", what, " is an undefined tensor");
  ACCRUE_CHECK(t.device() == device, collective, ": ", what, " is on ", t.device().str(),
               " but the communicator's device is ", device.str());
  ACCRUE_CHECK(t.is_contiguous(), collective, ": ", what, " of shape ", shape_str(t.shape()),
               " must be contiguous (collectives take flat ranges, e.g. arena slices)");
}

namespace {

// Copies src into dst unless they are the same memory (the in-place forms).
void copy_unless_same(const Tensor& dst, const Tensor& src) {
  if (dst.data_ptr() == src.data_ptr()) return;
  dst.reshape({dst.numel()}).copy_(src.reshape({src.numel()}));
}

void check_same_dtype(const Tensor& a, const Tensor& b, const char* collective) {
  ACCRUE_CHECK(a.dtype() == b.dtype(), collective, ": input is ", dtype_name(a.dtype()),
               " but output is ", dtype_name(b.dtype()));
}

}  // namespace

StreamHandle StubCommunicator::stream() {
  return device_.is_cuda() ? current_stream(device_.index) : nullptr;
}

// World size 1: op over one rank of x is x, whatever the op.
void StubCommunicator::all_reduce(const Tensor& data, ReduceOp) {
  check_collective_tensor(data, device_, "all_reduce", "data");
}

void StubCommunicator::reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp) {
  check_collective_tensor(input, device_, "reduce_scatter", "input");
  check_collective_tensor(output, device_, "reduce_scatter", "output");
  check_same_dtype(input, output, "reduce_scatter");
  ACCRUE_CHECK(input.numel() == output.numel(), "reduce_scatter: input has ", input.numel(),
               " elements, output ", output.numel(), "; with world size 1 they must be equal");
  copy_unless_same(output, input);
}

void StubCommunicator::all_gather(const Tensor& input, const Tensor& output) {
  check_collective_tensor(input, device_, "all_gather", "input");
  check_collective_tensor(output, device_, "all_gather", "output");
  check_same_dtype(input, output, "all_gather");
  ACCRUE_CHECK(input.numel() == output.numel(), "all_gather: input has ", input.numel(),
               " elements, output ", output.numel(), "; with world size 1 they must be equal");
  copy_unless_same(output, input);
}

void StubCommunicator::broadcast(const Tensor& data, int root) {
  check_collective_tensor(data, device_, "broadcast", "data");
  ACCRUE_CHECK(root == 0, "broadcast: root ", root, " is not a rank of a world of size 1");
}

void StubCommunicator::synchronize() {
  if (device_.is_cuda()) synchronize_stream(stream());
}

}  // namespace accrue::dist
