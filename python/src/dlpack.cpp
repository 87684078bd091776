// DLPack both ways: accrue.from_dlpack(x) and Tensor.__dlpack__, zero-copy.
//
// Note [DLPack streams]
// ~~~~~~~~~~~~~~~~~~~~~
// A CUDA tensor changes hands between streams: the producer's work that
// writes it must come before the consumer's work that reads it, with no
// host synchronization. The protocol has the consumer name its stream in
// __dlpack__(stream=...) and the producer make that stream wait on its own
// with an event. Exporting, accrue records an event on its current stream
// (Note [Current stream]) and makes the consumer's stream wait on it (None
// means the legacy default stream, 1 the legacy default, 2 the per-thread
// default, -1 no synchronization); importing, accrue passes its current
// stream, and the producer does the same. Nothing waits on the host.
// The protocol orders the hand-over only: when the last handle of either
// side goes, the memory returns to its owner's allocator in that owner's
// stream order (accrue's pool frees on accrue's current stream), so work
// the other side queued on its own stream must not outlive the handle that
// keeps the memory, as with any tensor shared between streams.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "accrue/autograd/ops.h"
#include "accrue/core/allocator.h"
#include "accrue/core/cuda_runtime.h"
#include "accrue/core/grad_mode.h"
#include "bindings.h"
#include "dlpack.h"

#ifdef ACCRUE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace accrue::python {

namespace {

using namespace dlpack;

const char kLegacyName[] = "dltensor";
const char kVersionedName[] = "dltensor_versioned";

DLDataType dl_dtype(DType t) {
  switch (t) {
    case DType::f32:
      return {kDLFloat, 32, 1};
    case DType::f64:
      return {kDLFloat, 64, 1};
    case DType::f16:
      return {kDLFloat, 16, 1};
    case DType::bf16:
      return {kDLBfloat, 16, 1};
    case DType::i32:
      return {kDLInt, 32, 1};
    case DType::i64:
      return {kDLInt, 64, 1};
    case DType::boolean:
      return {kDLBool, 8, 1};
    case DType::f8e4m3:  // Note [FP8 dtypes]: not exported
    case DType::f8e5m2:
      break;
  }
  ACCRUE_FAIL("__dlpack__: dtype ", dtype_name(t), " has no DLPack code");
}

DType accrue_dtype(DLDataType d) {
  ACCRUE_CHECK(d.lanes == 1, "from_dlpack: vector dtypes (", int(d.lanes),
               " lanes) are not supported");
  if (d.code == kDLFloat && d.bits == 32) return DType::f32;
  if (d.code == kDLFloat && d.bits == 64) return DType::f64;
  if (d.code == kDLFloat && d.bits == 16) return DType::f16;
  if (d.code == kDLBfloat && d.bits == 16) return DType::bf16;
  if (d.code == kDLInt && d.bits == 32) return DType::i32;
  if (d.code == kDLInt && d.bits == 64) return DType::i64;
  if (d.code == kDLBool && d.bits == 8) return DType::boolean;
  ACCRUE_FAIL("from_dlpack: DLPack dtype (code ", int(d.code), ", ", int(d.bits),
              " bits) has no accrue dtype; accrue has f32, f64, bf16, f16, i32, i64 and bool");
}

// ---- export -----------------------------------------------------------------

// What a DLManagedTensor[Versioned] exported by accrue owns: the handle
// (which keeps the storage alive) and the shape and strides DLTensor points to.
struct ExportContext {
  Tensor tensor;
  std::vector<int64_t> shape, strides;
};

template <class Managed>
Managed* make_managed(const Tensor& t) {
  auto ctx = std::make_unique<ExportContext>();
  ctx->tensor = t;
  ctx->shape = t.shape();
  ctx->strides = t.strides();
  auto m = std::make_unique<Managed>();
  DLTensor& d = m->dl_tensor;
  d.data = t.storage()->data();
  d.byte_offset = static_cast<uint64_t>(t.offset()) * element_size(t.dtype());
  d.device = {t.device().is_cpu() ? kDLCPU : kDLCUDA, t.device().is_cpu() ? 0 : t.device().index};
  d.ndim = static_cast<int32_t>(t.dim());
  d.dtype = dl_dtype(t.dtype());
  d.shape = ctx->shape.data();
  d.strides = ctx->strides.data();
  m->manager_ctx = ctx.release();
  m->deleter = [](Managed* self) {
    delete static_cast<ExportContext*>(self->manager_ctx);
    delete self;
  };
  return m.release();
}

// Note [DLPack streams]: the consumer's `stream` waits on accrue's current stream.
void hand_over_stream(const Tensor& t, nb::handle stream) {
  if (!t.device().is_cuda()) return;
#ifdef ACCRUE_WITH_CUDA
  cudaStream_t consumer = cudaStreamLegacy;
  if (!stream.is_none()) {
    const int64_t s = nb::cast<int64_t>(stream);
    if (s == -1) return;
    ACCRUE_CHECK(s != 0,
                 "__dlpack__: stream 0 is ambiguous for CUDA (the protocol forbids it); "
                 "pass 1 for the legacy default stream or 2 for the per-thread one");
    consumer = s == 1   ? cudaStreamLegacy
               : s == 2 ? cudaStreamPerThread
                        : reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(s));
  }
  const int device = t.device().index;
  auto producer = reinterpret_cast<cudaStream_t>(current_stream(device));
  if (producer == consumer) return;
  set_cuda_device(device);
  cudaEvent_t event = nullptr;
  cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(event, producer);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(consumer, event, 0);
  if (event != nullptr) cudaEventDestroy(event);  // freed once the wait has been served
  ACCRUE_CHECK(e == cudaSuccess, "__dlpack__: making the consumer's stream wait on accrue's: ",
               cudaGetErrorString(e));
#else
  (void)stream;
  ACCRUE_FAIL("__dlpack__: a CUDA tensor in a build without CUDA");
#endif
}

