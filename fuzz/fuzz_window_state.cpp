// libFuzzer target: the optimizer half of a trainer checkpoint, the optim.*
// tensors that optim::Window::load_state_dict takes back (Note [Mid-window
// checkpoints] in optim/window.h), read by load_safetensors from arbitrary
// bytes. A state a Window refuses must throw accrue::Error and leave it
// usable; a state it accepts must run: the window finishes (from the loaded
// micro-step) and closes without an error, and what it then saves loads into
// a fresh Window as the same state. Needs the whole CPU library, so it is
// built only on request (tools/fuzz.sh --targets window_state), never in the
// smoke run.
//
// ACCRUE_FUZZ_WRITE_SEEDS=DIR writes the seeds (a state between windows, one
// at micro-step 2 of 4) into DIR and exits.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "accrue.h"
#include "fuzz/fuzz_util.h"

namespace {

using namespace accrue;

// One small run: an MLP 4 -> 3 under AdamW, K = 4.
struct Run {
  Generator gen{1};
  nn::MLP model{{4, 3}, {Device::cpu(), DType::f32, &gen}};
  optim::Optimizer opt{optim::AdamWOptions(1e-3)};
  optim::ParamStore arena{model.named_parameters(), optim::ParamStoreOptions()};
  optim::Window window{arena, opt, optim::WindowOptions().micro_steps(4)};

  void micro_step() {
    const Tensor x = from_vector<float>({0.5f, -1, 2, 0.25f, 1, 1, -0.5f, 0}, {2, 4});
    const Tensor y = from_vector<int64_t>({0, 2}, {2});
    window.backward(cross_entropy(model.forward(x), y));
  }
};

bool same_state(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [key, t] : a) {
    auto it = b.find(key);
    if (it == b.end() || !fuzz::same_tensor(t.contiguous(), it->second.contiguous())) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("ACCRUE_FUZZ_WRITE_SEEDS");
  if (dir == nullptr) return 0;
  Run run;
  run.micro_step();
  run.micro_step();
  run.micro_step();
  run.micro_step();
  run.window.close();
  save_safetensors(std::string(dir) + "/between_windows", run.window.state_dict());
  run.micro_step();
  run.micro_step();
  save_safetensors(std::string(dir) + "/micro_step_2_of_4", run.window.state_dict());
  std::exit(0);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fuzz::ScratchFile& file = fuzz::write_input("safetensors", data, size);
  std::map<std::string, Tensor> state;
  try {
    state = load_safetensors(file.path());
  } catch (const Error&) {
    return 0;  // the safetensors target covers these
  }
  Run run;
  try {
    run.window.load_state_dict(state);
  } catch (const Error&) {
    // Refused: the window must still run from where it was.
    fuzz::require(run.window.micro_step() == 0 && run.window.windows_closed() == 0,
                  "a refused state changed the window");
    return 0;
  }
  // Accepted: it must run to its close, and what it saves must load again.
  try {
    while (!run.window.ready())
      run.micro_step();
    run.window.close();
    (void)run.window.report();
  } catch (const Error& e) {
    std::fprintf(stderr, "after load_state_dict: %s\n", e.what());
    fuzz::require(false, "an accepted window state cannot run a window");
  }
  const std::map<std::string, Tensor> saved = run.window.state_dict();
  Run again;
  again.window.load_state_dict(saved);
  fuzz::require(same_state(again.window.state_dict(), saved),
                "a window state changed in a save and load");
  return 0;
}
