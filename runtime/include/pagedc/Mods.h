//===- Mods.h - Compiled mods as the runtime sees them ---------*- C++ -*-===//
//
// CompiledMods is the contract between the compiler and the runtime. The
// compiler fills it (CPU JIT functions, a float64 reference evaluator, the
// declarations of buffers and params, the dependence analysis result); the
// runtime only reads it. Tests may fill it by hand with ordinary C++
// functions, which keeps the runtime free of any LLVM dependency.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_MODS_H
#define PAGEDC_MODS_H

#include "pagedc/ModABI.h"
#include "pagedc/Tensor.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace pagedc {

/// Types of runtime params.
enum class ScalarKind : uint8_t { I32, F32, Bool };

/// "i32", "f32" or "bool", as the language spells them.
const char *scalarKindName(ScalarKind kind);

/// A param value as given at launch.
struct ParamValue {
  ScalarKind kind = ScalarKind::F32;
  int32_t i32 = 0;
  float f32 = 0.0f;
  bool boolean = false;
  static ParamValue ofI32(int32_t v) { ParamValue p; p.kind = ScalarKind::I32; p.i32 = v; return p; }
  static ParamValue ofF32(float v) { ParamValue p; p.kind = ScalarKind::F32; p.f32 = v; return p; }
  static ParamValue ofBool(bool v) { ParamValue p; p.kind = ScalarKind::Bool; p.boolean = v; return p; }
};

/// A dimension of a declared buffer: `128`, `S` (all dims named S must agree
/// at launch) or `?` (any size).
struct BufferDim {
  enum Kind : uint8_t { Fixed, Named, Any };
  Kind kind = Any;
  int64_t size = 0;  // Fixed
  std::string name;  // Named
};

/// `buffer NAME: ELEM[d0, ...]`
struct BufferDecl {
  std::string name;
  DType elementType = DType::F32;
  std::vector<BufferDim> dims;
};

/// `param NAME: TYPE (= default)?`
struct ParamDecl {
  std::string name;
  ScalarKind type = ScalarKind::F32;
  std::optional<ParamValue> defaultValue;
};

/// What a mod reads, from the compiler's dependence analysis.
struct ModDependence {
  bool b = true, h = true, q = true, kv = true;
  /// The mod reads q and kv only through (q - kv): block classification then
  /// depends on the block diagonal alone.
  bool diagonal = false;
  std::vector<std::string> buffers;
  std::vector<std::string> params;
};

class KernelBundle;

/// Where the CUDA backend (CudaAttention.h) gets the kernels of a mod
/// selection: a bundle of precompiled modules (no compiler or NVRTC needed)
/// or the generated hook code (templates/Hooks.cuh) that the kernel cache
/// compiles with NVRTC. The bundle wins when both are set. The Params layout
/// is ParamsLayout::forDeclarations(params, buffers).
struct CudaModsSource {
  /// Generated mod code for assembleKernel(); empty when none.
  std::string modCode;
  /// Precompiled kernels and the label of this selection's modules in it.
  std::shared_ptr<const KernelBundle> bundle;
  std::string bundleLabel;

  bool empty() const { return modCode.empty() && !bundle; }
};

/// The mods of one compiled program, selected for one attention call: at most
/// one mask mod and at most one score mod. Copyable; `owner` keeps whatever
/// backs the function pointers (a JIT, a shared object) alive.
struct CompiledMods {
  std::string maskName;  // empty: no mask mod
  std::string scoreName; // empty: no score mod
  std::vector<BufferDecl> buffers;
  std::vector<ParamDecl> params;

  // CPU, f32 numerics (the same as the CUDA kernels).
  PagedcMaskRowFn maskRow = nullptr;
  PagedcScoreRowFn scoreRow = nullptr;
  PagedcBlockClassFn maskBlockClass = nullptr; // optional
  ModDependence maskDependence;
  ModDependence scoreDependence;

  // Float64 reference evaluation (every intermediate in double).
  std::function<bool(const PagedcModContext &, int32_t b, int32_t h, int32_t q,
                     int32_t kv)>
      maskReference;
  std::function<double(const PagedcModContext &, double score, int32_t b,
                       int32_t h, int32_t q, int32_t kv)>
      scoreReference;

  // CUDA kernels (see CudaModsSource).
  CudaModsSource cuda;

  std::shared_ptr<void> owner;

  bool hasMask() const { return !maskName.empty(); }
  bool hasScore() const { return !scoreName.empty(); }
};

/// Values bound to a program's buffers and params at launch.
struct Bindings {
  std::map<std::string, TensorView> buffers;
  std::map<std::string, ParamValue> params;
};

/// Bindings checked against the declarations and laid out in the ABI's order.
/// Produced by resolveBindings(); the context points into this object.
class ResolvedBindings {
public:
  const PagedcModContext &context() const { return context_; }

private:
  friend ResolvedBindings resolveBindings(const CompiledMods &, const Bindings &,
                                          Device);
  std::vector<PagedcBufferRef> buffers_;
  std::vector<PagedcParamSlot> params_;
  PagedcModContext context_{nullptr, nullptr};

public:
  ResolvedBindings() = default;
  ResolvedBindings(const ResolvedBindings &other) { *this = other; }
  ResolvedBindings &operator=(const ResolvedBindings &other) {
    buffers_ = other.buffers_;
    params_ = other.params_;
    context_ = {buffers_.data(), params_.data()};
    return *this;
  }
};

/// Checks every declared buffer and param against `bindings` (missing names,
/// unknown names, element types, ranks, fixed and named dims, devices) and
/// lays them out for the ABI. Params with defaults may be omitted. Throws
/// pagedc::Error naming the first problem.
ResolvedBindings resolveBindings(const CompiledMods &mods,
                                 const Bindings &bindings, Device device);

} // namespace pagedc

#endif // PAGEDC_MODS_H
