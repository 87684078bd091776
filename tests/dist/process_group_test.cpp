// The world-size-1 communicator (StubCommunicator, dist/process_group.h).
#include "accrue/dist/process_group.h"
#include "tests/test_util.h"

namespace accrue::dist {
namespace {

TEST(StubCommunicator, collectives_are_the_identity) {
  StubCommunicator comm;
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.world_size(), 1);
  EXPECT_EQ(comm.device(), Device::cpu());
  EXPECT_EQ(comm.stream(), nullptr);

  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::i64}) {
    Tensor data = test::random_integers({37}, -9, 9, dt == DType::i64 ? DType::f32 : dt).to(dt);
    Tensor before = data.clone();
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
      comm.all_reduce(data, op);
      EXPECT_TRUE(test::all_equal(data, before)) << dtype_name(dt) << " " << reduce_op_name(op);
    }
    comm.broadcast(data, 0);
    EXPECT_TRUE(test::all_equal(data, before));
  }

  Tensor input = test::random_normal({64});
  Tensor output = test::random_normal({8, 8});
  comm.reduce_scatter(input, output);
  EXPECT_TRUE(test::all_equal(output.reshape({64}), input));
  Tensor gathered = test::random_normal({64});
  comm.all_gather(input, gathered);
  EXPECT_TRUE(test::all_equal(gathered, input));
  // In place (the ZeRO-1 forms): output is input's own chunk.
  Tensor before = input.clone();
  comm.reduce_scatter(input, input);
  comm.all_gather(input, input);
  EXPECT_TRUE(test::all_equal(input, before));
  comm.synchronize();
  comm.check();
}

TEST(StubCommunicator, bad_tensors_are_errors) {
  StubCommunicator comm;
  Tensor t = test::random_normal({4, 6});
  EXPECT_ERROR(comm.all_reduce(t.transpose(0, 1)), "all_reduce", "data", "[6, 4]", "contiguous");
  EXPECT_ERROR(comm.all_reduce(Tensor()), "all_reduce", "undefined");
  EXPECT_ERROR(comm.broadcast(t, 1), "broadcast", "root 1");
  EXPECT_ERROR(comm.reduce_scatter(t, test::random_normal({5})), "reduce_scatter", "24", "5");
  EXPECT_ERROR(comm.all_gather(t, t.to(DType::f64)), "all_gather", "f32", "f64");
  StubCommunicator gpu(Device::cuda(0));
  EXPECT_ERROR(gpu.all_reduce(t), "all_reduce", "cpu", "cuda:0");
}

}  // namespace
}  // namespace accrue::dist
