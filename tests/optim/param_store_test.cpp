// ParamStore: Note [Parameter store] and Note [One load path] on the CPU.
#include "accrue/optim/param_store.h"

#include "accrue/autograd/ops.h"
#include "accrue/core/allocator.h"
#include "accrue/nn/module.h"
#include "accrue/optim/window.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using optim::ParamStore;

std::vector<Tensor> three_params(DType dtype = DType::f32) {
  return {requires_grad_(test::random_normal({3, 5}, dtype)),
          requires_grad_(test::random_normal({7}, dtype)),
          requires_grad_(test::random_normal({2, 2, 2}, dtype))};
}

TEST(ParamStore, each_parameter_is_its_master_slot_with_its_values) {
  std::vector<Tensor> params = three_params();
  std::vector<Tensor> before;
  for (const Tensor& p : params)
    before.push_back(detach(p).clone());
  ParamStore store({{"a", params[0]}, {"b", params[1]}, {"c", params[2]}},
                   optim::ParamStoreOptions());
  for (size_t i = 0; i < store.size(); ++i) {
    const ParamStore::Slot& s = store.slots()[i];
    EXPECT_EQ(params[i].storage(), store.master().storage());
    EXPECT_EQ(params[i].offset(), s.offset);
    EXPECT_TRUE(test::all_equal(params[i], before[i]));
    EXPECT_EQ(grad(params[i]).storage(), store.grads().storage());
    EXPECT_TRUE(test::all_equal(parameter_value(params[i]), before[i]));
  }
  EXPECT_EQ(store.master().numel(), store.padded_numel());
  EXPECT_FALSE(store.compute().defined());
  EXPECT_TRUE(store.forward_weights().is_same(store.master()));
  // Padding reads zero in every role (the norm pass and optimizer sweep it).
  const std::vector<float> master = store.master().to_vector<float>();
  for (int64_t i = 15; i < 64; ++i)
    EXPECT_EQ(master[i], 0.0f);
  EXPECT_EQ(store.moment(1).to_vector<float>(), std::vector<float>(store.padded_numel(), 0.0f));
  const optim::StoreMemory m = store.memory();
  EXPECT_EQ(m.master, store.padded_numel() * 4);
  EXPECT_EQ(m.moments, 2 * store.padded_numel() * 4);
  EXPECT_EQ(m.compute, 0);
}

// Note [Copy-engine all-reduce]: on the CPU shareable_gradients changes
// nothing (no process maps host memory through CUDA IPC); the allocator's mode
// scope restores the mode it found.
TEST(ParamStore, shareable_gradients_on_the_cpu_are_plain_zeroed_slots) {
  ParamStore store(three_params(), optim::ParamStoreOptions().shareable_gradients(true));
  EXPECT_TRUE(store.options().shareable_gradients());
  EXPECT_FALSE(optim::ParamStoreOptions().shareable_gradients());
  EXPECT_TRUE(test::all_equal(store.grads(), zeros({store.grads().numel()}, DType::f32)));
  const CudaAllocatorMode mode = cuda_allocator_mode();
  {
    CudaAllocatorModeScope scope(mode == CudaAllocatorMode::Plain
                                     ? CudaAllocatorMode::StreamOrderedPool
                                     : CudaAllocatorMode::Plain);
    EXPECT_NE(cuda_allocator_mode(), mode);
  }
  EXPECT_EQ(cuda_allocator_mode(), mode);
}