nb::object dlpack_capsule(const Tensor& self, nb::handle stream, nb::handle max_version,
                          nb::handle dl_device, nb::handle copy) {
  ACCRUE_CHECK(!(GradMode::is_enabled() && self.requires_grad()),
               "__dlpack__: the tensor requires grad, which the consumer would not carry; "
               "export t.detach()");
  Tensor t = self;
  if (!dl_device.is_none()) {
    auto [type, id] = nb::cast<std::pair<int, int>>(dl_device);
    const Device own = t.device();
    const bool same =
        (type == kDLCPU && own.is_cpu()) || (type == kDLCUDA && own.is_cuda() && own.index == id);
    if (!same) {
      if (!copy.is_none() && !nb::cast<bool>(copy))
        throw nb::buffer_error("__dlpack__: dl_device differs from the tensor's and copy=False");
      t = t.to(type == kDLCPU ? Device::cpu() : Device::cuda(id));
    }
  }
  if (!copy.is_none() && nb::cast<bool>(copy) && t.is_same(self)) t = t.clone();
  hand_over_stream(t, stream);
  bool versioned = false;
  if (!max_version.is_none()) versioned = nb::cast<std::pair<int, int>>(max_version).first >= 1;
  if (versioned) {
    auto* m = make_managed<DLManagedTensorVersioned>(t);
    m->version = {1, 0};
    m->flags = 0;
    return nb::steal(PyCapsule_New(m, kVersionedName, [](PyObject* cap) {
      // Unconsumed (the name was not changed to "used_..."): ours to free.
      if (PyCapsule_IsValid(cap, kVersionedName)) {
        auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap, kVersionedName));
        m->deleter(m);
      }
    }));
  }
  auto* m = make_managed<DLManagedTensor>(t);
  return nb::steal(PyCapsule_New(m, kLegacyName, [](PyObject* cap) {
    if (PyCapsule_IsValid(cap, kLegacyName)) {
      auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, kLegacyName));
      m->deleter(m);
    }
  }));
}

// ---- import -----------------------------------------------------------------

// Calls the producer's deleter, which may touch Python objects (numpy's
// decrefs its array): under the GIL, and not at all once the interpreter is
// gone (the process is exiting; the memory goes with it).
template <class Managed>
void release_managed(Managed* m) {
  if (m->deleter == nullptr) return;
  if (!Py_IsInitialized()) return;
  PyGILState_STATE g = PyGILState_Ensure();
  m->deleter(m);
  PyGILState_Release(g);
}

