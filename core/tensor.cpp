#include "accrue/core/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "accrue/core/copy.h"
#include "accrue/core/cuda_runtime.h"
#include "accrue/core/grad_mode.h"

namespace accrue {

namespace {

RequiresGradQuery g_requires_grad_query = nullptr;

Tensor make_tensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset,
                   DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

// Note [Checked sizes]
// ~~~~~~~~~~~~~~~~~~~~
// Sizes come from users (command lines, file headers, model configs), so no
// product of them is trusted: a wrapped product would allocate a small buffer
// and write far past it. Every shape a tensor or view takes must have
//   - an element count (the product of its sizes) that fits int64,
//   - a span (the product of max(size, 1), which bounds every contiguous
//     stride, so a shape with a zero size too) that fits int64, and
//   - span x element size bytes that fit int64, so nbytes(), data_ptr() and
//     byte strides never wrap;
// a new tensor's bytes must not exceed max_allocation_bytes of its device
// (core/allocator.h; an OutOfMemoryError, which run_window can retry with a
// smaller micro-batch), and a view's largest offset must lie inside its
// storage. A check that fails throws before anything is allocated, naming
// the op, the shape, the dtype and the bytes; no message prints a wrapped
// (negative) count or calls an overflow a negative stride.

constexpr const char* kInt64Max = "2^63 - 1";

// a * b into *out, or false when the product overflows int64.
bool mul_fits(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

// Checks rank, signs and Note [Checked sizes]'s products; returns the element count.
int64_t check_shape(const Shape& shape, DType dtype, const char* op) {
  ACCRUE_CHECK(static_cast<int>(shape.size()) <= 8, op, ": rank ", shape.size(), " of shape ",
               shape_str(shape), " exceeds the supported 8 dims");
  for (int64_t s : shape)
    ACCRUE_CHECK(s >= 0, op, ": negative size in shape ", shape_str(shape));
  int64_t numel = 1, span = 1;
  for (int64_t s : shape) {
    ACCRUE_CHECK(mul_fits(numel, s, &numel), op, ": shape ", shape_str(shape), " has more than ",
                 kInt64Max, " elements (the product of its sizes overflows int64)");
    ACCRUE_CHECK(mul_fits(span, std::max<int64_t>(s, 1), &span), op, ": shape ", shape_str(shape),
                 " spans more than ", kInt64Max,
                 " elements (the product of its nonzero sizes overflows int64)");
  }
  const auto size = static_cast<int64_t>(element_size(dtype));
  int64_t bytes = 0;
  ACCRUE_CHECK(mul_fits(span, size, &bytes), op, ": shape ", shape_str(shape), " of ",
               dtype_name(dtype), " needs more than ", kInt64Max, " bytes (", span,
               numel == span ? " elements" : " elements spanned", " of ", size, " bytes)");
  return numel;
}

// "12.5 GiB"
std::string gib(int64_t bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f GiB", static_cast<double>(bytes) / (int64_t{1} << 30));
  return s;
}

// A new contiguous tensor, checked (Note [Checked sizes]) before it is allocated.
Tensor allocate(const Shape& shape, DType dtype, Device device, const char* op) {
  const int64_t numel = check_shape(shape, dtype, op);
  const int64_t nbytes = numel * static_cast<int64_t>(element_size(dtype));
  const int64_t limit = max_allocation_bytes(device);
  if (nbytes > limit)
    throw OutOfMemoryError(
        detail::str_cat(op, ": shape ", shape_str(shape), " of ", dtype_name(dtype), " needs ",
                        nbytes, " bytes (", gib(nbytes), "): out of memory on ", device.str(),
                        ", where one allocation may have at most ", limit, " bytes (", gib(limit),
                        ")"),
        nbytes, detail::str_cat(__FILE__, ":", __LINE__));
  std::shared_ptr<Storage> storage;
  try {
    storage = std::make_shared<Storage>(static_cast<size_t>(nbytes), device);
  } catch (const OutOfMemoryError& e) {
    // The allocator knows the device's free memory; the op and the shape are known here.
    throw OutOfMemoryError(detail::str_cat(op, ": shape ", shape_str(shape), " of ",
                                           dtype_name(dtype), ": ", e.message()),
                           e.requested_bytes(), e.where());
  }
  return make_tensor(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
}

// Resolves one -1 in a requested shape against numel.
Shape infer_shape(const Shape& requested, int64_t numel, const char* op) {
  Shape shape = requested;
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      ACCRUE_CHECK(infer < 0, op, ": more than one -1 in shape ", shape_str(requested));
      infer = static_cast<int>(i);
    } else {
      ACCRUE_CHECK(shape[i] >= 0, op, ": invalid size in shape ", shape_str(requested));
      ACCRUE_CHECK(mul_fits(known, shape[i], &known), op, ": shape ", shape_str(requested),
                   " is invalid for ", numel,
                   " elements (the product of its sizes overflows int64)");
    }
  }
  if (infer >= 0) {
    ACCRUE_CHECK(known != 0 && numel % known == 0, op, ": shape ", shape_str(requested),
                 " is invalid for ", numel, " elements");
    shape[infer] = numel / known;
  } else {
    ACCRUE_CHECK(known == numel, op, ": shape ", shape_str(requested), " is invalid for ", numel,
                 " elements");
  }
  return shape;
}

// Strides for viewing (shape, strides) as new_shape without copying, if possible
// (the same algorithm as numpy/PyTorch: group dims that are contiguous among themselves).
bool view_strides(const Shape& shape, const Shape& strides, const Shape& new_shape, Shape& out) {
  out.assign(new_shape.size(), 0);
  if (shape_numel(shape) == 0 || shape.empty()) {
    out = contiguous_strides(new_shape);
    return true;
  }
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base_stride = strides.empty() ? 1 : strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= shape[d];
    if (d == 0 || (shape[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

}  // namespace

void install_requires_grad_query(RequiresGradQuery query) {
  g_requires_grad_query = query;
}

bool Tensor::requires_grad() const {
  const auto& meta = checked().autograd;
  return meta && g_requires_grad_query && g_requires_grad_query(meta.get());
}

void Tensor::check_raw_view(const char* op) const {
  check_raw(op, op);
}

void Tensor::check_raw(const char* op, const char* function) const {
  ACCRUE_CHECK(!(GradMode::is_enabled() && requires_grad()), "Tensor::", op,
               " on a tensor that requires grad would drop its gradient: use accrue::", function,
               " (autograd/ops.h), or detach() first");
}

int64_t wrap_dim(int64_t dim, int64_t rank, const char* op) {
  const int64_t r = std::max<int64_t>(rank, 1);
  ACCRUE_CHECK(dim >= -r && dim < r, op, ": dim ", dim, " is out of range for a ", rank,
               "-d tensor");
  return dim < 0 ? dim + r : dim;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    strides[d] = s;
    if (d > 0)
      ACCRUE_CHECK(mul_fits(s, std::max<int64_t>(shape[d], 1), &s), "contiguous_strides: shape ",
                   shape_str(shape), " spans more than ", kInt64Max,
                   " elements (the product of its nonzero sizes overflows int64)");
  }
  return strides;
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape)
    ACCRUE_CHECK(mul_fits(n, s, &n), "shape_numel: shape ", shape_str(shape), " has more than ",
                 kInt64Max, " elements (the product of its sizes overflows int64)");
  return n;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    ACCRUE_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ",
                 shape_str(b), " cannot be broadcast together");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int64_t Tensor::size(int64_t d) const {
  return shape()[wrap_dim(d, dim(), "size")];
}
int64_t Tensor::stride(int64_t d) const {
  return strides()[wrap_dim(d, dim(), "stride")];
}
int64_t Tensor::numel() const {
  return shape_numel(shape());
}

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // no element to misplace
  int64_t expected = 1;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    if (shape()[d] == 1) continue;
    if (strides()[d] != expected) return false;
    expected *= shape()[d];
  }
  return true;
}

bool Tensor::is_channels_last() const {
  if (dim() != 4 || is_contiguous()) return false;
  const int64_t c = size(1), h = size(2), w = size(3);
  return stride(1) == 1 && stride(3) == c && stride(2) == w * c && stride(0) == h * w * c;
}

void* Tensor::data_ptr() const {
  return static_cast<char*>(storage()->data()) +
         offset() * static_cast<int64_t>(element_size(dtype()));
}

Tensor Tensor::view(const Shape& shape) const {
  check_raw_view("view");
  Shape target = infer_shape(shape, numel(), "view");
  check_shape(target, dtype(), "view");
  Shape strides;
  ACCRUE_CHECK(view_strides(this->shape(), this->strides(), target, strides),
               "view: cannot view a tensor of shape ", shape_str(this->shape()), " and strides ",
               shape_str(this->strides()), " as ", shape_str(target),
               " without a copy; use reshape");
  return make_tensor(storage(), target, strides, offset(), dtype());
}

Tensor Tensor::reshape(const Shape& shape) const {
  check_raw_view("reshape");
  Shape target = infer_shape(shape, numel(), "reshape");
  check_shape(target, dtype(), "reshape");
  Shape strides;
  if (view_strides(this->shape(), this->strides(), target, strides))
    return make_tensor(storage(), target, strides, offset(), dtype());
  return contiguous().view(target);
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  check_raw_view("transpose");
  std::vector<int64_t> perm(dim());
  for (int64_t i = 0; i < dim(); ++i)
    perm[i] = i;
  if (dim() == 0) return *this;
  std::swap(perm[wrap_dim(d0, dim(), "transpose")], perm[wrap_dim(d1, dim(), "transpose")]);
  return permute(perm);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  check_raw_view("permute");
  ACCRUE_CHECK(static_cast<int64_t>(dims.size()) == dim(), "permute: ", dims.size(),
               " dims given for a tensor of shape ", shape_str(shape()));
  Shape new_shape(dim()), new_strides(dim());
  std::vector<bool> seen(dim(), false);
  for (int64_t i = 0; i < dim(); ++i) {
    const int64_t d = wrap_dim(dims[i], dim(), "permute");
    ACCRUE_CHECK(!seen[d], "permute: dim ", d, " repeated in ", shape_str(dims));
    seen[d] = true;
    new_shape[i] = shape()[d];
    new_strides[i] = strides()[d];
  }
  return make_tensor(storage(), new_shape, new_strides, offset(), dtype());
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  check_raw_view("narrow");
  ACCRUE_CHECK(dim() > 0, "narrow: cannot narrow a 0-d tensor");
  d = wrap_dim(d, dim(), "narrow");
  const int64_t size = shape()[d];
  if (start < 0 && start >= -size) start += size;
  // length <= size - start rather than start + length <= size: the sum can wrap.
  if (!(start >= 0 && start <= size && length >= 0 && length <= size - start)) {
    const bool sum_fits =
        start >= 0 && length >= 0 && length <= std::numeric_limits<int64_t>::max() - start;
    ACCRUE_FAIL("narrow: ",
                sum_fits ? detail::str_cat("range [", start, ", ", start + length, ")")
                         : detail::str_cat("start ", start, " and length ", length),
                " is out of bounds for dim ", d, " of shape ", shape_str(shape()));
  }
  Shape new_shape = shape();
  new_shape[d] = length;
  return make_tensor(storage(), new_shape, strides(), offset() + start * strides()[d], dtype());
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  check_raw_view("select");
  ACCRUE_CHECK(dim() > 0, "select: cannot select from a 0-d tensor");
  d = wrap_dim(d, dim(), "select");
  if (index < 0) index += shape()[d];
  ACCRUE_CHECK(index >= 0 && index < shape()[d], "select: index ", index,
               " is out of bounds for dim ", d, " of shape ", shape_str(shape()));
  Shape new_shape = shape(), new_strides = strides();
  const int64_t off = offset() + index * strides()[d];
  new_shape.erase(new_shape.begin() + d);
  new_strides.erase(new_strides.begin() + d);
  return make_tensor(storage(), new_shape, new_strides, off, dtype());
}

Tensor Tensor::unsqueeze(int64_t d) const {
  check_raw_view("unsqueeze");
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape new_shape = shape(), new_strides = strides();
  // A size-1 dim's stride is never stepped: any value serves where the product would wrap.
  int64_t st = 1;
  if (d < dim() && !mul_fits(strides()[d], shape()[d], &st)) st = strides()[d];
  new_shape.insert(new_shape.begin() + d, 1);
  new_strides.insert(new_strides.begin() + d, st);
  check_shape(new_shape, dtype(), "unsqueeze");
  return make_tensor(storage(), new_shape, new_strides, offset(), dtype());
}

Tensor Tensor::squeeze(int64_t d) const {
  check_raw_view("squeeze");
  if (dim() == 0) return *this;
  d = wrap_dim(d, dim(), "squeeze");
  ACCRUE_CHECK(shape()[d] == 1, "squeeze: dim ", d, " of shape ", shape_str(shape()), " has size ",
               shape()[d], ", not 1");
  Shape new_shape = shape(), new_strides = strides();
  new_shape.erase(new_shape.begin() + d);
  new_strides.erase(new_strides.begin() + d);
  return make_tensor(storage(), new_shape, new_strides, offset(), dtype());
}

Tensor Tensor::expand(const Shape& target) const {
  check_raw_view("expand");
  check_shape(target, dtype(), "expand");
  ACCRUE_CHECK(target.size() >= shape().size(), "expand: cannot expand shape ", shape_str(shape()),
               " to fewer dims ", shape_str(target));
  const size_t lead = target.size() - shape().size();
  Shape new_strides(target.size(), 0);
  for (size_t i = 0; i < target.size(); ++i) {
    if (i < lead) continue;
    const int64_t s = shape()[i - lead];
    ACCRUE_CHECK(s == target[i] || s == 1, "expand: shape ", shape_str(shape()),
                 " cannot be expanded to ", shape_str(target));
    new_strides[i] = s == target[i] ? strides()[i - lead] : 0;
  }
  return make_tensor(storage(), target, new_strides, offset(), dtype());
}

Tensor Tensor::contiguous() const {
  check_raw("contiguous", "contiguous");
  if (is_contiguous()) return *this;
  Tensor out = allocate(shape(), dtype(), device(), "contiguous");
  detail::copy_same_device(out, *this);
  return out;
}

Tensor Tensor::clone() const {
  check_raw("clone", "clone");
  Tensor out = allocate(shape(), dtype(), device(), "clone");
  detail::copy_same_device(out, *this);
  return out;
}

Tensor Tensor::to(Device target) const {
  check_raw("to(Device)", "to_device");
  if (target == device()) return *this;
  Tensor out = allocate(shape(), dtype(), target, "to");
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(DType target) const {
  check_raw("to(DType)", "to_dtype");
  if (target == dtype()) return *this;
  Tensor out = allocate(shape(), target, device(), "to");
  detail::copy_same_device(out, *this);
  return out;
}

const Tensor& Tensor::copy_(const Tensor& src) const {
  ACCRUE_CHECK(src.defined(), "copy_: source tensor is undefined");
  // Note [Raw views]: neither end may be one autograd tracks while it records.
  if (GradMode::is_enabled()) {
    ACCRUE_CHECK(!requires_grad(),
                 "Tensor::copy_ into a tensor that requires grad is an in-place change autograd "
                 "cannot record: set a parameter's value under NoGradGuard or with "
                 "accrue::load_parameter");
    ACCRUE_CHECK(!src.requires_grad(),
                 "Tensor::copy_ from a tensor that requires grad would drop its gradient: use "
                 "accrue::clone, accrue::to_dtype or accrue::to_device (autograd/ops.h), or "
                 "detach() the source first");
  }
  // Broadcast the source to this shape (raw expand: copying data records no graph).
  Shape target = broadcast_shapes(shape(), src.shape(), "copy_");
  ACCRUE_CHECK(target == shape(), "copy_: source of shape ", shape_str(src.shape()),
               " does not broadcast to destination shape ", shape_str(shape()));
  NoGradGuard no_grad;
  Tensor s = src.expand(shape());
  if (s.device() == device()) {
    detail::copy_same_device(*this, s);
    return *this;
  }
  // Across devices: convert and compact on the source side, move the bytes,
  // then scatter into this (possibly strided) view on the destination side.
  Tensor staged = empty(shape(), dtype(), s.device());
  detail::copy_same_device(staged, s);
  Tensor landed = is_contiguous() ? *this : empty(shape(), dtype(), device());
  detail::memcpy_between(landed.data_ptr(), device(), staged.data_ptr(), staged.device(),
                         staged.nbytes());
  if (!landed.is_same(*this)) detail::copy_same_device(*this, landed);
  return *this;
}

const Tensor& Tensor::fill_(double value) const {
  ACCRUE_CHECK(!(GradMode::is_enabled() && requires_grad()),
               "Tensor::fill_ on a tensor that requires grad is an in-place change autograd "
               "cannot record: fill it under NoGradGuard (as an initializer does), or detach() "
               "first");
  detail::fill_same_device(*this, value);
  return *this;
}

double Tensor::item() const {
  ACCRUE_CHECK(numel() == 1, "item: tensor of shape ", shape_str(shape()), " has ", numel(),
               " elements, not 1");
  return to_vector<double>()[0];
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  NoGradGuard no_grad;
  Tensor host = to(Device::cpu()).to(dtype_of<T>::value).contiguous();
  const T* p = host.data<T>();
  return std::vector<T>(p, p + host.numel());
}

template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<bf16> Tensor::to_vector<bf16>() const;
template std::vector<f16> Tensor::to_vector<f16>() const;
template <>
std::vector<bool> Tensor::to_vector<bool>() const {
  std::vector<int32_t> v = to_vector<int32_t>();
  return std::vector<bool>(v.begin(), v.end());
}

Tensor empty(const Shape& shape, DType dtype, Device device) {
  return allocate(shape, dtype, device, "empty");
}

namespace {

Tensor filled(const Shape& shape, double value, DType dtype, Device device, const char* op) {
  Tensor t = allocate(shape, dtype, device, op);
  detail::fill_same_device(t, value);
  return t;
}

}  // namespace

Tensor zeros(const Shape& shape, DType dtype, Device device) {
  return filled(shape, 0.0, dtype, device, "zeros");
}
Tensor ones(const Shape& shape, DType dtype, Device device) {
  return filled(shape, 1.0, dtype, device, "ones");
}

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  return filled(shape, value, dtype, device, "full");
}

Tensor arange(double start, double end, double step, DType dtype, Device device) {
  ACCRUE_CHECK(step != 0 && std::isfinite(start) && std::isfinite(end) && std::isfinite(step),
               "arange: invalid range start=", start, " end=", end, " step=", step);
  const double span = (end - start) / step;
  // 2^63 is exact as a double; the cast of anything at or above it would be undefined.
  ACCRUE_CHECK(std::ceil(span) < 9223372036854775808.0, "arange: [", start, ", ", end,
               ") in steps of ", step, " has ", std::ceil(span), " elements, more than ",
               kInt64Max);
  const int64_t n = span > 0 ? static_cast<int64_t>(std::ceil(span)) : 0;
  Tensor t = allocate({n}, dtype, device, "arange");
  detail::arange_same_device(t, start, step);
  return t;
}

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, DType dtype, Device device) {
  const int64_t numel = check_shape(shape, dtype, "from_vector");
  ACCRUE_CHECK(values.size() == static_cast<uint64_t>(numel), "from_vector: ", values.size(),
               " values do not fill shape ", shape_str(shape), " (", numel, " elements)");
  Tensor host = allocate(shape, dtype_of<T>::value, Device::cpu(), "from_vector");
  std::copy(values.begin(), values.end(), host.data<T>());
  return host.to(dtype).to(device);
}