// Note [Parameter layouts]: a channels-last parameter keeps its layout in
// every role (the slot holds its elements in N, H, W, C order).
TEST(ParamStore, a_channels_last_parameter_keeps_its_layout_in_every_role) {
  const Tensor values = test::random_normal({4, 3, 2, 5}, DType::f32);
  std::vector<Tensor> params = {requires_grad_(test::as_channels_last(values)),
                                requires_grad_(test::random_normal({4, 3, 2, 5}, DType::f32))};
  ParamStore store({{"last", params[0]}, {"row", params[1]}},
                   optim::ParamStoreOptions().compute_dtype(DType::bf16).moments(1));
  const Shape last_strides{30, 1, 15, 3};
  EXPECT_EQ(params[0].strides(), last_strides);
  EXPECT_EQ(store.master_view(0).strides(), last_strides);
  EXPECT_EQ(store.grad_view(0).strides(), last_strides);
  EXPECT_TRUE(params[1].is_contiguous());
  EXPECT_TRUE(test::all_equal(store.master_view(0), values));
  EXPECT_TRUE(test::all_equal(params[0], values.to(DType::bf16)));
  EXPECT_TRUE(test::all_equal(store.master().narrow(0, 0, values.numel()),
                              values.permute({0, 2, 3, 1}).contiguous().reshape({120})));
  // A load keeps the layout too: the flat slot again in channels-last order.
  const Tensor next = test::random_normal({4, 3, 2, 5}, DType::f64);
  store.load("last", next);
  EXPECT_TRUE(
      test::all_equal(store.master().narrow(0, 0, values.numel()),
                      next.to(DType::f32).permute({0, 2, 3, 1}).contiguous().reshape({120})));
  EXPECT_TRUE(test::all_equal(params[0], next.to(DType::f32).to(DType::bf16)));
}

TEST(ParamStore, a_compute_copy_repoints_parameters_to_bf16) {
  std::vector<Tensor> params = three_params();
  const Tensor expected = detach(params[0]).to(DType::bf16);
  ParamStore store(params, optim::ParamStoreOptions().compute_dtype(DType::bf16).moments(0));
  EXPECT_EQ(params[0].dtype(), DType::bf16);
  EXPECT_EQ(params[0].storage(), store.compute().storage());
  EXPECT_TRUE(store.forward_weights().is_same(store.compute()));
  EXPECT_TRUE(test::all_equal(params[0], expected));
  EXPECT_EQ(store.master().dtype(), DType::f32);
  // The authoritative value is the master, in f32.
  EXPECT_EQ(parameter_value(params[0]).dtype(), DType::f32);
  EXPECT_EQ(store.memory().compute, store.padded_numel() * 2);
}

// Note [One load path]: a load after the store exists writes the master (the
// value cast once) and then the compute copy from it, exactly the state a
// store built over the loaded values has.
TEST(ParamStore, loading_after_the_store_equals_loading_before_it) {
  for (DType compute : {DType::f32, DType::bf16, DType::f16}) {
    std::vector<Tensor> values;
    for (const Tensor& p : three_params(DType::f64))
      values.push_back(detach(p));
    std::vector<Tensor> early = three_params(), late = three_params();
    for (size_t i = 0; i < values.size(); ++i)
      load_parameter(early[i], values[i]);
    const auto options = optim::ParamStoreOptions().compute_dtype(compute);
    ParamStore a({{"a", early[0]}, {"b", early[1]}, {"c", early[2]}}, options);
    ParamStore b({{"a", late[0]}, {"b", late[1]}, {"c", late[2]}}, options);
    b.load("a", values[0]);              // by name
    b.load(late[1], values[1]);          // by handle
    load_parameter(late[2], values[2]);  // through the owner, as nn does
    EXPECT_TRUE(test::all_equal(a.master(), b.master())) << dtype_name(compute);
    if (compute != DType::f32) {
      EXPECT_TRUE(test::all_equal(a.compute(), b.compute()));
    }
    for (size_t i = 0; i < values.size(); ++i)
      EXPECT_TRUE(test::all_equal(early[i], late[i])) << i;
  }
}

TEST(ParamStore, module_state_dict_reads_and_writes_the_master) {
  Generator gen(3);
  nn::MLP a({4, 6, 2}, {Device::cpu(), DType::f32, &gen});
  nn::MLP b({4, 6, 2}, {Device::cpu(), DType::f32, &gen});
  ParamStore sa(a.named_parameters(),
                optim::ParamStoreOptions().compute_dtype(DType::bf16).moments(0));
  ParamStore sb(b.named_parameters(),
                optim::ParamStoreOptions().compute_dtype(DType::bf16).moments(0));
  const std::map<std::string, Tensor> state = a.state_dict();
  for (const auto& [name, t] : state)
    EXPECT_EQ(t.dtype(), DType::f32) << name;  // the master, not the bf16 copy
  b.load_state_dict(state);
  EXPECT_TRUE(test::all_equal(sa.master(), sb.master()));
  EXPECT_TRUE(test::all_equal(sa.compute(), sb.compute()));
}

