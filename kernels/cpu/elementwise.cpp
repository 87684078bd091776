// CPU reference: elementwise ops (binary, scalar, unary and their gradients,
// minimum/maximum's and clamp's gradients, comparisons, where, the triangles,
// axpy). Inputs have any strides (0 strides included: the
// dispatch point broadcasts with a raw expand); outputs are contiguous. Every
// output element depends on its inputs alone, so the loops split across
// threads at any point (Note [CPU threads]).
#include <algorithm>
#include <cmath>

#include "accrue/kernels/backend.h"
#include "accrue/kernels/cpu/cpu_util.h"

namespace accrue::kernels::cpu {

namespace {

// sqrt(2 / pi), the constant of GELU's tanh form.
constexpr double kGeluC = 0.7978845608028654;
constexpr double kGeluA = 0.044715;

// The length and stride of the last dim (1 and 0 for a 0-d tensor): a strided
// input walks a row with one offset computation, not one per element.
int64_t last_dim(const Tensor& t) {
  return t.dim() == 0 ? 1 : t.size(-1);
}
int64_t last_stride(const Tensor& t) {
  return t.dim() == 0 ? 0 : t.stride(-1);
}

// out[i] = f(a[i]) over a strided a and a contiguous out, in T's math type,
// split across threads in chunks of at least `grain` elements.
template <class T, class F>
void map1(int64_t grain, const Tensor& a, const Tensor& out, F f) {
  const Indexer ia(a);
  const T* pa = ptr<T>(a);
  T* po = ptr<T>(out);
  // Dense inputs take a loop without the per-element index test, which the
  // compiler vectorizes: the same arithmetic, so the same bits.
  const bool dense = a.is_contiguous();
  const int64_t cols = last_dim(out), sa = last_stride(a);
  parallel_for(0, out.numel(), grain, [&](int64_t i0, int64_t i1) {
    if (dense) {
      for (int64_t i = i0; i < i1; ++i)
        po[i] = store<T>(f(load(pa[i])));
    } else {
      // Row by row: one offset computation per row of the last dim.
      for (int64_t i = i0; i < i1;) {
        const int64_t end = std::min(i1, i - i % cols + cols);
        const T* ra = pa + ia(i);
        for (int64_t c = 0; c < end - i; ++c)
          po[i + c] = store<T>(f(load(ra[c * sa])));
        i = end;
      }
    }
  });
}

template <class T, class F>
void map2(int64_t grain, const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  const Indexer ia(a), ib(b);
  const T* pa = ptr<T>(a);
  const T* pb = ptr<T>(b);
  T* po = ptr<T>(out);
  const bool dense = a.is_contiguous() && b.is_contiguous();
  const int64_t cols = last_dim(out), sa = last_stride(a), sb = last_stride(b);
  parallel_for(0, out.numel(), grain, [&](int64_t i0, int64_t i1) {
    if (dense) {
      for (int64_t i = i0; i < i1; ++i)
        po[i] = store<T>(f(load(pa[i]), load(pb[i])));
    } else {
      for (int64_t i = i0; i < i1;) {
        const int64_t end = std::min(i1, i - i % cols + cols);
        const T* ra = pa + ia(i);
        const T* rb = pb + ib(i);
        for (int64_t c = 0; c < end - i; ++c)
          po[i + c] = store<T>(f(load(ra[c * sa]), load(rb[c * sb])));
        i = end;
      }
    }
  });
}

// The binary ops, once, for binary() and binary_scalar().
template <class M, class F>
void with_binary_op(BinaryOp op, F&& f) {
  switch (op) {
    case BinaryOp::Add:
      return f([](M x, M y) { return x + y; });
    case BinaryOp::Sub:
      return f([](M x, M y) { return x - y; });
    case BinaryOp::Mul:
      return f([](M x, M y) { return x * y; });
    case BinaryOp::Div:
      return f([](M x, M y) { return x / y; });
    case BinaryOp::Min:
      return f([](M x, M y) { return std::isnan(x) ? x : std::isnan(y) ? y : y < x ? y : x; });
    case BinaryOp::Max:
      return f([](M x, M y) { return std::isnan(x) ? x : std::isnan(y) ? y : y > x ? y : x; });
  }
}

template <class M>
M gelu(M x) {
  const M u = static_cast<M>(kGeluC) * (x + static_cast<M>(kGeluA) * x * x * x);
  return static_cast<M>(0.5) * x * (static_cast<M>(1) + std::tanh(u));
}

// d/dx of the tanh-form GELU above.
template <class M>
M gelu_derivative(M x) {
  const M c = static_cast<M>(kGeluC), a = static_cast<M>(kGeluA);
  const M t = std::tanh(c * (x + a * x * x * x));
  const M du = c * (static_cast<M>(1) + static_cast<M>(3) * a * x * x);
  return static_cast<M>(0.5) * (static_cast<M>(1) + t) +
         static_cast<M>(0.5) * x * (static_cast<M>(1) - t * t) * du;
}

// Compares in the natural type: 16-bit floats widen to float, integers stay exact.
template <class T>
auto compare_value(T v) {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
    return static_cast<float>(v);
  } else {
    return v;
  }
}

// Ops that cost a libm call per element split at a smaller grain.
int64_t op_grain(UnaryOp op) {
  const bool cheap = op == UnaryOp::Neg || op == UnaryOp::Relu || op == UnaryOp::Abs;
  return cheap ? kParallelWork : kParallelWork / 8;
}

}  // namespace

