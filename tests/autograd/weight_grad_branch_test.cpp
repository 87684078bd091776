// Note [Weight gradients on a branch] on the CPU: the ops a branch asks of the
// streams, written down by a recording Ops (the writes run where they are),
// for the bookkeeping alone and through real backwards over a gradient arena:
// a tied weight, a LayerNorm's slots, a hook, the join at the end. The same
// bits as without a branch are checked here on the CPU and, with real
// streams inside CUDA graphs, in tests/optim/gpu_graphed_window_test.cpp.
#include "accrue/autograd/weight_grad_branch.h"

#include <string>
#include <vector>

#include "accrue/autograd/conv_ops.h"
#include "accrue/autograd/engine.h"
#include "accrue/autograd/grad_arena.h"
#include "accrue/autograd/ops.h"
#include "accrue/autograd/transformer_ops.h"
#include "accrue/autograd/variable.h"
#include "tests/test_util.h"

namespace accrue {
namespace {

using autograd::WeightGradBranch;
using autograd::WeightGradBranchScope;

// "fork 0", "done 0", "wait 0": the ops in issue order.
struct Log {
  std::vector<std::string> ops;
  WeightGradBranch::Ops recorder() {
    return [this](WeightGradBranch::Op op, int64_t entry) {
      const char* name = op == WeightGradBranch::Op::fork          ? "fork "
                         : op == WeightGradBranch::Op::branch_done ? "done "
                                                                   : "wait ";
      ops.push_back(name + std::to_string(entry));
    };
  }
  std::string str() const {
    std::string s;
    for (const std::string& o : ops)
      s += (s.empty() ? "" : ", ") + o;
    return s;
  }
};

TEST(WeightGradBranch, a_new_entry_beyond_the_lag_retires_the_oldest_and_join_waits_for_the_last) {
  Log log;
  WeightGradBranch branch(0, nullptr, /*lag=*/2, log.recorder());
  int ran = 0;
  for (int i = 0; i < 4; ++i)
    branch.run({}, [&] { ++ran; });
  EXPECT_EQ(ran, 4);
  EXPECT_EQ(branch.pending(), 2);
  branch.join();
  EXPECT_EQ(branch.pending(), 0);
  EXPECT_EQ(log.str(),
            "fork 0, done 0, fork 1, done 1, fork 2, done 2, wait 0, fork 3, done 3, wait 1, "
            "wait 3");
  EXPECT_EQ(branch.lag_waits(), 2);
  EXPECT_EQ(branch.join_waits(), 1);
  branch.join();  // nothing pending: no wait
  EXPECT_EQ(branch.join_waits(), 1);
}

TEST(WeightGradBranch,
     a_current_write_into_a_branch_slot_waits_for_the_branch_s_last_write_into_it) {
  Log log;
  WeightGradBranch branch(0, nullptr, /*lag=*/4, log.recorder());
  int a = 0, b = 0, c = 0;
  branch.run({}, [&] { branch.slot_write(&a); });
  branch.run({}, [&] {
    branch.slot_write(&b);
    branch.slot_write(&a);
  });
  branch.run({}, [&] { branch.slot_write(&c); });
  branch.slot_write(&b);  // last written by entry 1: entries 0 and 1 retire
  EXPECT_EQ(branch.pending(), 1);
  EXPECT_EQ(branch.slot_waits(), 1);
  branch.slot_write(&a);    // retired already: no wait
  branch.slot_write(&log);  // never on the branch: no wait
  EXPECT_EQ(branch.slot_waits(), 1);
  EXPECT_EQ(log.str(), "fork 0, done 0, fork 1, done 1, fork 2, done 2, wait 1");
}

TEST(WeightGradBranch, kept_tensors_live_until_their_entry_retires) {
  Log log;
  WeightGradBranch branch(0, nullptr, /*lag=*/1, log.recorder());
  Tensor kept = test::random_normal({4}, DType::f32);
  const std::weak_ptr<Storage> watch = kept.storage();
  branch.run({kept}, [] {});
  kept = Tensor();
  EXPECT_FALSE(watch.expired()) << "freed before the current stream waited";
  branch.run({}, [] {});  // the lag of 1 retires entry 0
  EXPECT_TRUE(watch.expired());
}

TEST(WeightGradBranch, bad_uses_are_errors) {
  Log log;
  EXPECT_ERROR(WeightGradBranch(0, nullptr, 0, log.recorder()), "WeightGradBranch", "lag", "got 0");
  EXPECT_ERROR(WeightGradBranch(0, nullptr, 2), "WeightGradBranch", "no branch stream");
  WeightGradBranch branch(0, nullptr, 2, log.recorder());
  EXPECT_ERROR(branch.run({}, [&] { branch.run({}, [] {}); }), "WeightGradBranch::run",
               "inside a branch's writes");
  EXPECT_FALSE(branch.on_branch());  // put back after the throw
  EXPECT_ERROR(branch.run({}, [&] { branch.join(); }), "WeightGradBranch::join");
  // An entry whose writes threw never recorded its event: it is dropped, so
  // that no later wait asks for it (with CUDA events, a null one).
  EXPECT_EQ(branch.pending(), 0);
  branch.run({}, [] {});
  EXPECT_ERROR(branch.run({}, [] { throw Error("a write failed"); }), "a write failed");
  EXPECT_EQ(branch.pending(), 1);
  branch.join();
  EXPECT_EQ(log.ops.back(), "wait 2");  // entry 2, the one that ran; entry 3 threw
}

// A toy tied model over an arena: embedding(wte) -> layer_norm -> linear -> rms_norm, then two
// heads on wte (a Linear used twice and the fused classifier), like GPT-2's tied
// classifier: written first by the heads, last by the embedding.
struct Tied {
  Tensor wte = requires_grad_(test::random_normal({11, 6}, DType::f64));
  Tensor ln_w = requires_grad_(test::random_normal({6}, DType::f64));
  Tensor ln_b = requires_grad_(test::random_normal({6}, DType::f64));
  Tensor fc_w = requires_grad_(test::random_normal({6, 6}, DType::f64));
  Tensor fc_b = requires_grad_(test::random_normal({6}, DType::f64));
  Tensor rms_w = requires_grad_(test::random_normal({6}, DType::f64));
  Tensor bias = requires_grad_(test::random_normal({11}, DType::f64));
  GradArena arena{{{"wte", wte},
                   {"ln.w", ln_w},
                   {"ln.b", ln_b},
                   {"fc.w", fc_w},
                   {"fc.b", fc_b},
                   {"rms.w", rms_w},
                   {"bias", bias}},
                  GradArenaOptions().dtype(DType::f64)};
  Tensor loss(const Tensor& tokens, const Tensor& targets) {
    Tensor h = embedding(wte, tokens);
    h = rms_norm(linear(layer_norm(h, ln_w, ln_b), fc_w, fc_b), rms_w, 1e-6);
    const Tensor head = sum(linear(h, wte, bias) * linear(h, wte, bias));
    const Tensor classifier = classifier_cross_entropy(h, wte, targets, 11, -1).sum;
    return head + classifier;
  }
};

// Two micro-steps of each model into its arena, `branched` with the branch in
// force (the backward's end joins it each time): what the models' tests compare.
template <class Model, class Loss>
void two_micro_steps(Model& plain, Model& branched, WeightGradBranch& branch, const Loss& loss) {
  plain.arena.begin_window();
  branched.arena.begin_window();
  for (int micro_step = 0; micro_step < 2; ++micro_step) {
    backward(loss(plain));
    const WeightGradBranchScope in_force(branch);
    backward(loss(branched));
    EXPECT_EQ(branch.pending(), 0) << "the backward's end joins";
  }
}

TEST(WeightGradBranch, a_tied_model_s_slots_keep_their_order_and_bits) {
  const Tensor tokens = test::random_integers({5}, 0, 10, DType::i64);
  const Tensor targets = test::random_integers({5}, 0, 10, DType::i64);
  Tied plain, branched;
  const std::vector<std::pair<Tensor, Tensor>> same = {
      {branched.wte, plain.wte},   {branched.ln_w, plain.ln_w}, {branched.ln_b, plain.ln_b},
      {branched.fc_w, plain.fc_w}, {branched.fc_b, plain.fc_b}, {branched.rms_w, plain.rms_w},
      {branched.bias, plain.bias}};
  for (const auto& [to, from] : same)
    detach(to).copy_(detach(from));
  Log log;
  WeightGradBranch branch(0, nullptr, /*lag=*/8, log.recorder());
  two_micro_steps(plain, branched, branch, [&](Tied& m) { return m.loss(tokens, targets); });
  EXPECT_TRUE(test::all_equal(plain.arena.grads(), branched.arena.grads()));
  // Each backward: the heads fork (the classifier and the Linear used twice),
  // then the RMSNorm's total, fc, the LayerNorm's totals; the embedding's write
  // into wte waits for the last head entry; the end joins the rest.
  EXPECT_EQ(branch.entries(), 12);
  EXPECT_EQ(branch.slot_waits(), 2) << log.str();
  EXPECT_EQ(branch.join_waits(), 2) << log.str();
  EXPECT_EQ(branch.lag_waits(), 0);
}

// Convolutions' weight gradients go on the branch too: a 3 x 3 convolution
// used twice (its slot written by both uses) between a first convolution and
// a Linear head. The second use's write, issued on the branch after the
// first's, keeps the slot's order; the bits are those without a branch.
struct Convs {
  Tensor c1 = requires_grad_(test::random_normal({4, 2, 3, 3}, DType::f64));
  Tensor c2 = requires_grad_(test::random_normal({4, 4, 3, 3}, DType::f64));
  Tensor fc_w = requires_grad_(test::random_normal({3, 4 * 6 * 6}, DType::f64));
  GradArena arena{{{"c1", c1}, {"c2", c2}, {"fc.w", fc_w}}, GradArenaOptions().dtype(DType::f64)};
  Tensor loss(const Tensor& x) {
    Conv2dOptions same;
    same.pad_h = same.pad_w = 1;
    Tensor h = relu(conv2d(x, c1, Tensor(), same));
    h = relu(conv2d(h, c2, Tensor(), same));
    h = conv2d(h, c2, Tensor(), same);
    return sum(linear(reshape(h, {h.size(0), -1}), fc_w, Tensor()));
  }
};

TEST(WeightGradBranch, convolution_weight_gradients_keep_their_order_and_bits) {
  const Tensor x = test::random_normal({2, 2, 6, 6}, DType::f64);
  Convs plain, branched;
  for (const auto& [to, from] : std::vector<std::pair<Tensor, Tensor>>{
           {branched.c1, plain.c1}, {branched.c2, plain.c2}, {branched.fc_w, plain.fc_w}})
    detach(to).copy_(detach(from));
  Log log;
  WeightGradBranch branch(0, nullptr, /*lag=*/8, log.recorder());
  two_micro_steps(plain, branched, branch, [&](Convs& m) { return m.loss(x); });
  EXPECT_TRUE(test::all_equal(plain.arena.grads(), branched.arena.grads()));
  // Each backward: the Linear, the three convolutions (c2 twice); all on the
  // branch, so no current-stream write waits; the end joins.
  EXPECT_EQ(branch.entries(), 8);
  EXPECT_EQ(branch.slot_waits(), 0) << log.str();
  EXPECT_EQ(branch.join_waits(), 2) << log.str();
}

TEST(WeightGradBranch, a_leaf_with_a_grad_ready_hook_joins_before_the_hook_runs) {
  Tied model;
  Log log;
  WeightGradBranch branch(0, nullptr, /*lag=*/8, log.recorder());
  int64_t pending_in_hook = -1;
  register_grad_ready_hook(model.fc_w, [&](const Tensor&) { pending_in_hook = branch.pending(); });
  model.arena.begin_window();
  const WeightGradBranchScope in_force(branch);
  backward(model.loss(test::random_integers({5}, 0, 10, DType::i64),
                      test::random_integers({5}, 0, 10, DType::i64)));
  EXPECT_EQ(pending_in_hook, 0);
}

TEST(WeightGradBranch, a_leaf_without_a_slot_stays_inline) {
  // No arena: the gradients are fresh tensors the engine adds on the current stream.
  Tensor w = requires_grad_(test::random_normal({3, 4}, DType::f64));
  Tensor b = requires_grad_(test::random_normal({3}, DType::f64));
  Log log;
  WeightGradBranch branch(0, nullptr, 2, log.recorder());
  {
    const WeightGradBranchScope in_force(branch);
    backward(sum(linear(test::random_normal({2, 4}, DType::f64), w, b)));
  }
  EXPECT_EQ(branch.entries(), 0);
  EXPECT_TRUE(grad(w).defined());
  EXPECT_TRUE(grad(b).defined());
}

}  // namespace
}  // namespace accrue
