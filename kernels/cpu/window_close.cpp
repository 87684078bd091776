// The CPU reference of the window close (kernels/window_close.h): plain loops
// over the formulas of kernels/window_close_backend.h, in f32 math for f32
// buffers and f64 for f64. It is the oracle of the CUDA kernels' tests and the
// CPU backend of the optimizer.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "accrue/core/parallel.h"
#include "accrue/kernels/window_close_backend.h"

namespace accrue::kernels::cpu {

namespace {

// Rows of kRowElements elements (Note [Norm rows]), each squared and summed
// in f64 in index order; the scalar step folds the rows in order.
constexpr int64_t kRowElements = 8192;
// Rows per chunk of a threaded norm, and kChunk chunks per chunk of a
// threaded optimizer step (Note [CPU threads]).
constexpr int64_t kRowGrain = 4;
constexpr int64_t kStepGrain = 1024;

template <class T>
void norm_partials_typed(const Tensor& grads, const Tensor& partials, int64_t first_row,
                         int64_t rows) {
  const T* g = grads.data<T>();
  const int64_t n = grads.numel();
  double* out = partials.data<double>();
  // Threads split the rows: each row's sum is one thread's, in index order,
  // its length fixed by kRowElements alone (Note [CPU threads]).
  parallel_for(first_row, first_row + rows, kRowGrain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      double sumsq = 0.0, nonfinite = 0.0;
      for (int64_t i = r * kRowElements; i < std::min(n, (r + 1) * kRowElements); ++i) {
        const double x = static_cast<double>(g[i]);
        sumsq += x * x;
        if (!std::isfinite(x)) nonfinite += 1.0;
      }
      out[2 * r] = sumsq;
      out[2 * r + 1] = nonfinite;
    }
  });
}

// The compute copy: the new master weight rounded to bf16/f16 (through float,
// as the CUDA kernel converts).
template <class C, class M>
void write_copy(void* copy, int64_t i, M p) {
  static_cast<C*>(copy)[i] = C(static_cast<float>(p));
}

template <class T>
void optimizer_typed(const OptimizerConfig& config, const OptimizerBuffers& b,
                     const Tensor& state) {
  const double* st = state.data<double>();
  if (st[kFoundInf] != 0.0) return;  // Note [Skipped window]: nothing is touched.
  using M = T;                       // f32 math for f32 buffers, f64 for f64
  OptimizerParams<M> o = make_optimizer_params<M>(config);
  if (b.hyper.defined()) o.hyper = b.hyper.data<double>();
  StepScalars<M> s{};
  make_step_scalars(o, st, s);

  T* p = b.params.data<T>();
  const T* g = b.grads.data<T>();
  T* m = uses_exp_avg(config) ? b.exp_avg.data<T>() : nullptr;
  T* v = uses_exp_avg_sq(config) ? b.exp_avg_sq.data<T>() : nullptr;
  T* vmax = uses_max_exp_avg_sq(config) ? b.max_exp_avg_sq.data<T>() : nullptr;
  const int32_t* groups = b.chunk_groups.data<int32_t>();
  void* copy = b.compute.defined() ? b.compute.data_ptr() : nullptr;
  const bool copy_bf16 = b.compute.defined() && b.compute.dtype() == DType::bf16;
  const int64_t n = b.params.numel();
  // Checked before anything is written (the CUDA kernel clamps instead: reading
  // the groups back would cost a host synchronization).
  const int64_t first = b.first_element;
  for (int64_t c = first / kChunk; c < (first + n + kChunk - 1) / kChunk; ++c)
    ACCRUE_CHECK(groups[c] >= 0 && groups[c] < o.groups, "fused_optimizer_step: chunk_groups[", c,
                 "] = ", groups[c], " is outside [0, ", o.groups, ")");

  // Note [Unused parameters]: with the slot tables, each chunk's slot says
  // whether it steps and with which step count.
  const bool per_slot = b.slot_used.defined();
  const int32_t* slots = per_slot ? b.chunk_slots.data<int32_t>() : nullptr;
  const double* used = per_slot ? b.slot_used.data<double>() : nullptr;
  const double* steps = per_slot ? b.slot_steps.data<double>() : nullptr;
  if (per_slot) {
    const int64_t count = b.slot_used.numel();
    for (int64_t c = first / kChunk; c < (first + n + kChunk - 1) / kChunk; ++c)
      ACCRUE_CHECK(slots[c] >= 0 && slots[c] < count, "fused_optimizer_step: chunk_slots[", c,
                   "] = ", slots[c], " is outside [0, ", count, ")");
  }

  // Note [Step sums]: each chunk's row, summed in index order.
  double* sums = b.step_sums.defined() ? b.step_sums.data<double>() : nullptr;
  if (sums != nullptr)
    std::fill(sums + 3 * (first / kChunk), sums + 3 * ((first + n) / kChunk), 0.0);
  auto add_sums = [&](int64_t i, double grad, double before, double after) {
    double* row = sums + 3 * ((first + i) / kChunk);
    row[0] += grad * grad;
    row[1] += (after - before) * (after - before);
    row[2] += before * before;
  };

  // Threads split the kChunk chunks: every element is updated by the same
  // code as with one thread, and a chunk's step_sums row is summed by one
  // thread in index order (Note [CPU threads]).
  auto step = [&](int64_t i) {
    const int group = groups[(first + i) / kChunk];
    UpdateScalars<M> u;
    if (per_slot) {
      const int32_t slot = slots[(first + i) / kChunk];
      if (!(used[slot] > 0.0)) {  // unused: nothing is written
        if (sums != nullptr) add_sums(i, g[i], p[i], p[i]);
        return;
      }
      u = slot_scalars(s, group, steps + 3 * static_cast<int64_t>(slot));
    } else {
      u = window_scalars(s, group);
    }
    M pi = p[i];
    if (!config.adam) {
      M buf = m ? m[i] : M(0);
      sgd_update(o, u, g[i], pi, buf);
      if (m) m[i] = buf;
    } else {
      M mi = m[i], vi = v[i], vmaxi = vmax ? vmax[i] : M(0);
      adam_update(o, u, g[i], pi, mi, vi, vmaxi);
      m[i] = mi;
      v[i] = vi;
      if (vmax) vmax[i] = vmaxi;
    }
    if (sums != nullptr) add_sums(i, g[i], p[i], pi);
    p[i] = pi;
    if (copy) {
      if (copy_bf16) {
        write_copy<bf16>(copy, i, pi);
      } else {
        write_copy<f16>(copy, i, pi);
      }
    }
  };
  const int64_t first_chunk = first / kChunk, end_chunk = (first + n + kChunk - 1) / kChunk;
  parallel_for(first_chunk, end_chunk, kStepGrain, [&](int64_t c0, int64_t c1) {
    const int64_t i0 = std::max(c0 * kChunk, first) - first;
    const int64_t i1 = std::min(c1 * kChunk, first + n) - first;
    for (int64_t i = i0; i < i1; ++i)
      step(i);
  });
}

}  // namespace

