// Element copies between any two dtypes and devices: the machinery behind
// contiguous(), to(), clone(), copy_() and fill_(). Internal to core.
#pragma once

#include "accrue/core/tensor.h"

namespace accrue::detail {

// dst[i] = cast(src[i]) for same-shaped tensors on the same device, any strides.
void copy_same_device(const Tensor& dst, const Tensor& src);
void fill_same_device(const Tensor& dst, double value);
// dst[i] = start + i * step over a contiguous dst.
void arange_same_device(const Tensor& dst, double start, double step);

// The CPU and CUDA halves (the CUDA ones live in copy.cu and exist only with CUDA).
void copy_cpu(const Tensor& dst, const Tensor& src);
void fill_cpu(const Tensor& dst, double value);
void arange_cpu(const Tensor& dst, double start, double step);
void copy_cuda(const Tensor& dst, const Tensor& src);
void fill_cuda(const Tensor& dst, double value);
void arange_cuda(const Tensor& dst, double start, double step);
// Raw bytes between host and device (or device and device), ordered on the current stream.
void memcpy_between(void* dst, Device dst_device, const void* src, Device src_device,
                    size_t nbytes);

}  // namespace accrue::detail