void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  visit_float(out.dtype(), op_name(op), [&](auto tag) {
    using T = decltype(tag);
    with_binary_op<math_t<T>>(op, [&](auto f) { map2<T>(kParallelWork, a, b, out, f); });
  });
}

void binary_scalar(BinaryOp op, const Tensor& a, double s, bool scalar_first, const Tensor& out) {
  visit_float(out.dtype(), op_name(op), [&](auto tag) {
    using T = decltype(tag);
    using M = math_t<T>;
    const M sv = static_cast<M>(s);
    with_binary_op<M>(op, [&](auto f) {
      if (scalar_first) {
        map1<T>(kParallelWork, a, out, [&](M x) { return f(sv, x); });
      } else {
        map1<T>(kParallelWork, a, out, [&](M x) { return f(x, sv); });
      }
    });
  });
}

void unary(UnaryOp op, const Tensor& a, double param, const Tensor& out) {
  visit_float(out.dtype(), op_name(op), [&](auto tag) {
    using T = decltype(tag);
    using M = math_t<T>;
    const M p = static_cast<M>(param);
    const int64_t grain = op_grain(op);
    switch (op) {
      case UnaryOp::Neg:
        return map1<T>(grain, a, out, [](M x) { return -x; });
      case UnaryOp::Exp:
        return map1<T>(grain, a, out, [](M x) { return std::exp(x); });
      case UnaryOp::Log:
        return map1<T>(grain, a, out, [](M x) { return std::log(x); });
      case UnaryOp::Sqrt:
        return map1<T>(grain, a, out, [](M x) { return std::sqrt(x); });
      case UnaryOp::Tanh:
        return map1<T>(grain, a, out, [](M x) { return std::tanh(x); });
      case UnaryOp::Relu:
        // NaN stays NaN (x > 0 is false for NaN, so test it first).
        return map1<T>(grain, a, out, [](M x) { return std::isnan(x) || x > 0 ? x : M(0); });
      case UnaryOp::Gelu:
        return map1<T>(grain, a, out, [](M x) { return gelu(x); });
      case UnaryOp::Sigmoid:
        return map1<T>(grain, a, out, [](M x) { return M(1) / (M(1) + std::exp(-x)); });
      case UnaryOp::Pow:
        return map1<T>(grain, a, out, [p](M x) { return std::pow(x, p); });
      case UnaryOp::Silu:
        return map1<T>(grain, a, out, [](M x) { return x / (M(1) + std::exp(-x)); });
      case UnaryOp::Rsqrt:
        return map1<T>(grain, a, out, [](M x) { return M(1) / std::sqrt(x); });
      case UnaryOp::Sin:
        return map1<T>(grain, a, out, [](M x) { return std::sin(x); });
      case UnaryOp::Cos:
        return map1<T>(grain, a, out, [](M x) { return std::cos(x); });
      case UnaryOp::Abs:
        return map1<T>(grain, a, out, [](M x) { return std::abs(x); });
    }
  });
}

