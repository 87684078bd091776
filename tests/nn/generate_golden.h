// The greedy-generation goldens (fixtures/generate_golden.txt, made by
// fixtures/make_generate_fixtures.py with transformers): one case per tiny
// model directory, read by the CPU and GPU generation tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace accrue::test {

inline std::string fixture(const std::string& name) {
  return std::string(ACCRUE_NN_FIXTURES) + "/" + name;
}

struct GoldenCase {
  std::string name, dir;
  int64_t new_tokens = 0;
  std::vector<int64_t> prompt, tokens;
  std::vector<double> first_logits;
  double gap = 0;
  // generate's tokens with the config's eos ids set.
  std::vector<int64_t> eos_ids, stopped;
};

inline std::vector<GoldenCase> read_goldens() {
  std::ifstream in(fixture("generate_golden.txt"));
  EXPECT_TRUE(in.good()) << "cannot open " << fixture("generate_golden.txt");
  std::vector<GoldenCase> cases;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream s(line);
    std::string kind;
    s >> kind;
    if (kind == "case") {
      cases.emplace_back();
      GoldenCase& c = cases.back();
      s >> c.name >> c.dir >> c.new_tokens;
      for (int64_t id; s >> id;)
        c.prompt.push_back(id);
    } else if (kind == "tokens") {
      for (int64_t id; s >> id;)
        cases.back().tokens.push_back(id);
    } else if (kind == "logits") {
      int64_t n = 0;
      s >> n;
      for (std::string v; s >> v;)
        cases.back().first_logits.push_back(std::stod(v));
      EXPECT_EQ(static_cast<int64_t>(cases.back().first_logits.size()), n);
    } else if (kind == "gap") {
      s >> cases.back().gap;
    } else if (kind == "stop") {
      int64_t k = 0;
      s >> k;
      for (int64_t i = 0, id; i < k && s >> id; ++i)
        cases.back().eos_ids.push_back(id);
      for (int64_t id; s >> id;)
        cases.back().stopped.push_back(id);
    }
  }
  return cases;
}

}  // namespace accrue::test