template Tensor from_vector<float>(const std::vector<float>&, const Shape&, DType, Device);
template Tensor from_vector<double>(const std::vector<double>&, const Shape&, DType, Device);
template Tensor from_vector<int32_t>(const std::vector<int32_t>&, const Shape&, DType, Device);
template Tensor from_vector<int64_t>(const std::vector<int64_t>&, const Shape&, DType, Device);
template Tensor from_vector<bf16>(const std::vector<bf16>&, const Shape&, DType, Device);
template Tensor from_vector<f16>(const std::vector<f16>&, const Shape&, DType, Device);

Tensor scalar_tensor(double value, DType dtype, Device device) {
  return full({}, value, dtype, device);
}

Tensor make_view(const Tensor& base, const Shape& shape, const Shape& strides, int64_t offset) {
  ACCRUE_CHECK(!(GradMode::is_enabled() && base.requires_grad()),
               "make_view of a tensor that requires grad would drop its gradient: use the "
               "differentiable views of autograd/ops.h (accrue::view, accrue::narrow, ...), or "
               "detach() first");
  const int64_t numel = check_shape(shape, base.dtype(), "make_view");
  ACCRUE_CHECK(shape.size() == strides.size(), "make_view: shape ", shape_str(shape),
               " and strides ", shape_str(strides), " differ in rank");
  for (size_t i = 0; i < shape.size(); ++i)
    ACCRUE_CHECK(strides[i] >= 0, "make_view: strides ", shape_str(strides), " for shape ",
                 shape_str(shape), " have ", strides[i], " at dim ", i,
                 "; views step forward only");
  const int64_t capacity =
      static_cast<int64_t>(base.storage()->nbytes() / element_size(base.dtype()));
  ACCRUE_CHECK(offset >= 0 && offset <= capacity, "make_view: offset ", offset, " exceeds the ",
               capacity, " elements of its storage");
  // The largest element offset the view reaches (Note [Checked sizes]), added up
  // so that no partial sum wraps.
  int64_t last = offset;
  bool fits = true;
  if (numel > 0)
    for (size_t i = 0; i < shape.size() && fits; ++i) {
      int64_t step = 0;
      fits =
          mul_fits(shape[i] - 1, strides[i], &step) && !__builtin_add_overflow(last, step, &last);
    }
  ACCRUE_CHECK(numel == 0 || (fits && last < capacity), "make_view: view of shape ",
               shape_str(shape), " and strides ", shape_str(strides), " at offset ", offset,
               " reaches ",
               fits ? detail::str_cat("element ", last) : std::string("past element 2^63 - 1"),
               ", which exceeds the ", capacity, " elements of its storage");
  return make_tensor(base.storage(), shape, strides, offset, base.dtype());
}

}  // namespace accrue