void unary_backward(UnaryOp op, const Tensor& grad, const Tensor& input, const Tensor& output,
                    double param, const Tensor& out) {
  visit_float(out.dtype(), op_name(op), [&](auto tag) {
    using T = decltype(tag);
    using M = math_t<T>;
    const M p = static_cast<M>(param);
    const int64_t grain = op_grain(op);
    switch (op) {
      case UnaryOp::Neg:
        return map1<T>(grain, grad, out, [](M g) { return -g; });
      case UnaryOp::Exp:  // d exp(x) = exp(x) = y
        return map2<T>(grain, grad, output, out, [](M g, M y) { return g * y; });
      case UnaryOp::Log:
        return map2<T>(grain, grad, input, out, [](M g, M x) { return g / x; });
      case UnaryOp::Sqrt:  // d sqrt(x) = 1 / (2 sqrt(x))
        return map2<T>(grain, grad, output, out, [](M g, M y) { return g / (M(2) * y); });
      case UnaryOp::Tanh:
        return map2<T>(grain, grad, output, out, [](M g, M y) { return g * (M(1) - y * y); });
      case UnaryOp::Relu:
        return map2<T>(grain, grad, input, out, [](M g, M x) { return x > 0 ? g : M(0); });
      case UnaryOp::Gelu:
        return map2<T>(grain, grad, input, out, [](M g, M x) { return g * gelu_derivative(x); });
      case UnaryOp::Sigmoid:
        return map2<T>(grain, grad, output, out, [](M g, M y) { return g * y * (M(1) - y); });
      case UnaryOp::Pow:
        // x^0 is constant: its gradient is 0 even at x = 0 (where p * x^-1 would be NaN).
        if (p == M(0)) return map1<T>(grain, grad, out, [](M) { return M(0); });
        return map2<T>(grain, grad, input, out,
                       [p](M g, M x) { return g * p * std::pow(x, p - M(1)); });
      case UnaryOp::Silu:  // s (1 + x (1 - s)) with s = sigmoid(x)
        return map2<T>(grain, grad, input, out, [](M g, M x) {
          const M sg = M(1) / (M(1) + std::exp(-x));
          return g * sg * (M(1) + x * (M(1) - sg));
        });
      case UnaryOp::Rsqrt:  // d x^-1/2 = -y^3 / 2
        return map2<T>(grain, grad, output, out, [](M g, M y) { return M(-0.5) * g * y * y * y; });
      case UnaryOp::Sin:
        return map2<T>(grain, grad, input, out, [](M g, M x) { return g * std::cos(x); });
      case UnaryOp::Cos:
        return map2<T>(grain, grad, input, out, [](M g, M x) { return -g * std::sin(x); });
      case UnaryOp::Abs:  // g * sign(x), sign(0) = 0
        return map2<T>(grain, grad, input, out, [](M g, M x) {
          return x > 0 ? g : x < 0 ? -g : M(0);
        });
    }
  });
}

void minmax_backward(BinaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y,
                     const Tensor& out) {
  visit_float(out.dtype(), op_name(op), [&](auto tag) {
    using T = decltype(tag);
    using M = math_t<T>;
    const Indexer ig(grad), ix(x), iy(y);
    const T* pg = ptr<T>(grad);
    const T* px = ptr<T>(x);
    const T* py = ptr<T>(y);
    T* po = ptr<T>(out);
    const bool max = op == BinaryOp::Max;
    parallel_for(0, out.numel(), kParallelWork, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const M g = load(pg[ig(i)]), vx = load(px[ix(i)]), vy = load(py[iy(i)]);
        const bool loses = max ? vx < vy : vx > vy;
        po[i] = store<T>(vx == vy ? g / M(2) : loses ? M(0) : g);
      }
    });
  });
}

void clamp(const Tensor& a, double lo, double hi, const Tensor& out) {
  visit_float(out.dtype(), "clamp", [&](auto tag) {
    using T = decltype(tag);
    using M = math_t<T>;
    const M l = static_cast<M>(lo), h = static_cast<M>(hi);
    // NaN fails both tests and passes through.
    map1<T>(kParallelWork, a, out, [l, h](M x) { return x < l ? l : x > h ? h : x; });
  });
}