TEST(ParamStore, a_parameter_without_a_store_is_loaded_by_a_plain_copy) {
  const Tensor p = requires_grad_(test::random_normal({2, 3}));
  const Tensor v = test::random_normal({2, 3}, DType::f64);
  load_parameter(p, v);
  EXPECT_TRUE(test::all_equal(p, v.to(DType::f32)));
  EXPECT_TRUE(parameter_value(p).is_same(p));
  { ParamStore store({p}, optim::ParamStoreOptions().moments(0)); }
  // The store is gone: the parameter holds its value itself again.
  load_parameter(p, v * 2.0);
  EXPECT_TRUE(test::all_equal(p, (v * 2.0).to(DType::f32)));
}

// Note [ZeRO-1]: with the master sharded, a load writes this rank's owned
// part of the master and the whole compute copy.
TEST(ParamStore, a_load_into_a_sharded_master_writes_the_owned_part) {
  std::vector<Tensor> params = three_params();
  ParamStore store({{"a", params[0]}, {"b", params[1]}, {"c", params[2]}},
                   optim::ParamStoreOptions().compute_dtype(DType::bf16).moments(0));
  const Tensor whole = store.master().clone();
  // Own the second half of slot a and all of slot c.
  const std::vector<ArenaRange> owned = {{8, 56}, {128, 64}};
  store.shard_master(owned);
  EXPECT_TRUE(store.master_sharded());
  EXPECT_EQ(store.master().numel(), 120);
  EXPECT_ERROR(store.master_view(0), "master_view", "sharded");
  EXPECT_TRUE(parameter_value(params[0]).is_same(params[0]));
  const Tensor a = test::random_normal({3, 5});
  store.load("a", a);
  const Tensor flat_a = a.reshape({15});
  EXPECT_TRUE(test::all_equal(store.master().narrow(0, 0, 7), flat_a.narrow(0, 8, 7)));
  EXPECT_TRUE(test::all_equal(store.master().narrow(0, 7, 49), whole.narrow(0, 15, 49)));
  EXPECT_TRUE(test::all_equal(store.master().narrow(0, 56, 64), whole.narrow(0, 128, 64)));
  EXPECT_TRUE(test::all_equal(params[0], a.to(DType::bf16)));
  // A whole packed master at once: the owned ranges of the compute copy follow.
  const Tensor packed = test::random_normal({120});
  store.load_master(packed, owned);
  EXPECT_TRUE(test::all_equal(store.master(), packed));
  EXPECT_TRUE(test::all_equal(store.compute().narrow(0, 128, 64),
                              packed.narrow(0, 56, 64).to(DType::bf16)));
  EXPECT_ERROR(store.load_master(packed), "load_master", "sharded");
  EXPECT_ERROR(store.refresh_compute(), "refresh_compute", "sharded");
}

TEST(ParamStore, load_master_writes_the_whole_master_then_the_compute_copy) {
  std::vector<Tensor> params = three_params();
  ParamStore store(params, optim::ParamStoreOptions().compute_dtype(DType::f16).moments(0));
  const Tensor master = test::random_normal({store.padded_numel()});
  store.load_master(master);
  EXPECT_TRUE(test::all_equal(store.master(), master));
  EXPECT_TRUE(test::all_equal(store.compute(), master.to(DType::f16)));
  store.master().fill_(0.5);
  store.refresh_compute();
  EXPECT_TRUE(test::all_equal(params[1], full({7}, 0.5, DType::f16)));
}