// Rows of a fixed length, whatever the dtype and device.
int64_t norm_partials_rows(int64_t numel, DType, int) {
  return std::max<int64_t>(1, (numel + kRowElements - 1) / kRowElements);
}

int64_t norm_row_elements(int64_t, DType, int) {
  return kRowElements;
}

void grad_norm_partials(const Tensor& grads, const Tensor& partials, int64_t first_row,
                        int64_t rows) {
  if (grads.dtype() == DType::f64) {
    norm_partials_typed<double>(grads, partials, first_row, rows);
  } else {
    norm_partials_typed<float>(grads, partials, first_row, rows);
  }
}

void window_scalar_step(const Tensor& partials, const Tensor& state, const CloseConfig& config) {
  window_scalar_update(partials.data<double>(), partials.size(0), state.data<double>(), config);
}

void fused_optimizer_step(const OptimizerConfig& config, const OptimizerBuffers& buffers,
                          const Tensor& state) {
  if (buffers.params.dtype() == DType::f64) {
    optimizer_typed<double>(config, buffers, state);
  } else {
    optimizer_typed<float>(config, buffers, state);
  }
}

void store_hyperparameters(const HyperValues& values, const Tensor& hyper) {
  double* out = hyper.data<double>();
  for (int64_t i = 0; i < kHyperSize; ++i)
    out[i] = values.v[i];
}

void store_slot_flags(const std::vector<bool>& written, const Tensor& slot_used) {
  double* out = slot_used.data<double>();
  for (size_t i = 0; i < written.size(); ++i)
    out[i] = written[i] ? 1.0 : 0.0;
}

void advance_slot_steps(double beta1, double beta2, const Tensor& slot_used,
                        const Tensor& slot_steps, const Tensor& state) {
  if (state.data<double>()[kFoundInf] != 0.0) return;  // Note [Skipped window]
  const double* used = slot_used.data<double>();
  double* rows = slot_steps.data<double>();
  for (int64_t i = 0; i < slot_used.numel(); ++i)
    if (used[i] > 0.0) advance_slot_row(beta1, beta2, rows + 3 * i);
}

void calibrate_loss_scale(const Tensor& amax, const Tensor& state, const ScalerConfig& scaler,
                          double scale_used, double margin) {
  calibrate_scale_update(amax.data<double>()[0], state.data<double>(), scaler, scale_used, margin);
}

namespace {

// After a skipped window: slot i's (|g|^2, 0, |p|^2) from the arena itself,
// a non-finite gradient making |g|^2 infinite (Note [Step sums]).
template <class T>
void sums_from_arena(const T* g, const T* p, int64_t begin, int64_t end, double* out) {
  double g2 = 0.0, p2 = 0.0;
  bool finite = true;
  for (int64_t e = begin; e < end; ++e) {
    const double x = static_cast<double>(g[e]), w = static_cast<double>(p[e]);
    finite = finite && std::isfinite(x);
    g2 += x * x;
    p2 += w * w;
  }
  out[0] = finite ? g2 : INFINITY;
  out[1] = 0.0;
  out[2] = p2;
}

}  // namespace

void step_sums_per_slot(const Tensor& step_sums, const Tensor& slot_chunks, const Tensor& grads,
                        const Tensor& params, const Tensor& state, const Tensor& out) {
  const bool skipped = state.data<double>()[kFoundInf] != 0.0;
  const double* rows = step_sums.data<double>();
  const int64_t* r = slot_chunks.data<int64_t>();
  double* o = out.data<double>();
  const int64_t n = params.numel();
  for (int64_t i = 0; i < slot_chunks.size(0); ++i) {
    double* slot = o + 3 * i;
    if (skipped) {
      const int64_t begin = std::min(r[2 * i] * kChunk, n),
                    end = std::min(r[2 * i + 1] * kChunk, n);
      if (params.dtype() == DType::f64) {
        sums_from_arena(grads.data<double>(), params.data<double>(), begin, end, slot);
      } else {
        sums_from_arena(grads.data<float>(), params.data<float>(), begin, end, slot);
      }
      continue;
    }
    for (int k = 0; k < 3; ++k) {
      double s = 0.0;
      for (int64_t c = r[2 * i]; c < r[2 * i + 1]; ++c)
        s += rows[3 * c + k];
      slot[k] = s;
    }
  }
}

}  // namespace accrue::kernels::cpu
