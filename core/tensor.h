// Tensor: a shared handle to (storage, offset, shape, strides, dtype).
//
// Copying a Tensor shares it (like libtorch). Shapes and strides are in
// elements; a 0-d tensor has shape {} and one element.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "accrue/core/allocator.h"
#include "accrue/core/device.h"
#include "accrue/core/dtype.h"
#include "accrue/core/error.h"

namespace accrue {

using Shape = std::vector<int64_t>;

// Defined by autograd/: core only carries the pointer (see Note [Raw views]).
struct AutogradMeta;
// Function-level hook that autograd installs so that core can ask whether a
// tensor requires grad without knowing what autograd is.
using RequiresGradQuery = bool (*)(const AutogradMeta*);
void install_requires_grad_query(RequiresGradQuery query);

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape shape;
  Shape strides;
  DType dtype = DType::f32;
  std::shared_ptr<AutogradMeta> autograd;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  // True when both handles point to the same TensorImpl.
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }

  DType dtype() const { return checked().dtype; }
  Device device() const { return checked().storage->device(); }
  const Shape& shape() const { return checked().shape; }
  const Shape& strides() const { return checked().strides; }
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t size(int64_t d) const;
  int64_t stride(int64_t d) const;
  int64_t numel() const;
  int64_t offset() const { return checked().offset; }
  // Never wraps: every shape a tensor takes was checked (Note [Checked sizes] in core/tensor.cpp).
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(dtype()); }
  bool is_contiguous() const;
  // A 4-D [N, C, H, W] view over memory laid out N, H, W, C (PyTorch's
  // channels_last). A tensor that is also contiguous (C == 1, or H == W == 1)
  // counts as contiguous, not channels-last.
  bool is_channels_last() const;
  const std::shared_ptr<Storage>& storage() const { return checked().storage; }

  // Address of element 0 of this view.
  void* data_ptr() const;
  template <class T>
  T* data() const {
    ACCRUE_CHECK(dtype_of<T>::value == dtype(), "Tensor::data<", dtype_name(dtype_of<T>::value),
                 ">: tensor has dtype ", dtype_name(dtype()));
    return static_cast<T*>(data_ptr());
  }

  // Note [Raw views]
  // ~~~~~~~~~~~~~~~~
  // These methods make views and copies without recording the autograd graph:
  // they are for data handling (inputs, targets, optimizer state, tests). In a
  // model, use the differentiable free functions of autograd/ops.h
  // (accrue::reshape, accrue::transpose, accrue::contiguous, accrue::clone,
  // accrue::to_dtype, accrue::to_device, ...). To keep a gradient from being
  // dropped silently, every raw method that makes a tensor from this one
  // throws on a tensor that requires grad while grad mode is on, naming the
  // function to use, whether or not the result would have been this very
  // tensor (contiguous() of a contiguous tensor, to() of its own dtype): a
  // program must not work for one layout and fail for another. The in-place
  // writes copy_ and fill_ throw the same way on a destination that requires
  // grad (PyTorch's "a leaf Variable that requires grad is being used in an
  // in-place operation"): set a parameter's value under NoGradGuard, or with
  // load_parameter (autograd/variable.h); copy_ also refuses a source that
  // requires grad, whose gradient the copy would drop. Under NoGradGuard
  // (optimizer steps, initialization, evaluation) all of them are plain data
  // handling. The host read-backs item() and to_vector() are not copies for
  // computing and accept any tensor, as PyTorch's item() does.
  Tensor view(const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  Tensor expand(const Shape& shape) const;
  Tensor flatten() const { return reshape({numel()}); }
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;
  // Copies src into this tensor's memory (src broadcast to this shape, any dtype/device).
  const Tensor& copy_(const Tensor& src) const;
  // Fills every element with value (cast to this dtype).
  const Tensor& fill_(double value) const;

  // Host read-back of a single-element tensor.
  double item() const;
  // Host read-back of all elements in row-major order, converted to T.
  template <class T>
  std::vector<T> to_vector() const;

  // Autograd's metadata. Core never interprets it.
  const std::shared_ptr<AutogradMeta>& autograd_meta() const { return checked().autograd; }
  void set_autograd_meta(std::shared_ptr<AutogradMeta> meta) const {
    checked().autograd = std::move(meta);
  }
  // True when autograd tracks this tensor (leaf with requires_grad or result of a tracked op).
  bool requires_grad() const;

 private:
  TensorImpl& checked() const {
    ACCRUE_CHECK(impl_ != nullptr, "operation on an undefined Tensor");
    return *impl_;
  }
  void check_raw_view(const char* op) const;
  // Note [Raw views]: `function` is the differentiable one to use instead.
  void check_raw(const char* op, const char* function) const;

  std::shared_ptr<TensorImpl> impl_;
};

// Normalizes a possibly negative dim against rank (for errors: op names the caller).
int64_t wrap_dim(int64_t dim, int64_t rank, const char* op);
// Row-major strides; accrue::Error when the span of `shape` overflows int64.
Shape contiguous_strides(const Shape& shape);
// The product of the sizes; accrue::Error when it overflows int64.
int64_t shape_numel(const Shape& shape);
// The broadcast of two shapes (numpy rules) or accrue::Error naming op and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

// Factories. Device defaults to the CPU, dtype to f32. A shape whose count or
// bytes overflow int64 throws accrue::Error, one beyond max_allocation_bytes
// of the device OutOfMemoryError, both naming the op, the shape and the bytes
// before anything is allocated (Note [Checked sizes] in core/tensor.cpp).
Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor full(const Shape& shape, double value, DType dtype = DType::f32,
            Device device = Device::cpu());
// [start, end) with step, like numpy.arange.
Tensor arange(double start, double end, double step = 1.0, DType dtype = DType::i64,
              Device device = Device::cpu());
// Copies host values (converted to dtype) into a new tensor of that shape.
template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                   DType dtype = dtype_of<T>::value, Device device = Device::cpu());
Tensor scalar_tensor(double value, DType dtype = DType::f32, Device device = Device::cpu());

// A view of `base`'s storage with explicit geometry (the arena uses this).
// Raw (Note [Raw views]): refuses a base that requires grad while grad mode is on.
Tensor make_view(const Tensor& base, const Shape& shape, const Shape& strides, int64_t offset);

}  // namespace accrue
