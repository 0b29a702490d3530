//===- AttentionCase.h - One CPU attention benchmark shape -------*- C++ -*-===//
//
// The shape both CPU attention benchmarks (bench/cpu, bench/cpu-jit) run,
// its random f32 inputs, and its JSON fields, so the two tools describe a
// case the same way and their result files compare field for field.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_BENCH_COMMON_ATTENTIONCASE_H
#define PAGEDC_BENCH_COMMON_ATTENTIONCASE_H

#include "BenchJson.h"

#include "pagedc/Tensor.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace pagedc::bench {

struct AttentionCase {
  std::string name;
  int64_t batch, qHeads, kvHeads, qLength, kvLength, dim;
  int32_t pageSize;
  bool causal, alibi;
};

/// q [B, Hq, Lq, D], k and v [B, Hkv, Lkv, D]: uniform in [-1, 1), the same
/// values for the same case in every tool.
struct CaseInputs {
  HostTensor q, k, v;
};

inline CaseInputs randomInputs(const AttentionCase &c) {
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  auto random = [&](std::vector<int64_t> shape) {
    HostTensor t(DType::F32, std::move(shape));
    for (int64_t i = 0; i < t.numel(); ++i)
      t.dataAs<float>()[i] = uniform(rng);
    return t;
  };
  CaseInputs inputs{random({c.batch, c.qHeads, c.qLength, c.dim}),
                    random({c.batch, c.kvHeads, c.kvLength, c.dim}),
                    random({c.batch, c.kvHeads, c.kvLength, c.dim})};
  return inputs;
}

/// The case's shape fields; a tool appends its figures after them.
inline Json caseJson(const AttentionCase &c) {
  return {{"name", c.name},         {"batch", c.batch},       {"q_heads", c.qHeads},
          {"kv_heads", c.kvHeads},  {"q_len", c.qLength},     {"kv_len", c.kvLength},
          {"head_dim", c.dim},      {"page_size", c.pageSize}};
}

} // namespace pagedc::bench

#endif // PAGEDC_BENCH_COMMON_ATTENTIONCASE_H