TEST(ParamStore, bad_options_and_loads_are_errors) {
  std::vector<Tensor> params = three_params();
  EXPECT_ERROR(ParamStore(params, optim::ParamStoreOptions().master_dtype(DType::bf16).moments(0)),
               "ParamStore", "master dtype");
  EXPECT_ERROR(ParamStore(params, optim::ParamStoreOptions().compute_dtype(DType::f64).moments(0)),
               "ParamStore", "compute dtype f64");
  EXPECT_ERROR(ParamStore(params, optim::ParamStoreOptions().moments(4)), "ParamStore",
               "moments must be 0..3, got 4");
  ParamStore store({{"w", params[0]}}, optim::ParamStoreOptions().moments(0));
  EXPECT_ERROR(store.moment(0), "ParamStore::moment", "0 moment arenas");
  EXPECT_ERROR(store.load("v", ones({3, 5})), "ParamStore::load", "no parameter named 'v'");
  EXPECT_ERROR(store.load("w", ones({5, 3})), "ParamStore::load", "'w'", "[3, 5]", "[5, 3]");
  EXPECT_ERROR(store.load(params[1], ones({7})), "ParamStore::load", "not a parameter");
  EXPECT_ERROR(store.shard_master({}), "shard_master", "no compute copy");
}

// The builder's defaults: f32 on the CPU, the compute dtype following the
// master, two moment arenas; the store takes named_parameters() directly.
TEST(ParamStore, options_are_named_setters_with_defaults) {
  const optim::ParamStoreOptions d;
  EXPECT_FALSE(d.has_device());  // unset: the store lives where its parameters are
  EXPECT_EQ(d.device(), Device::cpu());
  EXPECT_EQ(d.master_dtype(), DType::f32);
  EXPECT_EQ(d.compute_dtype(), DType::f32);
  EXPECT_EQ(d.moments(), 2);
  EXPECT_EQ(d.shard_ranks(), 1);
  const auto o = optim::ParamStoreOptions().master_dtype(DType::f64).moments(0).name("m");
  EXPECT_EQ(o.compute_dtype(), DType::f64);  // follows the master unless set
  EXPECT_EQ(o.name(), "m");
  EXPECT_EQ(optim::ParamStoreOptions()
                .compute_dtype(DType::bf16)
                .master_dtype(DType::f64)
                .compute_dtype(),
            DType::bf16);
  Generator gen(4);
  nn::MLP model({3, 4, 2}, {Device::cpu(), DType::f32, &gen});
  ParamStore store(model.named_parameters());
  EXPECT_EQ(store.options().device(), Device::cpu());
  ASSERT_EQ(store.size(), 4u);
  EXPECT_EQ(store.slots()[0].name, "fc0.weight");
  EXPECT_EQ(store.slots()[3].name, "fc1.bias");
  ParamStore unnamed(three_params());
  EXPECT_EQ(unnamed.slots()[2].name, "param2");
}

// Note [One owner], the case: a second store over a model's
// parameters used to take them over silently, leaving the first Window with
// grad_norm 0 and weights that never moved. Now it is refused, naming the
// parameter and its holder, and the first keeps training.
TEST(ParamStore, a_second_store_over_the_same_parameters_is_refused) {
  Generator gen(5);
  nn::MLP model({3, 4, 2}, {Device::cpu(), DType::f64, &gen});
  ParamStore first(model.named_parameters(),
                   optim::ParamStoreOptions().master_dtype(DType::f64).name("main"));
  EXPECT_ERROR(ParamStore(model.named_parameters(),
                          optim::ParamStoreOptions().master_dtype(DType::f64).name("eval")),
               "GradArena 'eval': parameter 'fc0.weight' is already held by the gradient arena "
               "'main' (4 parameters), as its 'fc0.weight'");
  optim::Optimizer opt(optim::SGDOptions(0.1));
  optim::Window window(first, opt, optim::WindowOptions());
  const Tensor before = detach(first.master()).clone();
  const Tensor x = test::random_normal({5, 3}, DType::f64);
  const Tensor y = from_vector<int64_t>({0, 1, 1, 0, 1}, {5});
  window.backward(cross_entropy(model.forward(x), y));
  window.close();
  EXPECT_GT(window.report().grad_norm, 0.0);
  EXPECT_FALSE(test::all_equal(first.master(), before));
}

}  // namespace
}  // namespace accrue
