// Copies of a tensor that requires grad carry its gradient (accrue::contiguous,
// clone, to_dtype, to_device), and the raw Tensor methods refuse such a tensor
// while grad mode is on, naming the function to use (Note [Raw views]).
#include "accrue/autograd/engine.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/variable.h"
#include "accrue/core/grad_mode.h"
#include "tests/autograd/gradcheck_util.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using test::leaf;

TEST(Copies, differentiable_copies_pass_gradcheck) {
  // A transposed input makes contiguous copy; a contiguous one returns a new handle.
  EXPECT_GRADCHECK([](auto& v) { return contiguous(transpose(v[0], 0, 1)) * 2.0; }, leaf({3, 4}));
  EXPECT_GRADCHECK([](auto& v) { return contiguous(v[0]) * v[0]; }, leaf({3, 4}));
  EXPECT_GRADCHECK([](auto& v) { return clone(v[0]) * v[0]; }, leaf({3, 4}));
  EXPECT_GRADCHECK([](auto& v) { return clone(narrow(v[0], 1, 1, 2)) * 3.0; }, leaf({3, 4}));
  // f64 -> f64 is a same-dtype cast; f64 -> f32 -> f64 loses precision, so
  // the round trip is checked by its gradient alone below.
  EXPECT_GRADCHECK([](auto& v) { return to_dtype(v[0], DType::f64) * v[0]; }, leaf({5}));
  EXPECT_GRADCHECK([](auto& v) { return to_device(v[0], Device::cpu()) * v[0]; }, leaf({5}));
}

TEST(Copies, results_require_grad_and_gradients_reach_the_leaf) {
  Tensor x = leaf({2, 3});
  Tensor t = transpose(x, 0, 1);
  for (const Tensor& y :
       {contiguous(t), clone(x), to_dtype(x, DType::f32), to_device(x, Device::cpu())}) {
    EXPECT_TRUE(y.requires_grad());
    EXPECT_FALSE(is_leaf(y));
  }
  // The case: a cast copy's gradient is cast back into the leaf's dtype.
  clear_grad(x);
  backward(sum(to_dtype(x, DType::f32) * 2.0));
  ASSERT_TRUE(grad(x).defined());
  EXPECT_EQ(grad(x).dtype(), DType::f64);
  for (double g : grad(x).to_vector<double>())
    EXPECT_EQ(g, 2.0);
  clear_grad(x);
  backward(sum(clone(x) * 3.0));
  for (double g : grad(x).to_vector<double>())
    EXPECT_EQ(g, 3.0);
}

TEST(Copies, raw_methods_refuse_a_tensor_that_requires_grad_naming_the_function) {
  Tensor x = leaf({2, 3});
  Tensor t = transpose(x, 0, 1);  // not contiguous, and not a leaf
  EXPECT_ERROR(t.contiguous(), "Tensor::contiguous", "drop its gradient", "accrue::contiguous");
  // Refused whether or not the copy would have been the tensor itself: the
  // outcome must not hang on the layout.
  EXPECT_ERROR(x.contiguous(), "Tensor::contiguous", "accrue::contiguous");
  EXPECT_ERROR(x.clone(), "Tensor::clone", "accrue::clone");
  EXPECT_ERROR(x.to(DType::f32), "Tensor::to(DType)", "accrue::to_dtype");
  EXPECT_ERROR(x.to(DType::f64), "Tensor::to(DType)", "accrue::to_dtype");
  EXPECT_ERROR(x.to(Device::cpu()), "Tensor::to(Device)", "accrue::to_device");
  EXPECT_ERROR(make_view(x, {3}, {1}, 0), "make_view", "drop its gradient");
  // In-place writes autograd cannot record.
  EXPECT_ERROR(x.fill_(1.0), "Tensor::fill_", "requires grad", "NoGradGuard");
  EXPECT_ERROR(x.copy_(ones({2, 3}, DType::f64)), "Tensor::copy_ into", "requires grad",
               "load_parameter");
  Tensor plain = zeros({2, 3}, DType::f64);
  EXPECT_ERROR(plain.copy_(x), "Tensor::copy_ from", "drop its gradient", "accrue::clone");
}

TEST(Copies, raw_methods_are_data_handling_without_grad_mode_or_grad) {
  Tensor x = leaf({2, 3});
  const std::vector<double> values = x.to_vector<double>();  // read-backs accept it
  {
    NoGradGuard no_grad;
    Tensor c = x.clone();
    EXPECT_FALSE(c.requires_grad());
    EXPECT_EQ(c.to_vector<double>(), values);
    EXPECT_EQ(x.to(DType::f32).dtype(), DType::f32);
    EXPECT_TRUE(x.contiguous().is_same(x));
    x.fill_(0.5);  // an initializer's write
    x.copy_(c);
  }
  EXPECT_EQ(x.to_vector<double>(), values);
  // A tensor nobody tracks is plain data under grad mode too.
  Tensor d = detach(x);
  EXPECT_FALSE(d.clone().requires_grad());
  d.fill_(1.0);  // detach() shares the storage: PyTorch's x.data.fill_
  for (double v : x.to_vector<double>())
    EXPECT_EQ(v, 1.0);
}

}  // namespace
}  // namespace accrue
