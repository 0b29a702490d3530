//===- ReferenceEvaluator.h - Float64 evaluation of flex mods ---*- C++ -*-===//
//
// An interpreter over a mod's flex/arith/math IR that computes every float in
// double and every integer in int64 (the language's integers, without the
// 32-bit wrap-around of the compiled code). It is independent of the JIT and
// of the CUDA path, and is what the reference attention uses to check them.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_JIT_REFERENCEEVALUATOR_H
#define PAGEDC_JIT_REFERENCEEVALUATOR_H

#include "pagedc/ModABI.h"

#include "Flex/FlexDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace pagedc::jit {

/// One mod translated into a flat instruction list for fast interpretation.
/// Immutable after compile(); evaluation is thread-safe.
class ReferenceMod {
public:
  /// Translates `mod`. Buffers and params are numbered by their position in
  /// `buffers` / `params` (the ABI order the caller binds them in). Fails on
  /// an operation the evaluator does not know, naming it and its location.
  static llvm::Expected<std::shared_ptr<const ReferenceMod>>
  compile(flex::ModOp mod, llvm::ArrayRef<flex::BufferOp> buffers,
          llvm::ArrayRef<flex::ParamOp> params);

  /// mask(b, h, q, kv); the mod must be a mask mod.
  bool evaluateMask(const PagedcModContext &context, int32_t b, int32_t h,
                    int32_t q, int32_t kv) const;
  /// score(s, b, h, q, kv); the mod must be a score mod.
  double evaluateScore(const PagedcModContext &context, double score,
                       int32_t b, int32_t h, int32_t q, int32_t kv) const;

  struct Instruction;
  ~ReferenceMod();

private:
  ReferenceMod() = default;
  union Slot {
    double real;
    int64_t integer;
  };
  Slot run(const PagedcModContext &context, double score, int32_t b, int32_t h,
           int32_t q, int32_t kv) const;

  std::vector<Instruction> instructions_;
  unsigned slotCount_ = 0;
  bool isScore_ = false;
  unsigned resultSlot_ = 0;
};

} // namespace pagedc::jit

#endif // PAGEDC_JIT_REFERENCEEVALUATOR_H
