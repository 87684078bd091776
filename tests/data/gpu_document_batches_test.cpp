// Document batches on the GPU: with a CUDA device the batch's tensors are
// uploaded and hold the CPU batch's values, and a packed or padded batch
// through a float32 nn::Llama on the GPU gives the float64 CPU loss.
#include <unistd.h>

#include <filesystem>
#include <random>

#include "accrue/autograd/ops.h"
#include "accrue/core/grad_mode.h"
#include "accrue/data/document_batches.h"
#include "accrue/data/token_shards.h"
#include "accrue/nn/llama.h"
#include "tests/test_util.h"

namespace accrue::data {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kVocab = 50, kEos = 49;

std::vector<int64_t> ints(const Tensor& t) {
  return t.to(Device::cpu()).to(DType::i64).contiguous().to_vector<int64_t>();
}

// One shard of random documents of 1 .. 12 tokens, each ended by the EOS.
std::string write_shard(const std::string& name) {
  const fs::path path = fs::temp_directory_path() / (name + std::to_string(::getpid()) + ".bin");
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> len(1, 12), tok(0, kVocab - 2);
  std::vector<uint16_t> tokens;
  while (tokens.size() < 600) {
    for (int n = len(rng); n > 0; --n)
      tokens.push_back(static_cast<uint16_t>(tok(rng)));
    tokens.push_back(kEos);
  }
  write_token_shard(path.string(), tokens);
  return path.string();
}

TEST(GpuDocumentBatches, device_batches_equal_cpu_batches_and_llama_losses_match) {
  ACCRUE_REQUIRE_CUDA();
  const std::string file = write_shard("accrue_gpu_document_batches_");
  for (DocumentLayout layout : {DocumentLayout::packed, DocumentLayout::padded}) {
    SCOPED_TRACE(layout == DocumentLayout::packed ? "packed" : "padded");
    const auto opts =
        DocumentOptions().batch(3).seq_len(20).eos_id(kEos).vocab_size(kVocab).layout(layout);
    DocumentBatches cpu({file}, opts), gpu({file}, DocumentOptions(opts).device(Device::cuda(0)));
    nn::LlamaConfig c = nn::LlamaConfig::llama_tiny();
    c.vocab_size = kVocab;
    Generator gen(4);
    nn::Llama ref(c, nn::ParamOptions{Device::cpu(), DType::f64, &gen});
    // Built on the GPU in float32 and given the reference's weights (cast on load).
    nn::Llama model(c, nn::ParamOptions{Device::cuda(0), DType::f32, &gen});
    model.load_state_dict(ref.state_dict());
    NoGradGuard no_grad;
    for (int step = 0; step < 3; ++step) {
      const DocumentBatch a = cpu.next_batch(), b = gpu.next_batch();
      for (const auto& [x, y] :
           {std::pair{&a.inputs, &b.inputs}, std::pair{&a.targets, &b.targets},
            std::pair{&a.cu_seqlens, &b.cu_seqlens}, std::pair{&a.positions, &b.positions},
            std::pair{&a.seq_lens, &b.seq_lens}}) {
        ASSERT_EQ(x->defined(), y->defined());
        if (!x->defined()) continue;
        EXPECT_EQ(y->device(), Device::cuda(0));
        EXPECT_EQ(ints(*x), ints(*y));
      }
      EXPECT_EQ(a.target_tokens, b.target_tokens);
      const auto lay = [&](const DocumentBatch& d) {
        return layout == DocumentLayout::packed ? nn::BatchLayout::packed(d.cu_seqlens, d.positions)
                                                : nn::BatchLayout::padded(d.seq_lens);
      };
      const Loss want = ref.loss(a.inputs, a.targets, lay(a));
      const Loss got = model.loss(b.inputs, b.targets, lay(b));
      EXPECT_EQ(got.count.to(Device::cpu()).item(), want.count.item());
      EXPECT_LE(std::fabs(got.sum.to(Device::cpu()).item() - want.sum.item()),
                1e-5 * std::fabs(want.sum.item()))
          << "step " << step;
    }
  }
  fs::remove(file);
}

}  // namespace
}  // namespace accrue::data