void clamp_backward(const Tensor& grad, const Tensor& input, double lo, double hi,
                    const Tensor& out) {
  visit_float(out.dtype(), "clamp_backward", [&](auto tag) {
    using T = decltype(tag);
    using M = math_t<T>;
    const M l = static_cast<M>(lo), h = static_cast<M>(hi);
    map2<T>(kParallelWork, grad, input, out,
            [l, h](M g, M x) { return x >= l && x <= h ? g : M(0); });
  });
}

void triangle(const Tensor& a, int64_t diagonal, bool upper, const Tensor& out) {
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const Indexer ia(a);
    const T* pa = ptr<T>(a);
    T* po = ptr<T>(out);
    const int64_t rows = out.size(-2), cols = out.size(-1);
    parallel_for(0, out.numel(), kParallelWork, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t c = i % cols, r = (i / cols) % rows;
        const bool keep = upper ? c - r >= diagonal : c - r <= diagonal;
        po[i] = keep ? pa[ia(i)] : T{};
      }
    });
  });
}

void compare(CompareOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const Indexer ia(a), ib(b);
    const T* pa = ptr<T>(a);
    const T* pb = ptr<T>(b);
    bool* po = ptr<bool>(out);
    auto run = [&](auto cmp) {
      parallel_for(0, out.numel(), kParallelWork, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i)
          po[i] = cmp(compare_value(pa[ia(i)]), compare_value(pb[ib(i)]));
      });
    };
    switch (op) {
      case CompareOp::Eq:
        return run([](auto x, auto y) { return x == y; });
      case CompareOp::Ne:
        return run([](auto x, auto y) { return x != y; });
      case CompareOp::Lt:
        return run([](auto x, auto y) { return x < y; });
      case CompareOp::Le:
        return run([](auto x, auto y) { return x <= y; });
      case CompareOp::Gt:
        return run([](auto x, auto y) { return x > y; });
      case CompareOp::Ge:
        return run([](auto x, auto y) { return x >= y; });
    }
  });
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const Indexer ic(cond), ia(a), ib(b);
    const bool* pc = ptr<bool>(cond);
    const T* pa = ptr<T>(a);
    const T* pb = ptr<T>(b);
    T* po = ptr<T>(out);
    parallel_for(0, out.numel(), kParallelWork, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i)
        po[i] = pc[ic(i)] ? pa[ia(i)] : pb[ib(i)];
    });
  });
}

namespace {

// dst += alpha * src with src of type S (Note [Mixed axpy]: a 16-bit S into an
// f32 dst takes the value src.to(f32) would hold, which is exact).
template <class T, class S>
void axpy_as(const Tensor& dst, double alpha, const Tensor& src) {
  using M = math_t<T>;
  const M al = static_cast<M>(alpha);
  const Indexer id(dst), is(src);
  T* pd = ptr<T>(dst);
  const S* ps = ptr<S>(src);
  auto add = [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      T& d = pd[id(i)];
      d = store<T>(load(d) + al * static_cast<M>(load(ps[is(i)])));
    }
  };
  // A strided dst is not known to be free of overlaps (only expanded views
  // are refused), so only a contiguous one is split across threads.
  if (dst.is_contiguous()) {
    parallel_for(0, dst.numel(), kParallelWork, add);
  } else {
    add(0, dst.numel());
  }
}

}  // namespace

void axpy(const Tensor& dst, double alpha, const Tensor& src) {
  if (dst.dtype() == DType::f32 && src.dtype() == DType::bf16)
    return axpy_as<float, bf16>(dst, alpha, src);
  if (dst.dtype() == DType::f32 && src.dtype() == DType::f16)
    return axpy_as<float, f16>(dst, alpha, src);
  ACCRUE_CHECK(src.dtype() == dst.dtype(), "axpy_: src dtype ", dtype_name(src.dtype()),
               " into dst dtype ", dtype_name(dst.dtype()));
  visit_float(dst.dtype(), "axpy_", [&](auto tag) {
    using T = decltype(tag);
    axpy_as<T, T>(dst, alpha, src);
  });
}

}  // namespace accrue::kernels::cpu