// A tensor over the producer's memory (Note [External storage]), owning `m`.
template <class Managed>
Tensor adopt(Managed* m) {
  const DLTensor& d = m->dl_tensor;
  const DType dtype = accrue_dtype(d.dtype);
  Device device;
  if (d.device.device_type == kDLCPU) {
    device = Device::cpu();
  } else if (d.device.device_type == kDLCUDA) {
    device = Device::cuda(d.device.device_id);
  } else {
    ACCRUE_FAIL("from_dlpack: DLPack device type ", d.device.device_type,
                " is neither the CPU (1) nor CUDA (2)");
  }
  ACCRUE_CHECK(d.ndim >= 0, "from_dlpack: ndim ", d.ndim);
  Shape shape(d.shape, d.shape + d.ndim);
  Shape strides = d.strides ? Shape(d.strides, d.strides + d.ndim) : contiguous_strides(shape);
  int64_t numel = 1, last = 0;
  for (int i = 0; i < d.ndim; ++i) {
    ACCRUE_CHECK(shape[i] >= 0, "from_dlpack: negative size in shape ", shape_str(shape));
    numel *= shape[i];
  }
  for (int i = 0; i < d.ndim; ++i) {
    if (shape[i] > 1)
      ACCRUE_CHECK(
          strides[i] >= 0, "from_dlpack: strides ", shape_str(strides),
          " step backwards, which accrue's views cannot; pass a copy (np.ascontiguousarray)");
    if (shape[i] > 1) last += (shape[i] - 1) * strides[i];
    if (shape[i] <= 1) strides[i] = std::max<int64_t>(strides[i], 0);
  }
  const size_t nbytes = numel == 0 ? 0 : static_cast<size_t>(last + 1) * element_size(dtype);
  void* data = static_cast<char*>(d.data) + d.byte_offset;
  auto storage = std::make_shared<Storage>(data, nbytes, device, [m] { release_managed(m); });
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor from_dlpack(nb::handle obj) {
  if (nb::isinstance<Tensor>(obj)) return nb::cast<Tensor>(obj);
  if (!nb::hasattr(obj, "__dlpack__"))
    throw nb::type_error(
        "from_dlpack: the object has no __dlpack__ (numpy arrays, torch, CuPy "
        "and JAX tensors have)");
  nb::object stream = nb::none();
  if (nb::hasattr(obj, "__dlpack_device__")) {
    auto [type, id] = nb::cast<std::pair<int, int>>(obj.attr("__dlpack_device__")());
    if (type == kDLCUDA) {
      // Note [DLPack streams]: the producer makes accrue's current stream wait.
      const auto s = reinterpret_cast<uintptr_t>(current_stream(id));
      stream = nb::int_(s == 0 ? 1 : static_cast<int64_t>(s));
    }
  }
  nb::object capsule;
  try {
    capsule = obj.attr("__dlpack__")(nb::arg("stream") = stream,
                                     nb::arg("max_version") = nb::make_tuple(1, 0));
  } catch (nb::python_error& e) {
    if (!e.matches(PyExc_TypeError)) throw;
    capsule = obj.attr("__dlpack__")(nb::arg("stream") = stream);  // a producer before DLPack 1.0
  }
  PyObject* cap = capsule.ptr();
  if (PyCapsule_IsValid(cap, kVersionedName)) {
    auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap, kVersionedName));
    ACCRUE_CHECK(m->version.major == 1, "from_dlpack: DLPack version ", m->version.major, ".",
                 m->version.minor, "; accrue reads 1.x");
    const bool read_only = (m->flags & kFlagReadOnly) != 0;
    Tensor t = adopt(m);  // throws before taking ownership: the capsule still frees m
    PyCapsule_SetName(cap, "used_dltensor_versioned");
    // accrue has no read-only tensors: a read-only array (a numpy constant) is copied.
    if (read_only) return t.clone();
    return t;
  }
  if (PyCapsule_IsValid(cap, kLegacyName)) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, kLegacyName));
    Tensor t = adopt(m);
    PyCapsule_SetName(cap, "used_dltensor");
    return t;
  }
  throw nb::type_error("from_dlpack: __dlpack__ returned no unused 'dltensor' capsule");
}

}  // namespace

void bind_dlpack(nb::module_& m) {
  m.def("from_dlpack", &from_dlpack, nb::arg("obj"),
        "A tensor over the memory of any object with __dlpack__ (numpy, torch, CuPy, JAX), "
        "without a copy: writes through either show in the other, and the producer's memory "
        "stays alive while the tensor does. CUDA tensors are handed over on accrue's current "
        "stream (Note [DLPack streams]). A read-only array (versioned DLPack's flag) is copied.");
  nb::object tensor = m.attr("Tensor");
  nb::cpp_function_def(&dlpack_capsule, nb::scope(tensor), nb::name("__dlpack__"), nb::is_method(),
                       nb::kw_only(), nb::arg("stream") = nb::none(),
                       nb::arg("max_version") = nb::none(), nb::arg("dl_device") = nb::none(),
                       nb::arg("copy") = nb::none(),
                       "The DLPack capsule of this tensor, sharing its memory (np.from_dlpack(t), "
                       "torch.from_dlpack(t)). On CUDA the consumer's `stream` is made to wait on "
                       "accrue's current stream (Note [DLPack streams]).");
  nb::cpp_function_def(
      [](const Tensor& t) {
        return std::make_pair(static_cast<int>(t.device().is_cpu() ? kDLCPU : kDLCUDA),
                              t.device().is_cpu() ? 0 : t.device().index);
      },
      nb::scope(tensor), nb::name("__dlpack_device__"), nb::is_method(),
      "(device type, index): (1, 0) on the CPU, (2, i) on cuda:i.");
}

}  // namespace accrue::python
