// The victim of tests/core/crash_safe_save_test.cpp: saves a checkpoint over
// and over until it is killed. Each save holds "values", 2^21 f32 all equal to
// the step, and "step"; the loop resumes from the step in the file it finds.
//
//   accrue_save_loop <path>
#include <cstdio>
#include <filesystem>

#include "accrue/core/tensor.h"
#include "accrue/core/tensor_io.h"

int main(int argc, char** argv) {
  if (argc != 2 || std::string(argv[1]) == "--help") {
    std::printf("usage: accrue_save_loop <path>  (saves a checkpoint forever; kill it)\n");
    return argc == 2 ? 0 : 2;
  }
  using namespace accrue;
  const std::string path = argv[1];
  double step = 0;
  if (std::filesystem::exists(path)) step = load_safetensors(path).at("step").item();
  for (;;) {
    step += 1;
    save_safetensors(path, {{"values", full({int64_t{1} << 21}, step, DType::f32)},
                            {"step", full({}, step, DType::f64)}});
  }
}
