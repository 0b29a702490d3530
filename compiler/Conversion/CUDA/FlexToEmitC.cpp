//===- FlexToEmitC.cpp - Selected mods to the EmitC kernel hooks ----------===//
//
// -convert-flex-to-emitc: builds `struct Params`, the row and column structs
// and the hook functions of templates/Hooks.cuh from the selected mods,
// splitting each mod body into its kv-independent part (once per query row)
// and its per-element part, and a mask's per-element part again into what
// depends on kv alone (once per key) and the rest, then converts the arith /
// math / flex ops inside to EmitC.
//
//===----------------------------------------------------------------------===//

#include "Conversion/CUDA/FlexToEmitC.h"

#include "Flex/FlexDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/EmitC/IR/EmitC.h"
#include "mlir/Dialect/EmitC/Transforms/Transforms.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/DialectConversion.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/raw_ostream.h"

namespace pagedc {
#define GEN_PASS_DEF_CONVERTFLEXTOEMITC
#include "Conversion/CUDA/Passes.h.inc"
} // namespace pagedc

using namespace mlir;
using namespace pagedc;

namespace {

//===----------------------------------------------------------------------===//
// struct Params
//===----------------------------------------------------------------------===//

/// Where a buffer lives in struct Params.
struct BufferField {
  std::string dataName;
  std::string strideName;
  std::string sizeName;
  Type elementType;
  unsigned rank = 0;
};

/// The fields of struct Params, by declaration name, and its C++ text.
struct ParamsStruct {
  llvm::StringMap<std::string> params;
  llvm::StringMap<BufferField> buffers;
  std::string text;
};

/// C++ spelling of a scalar or buffer element type in the generated code.
std::optional<StringRef> cppTypeName(Type type) {
  if (type.isInteger(1))
    return StringRef("bool");
  if (type.isInteger(32))
    return StringRef("int32_t");
  if (type.isInteger(64))
    return StringRef("int64_t");
  if (type.isF32())
    return StringRef("float");
  if (type.isF16())
    return StringRef("pagedc_f16");
  if (type.isBF16())
    return StringRef("pagedc_bf16");
  return std::nullopt;
}

/// The EmitC type of a buffer element in memory: builtin scalars stay, the
/// 16-bit floats are the prelude's storage structs.
Type emitcElementType(Type type) {
  if (type.isF16() || type.isBF16())
    return emitc::OpaqueType::get(type.getContext(), *cppTypeName(type));
  return type;
}

/// Names a declaration may not use verbatim as a C++ field name.
bool isReservedCppName(StringRef name) {
  static const llvm::StringSet<> reserved = {
      "alignas",   "alignof",  "and",      "asm",       "auto",    "bool",
      "break",     "case",     "catch",    "char",      "class",   "const",
      "constexpr", "continue", "default",  "delete",    "do",      "double",
      "else",      "enum",     "explicit", "export",    "extern",  "false",
      "float",     "for",      "friend",   "goto",      "if",      "inline",
      "int",       "long",     "mutable",  "namespace", "new",     "noexcept",
      "not",       "nullptr",  "operator", "or",        "private", "protected",
      "public",    "register", "return",   "short",     "signed",  "sizeof",
      "static",    "struct",   "switch",   "template",  "this",    "throw",
      "true",      "try",      "typedef",  "typename",  "union",   "unsigned",
      "using",     "virtual",  "void",     "volatile",  "while",   "xor",
      "int8_t",    "int16_t",  "int32_t",  "int64_t",   "uint8_t", "uint16_t",
      "uint32_t",  "uint64_t", "size_t",   "INFINITY",  "NAN"};
  return reserved.contains(name) || name.starts_with("__");
}

/// Lays out struct Params from the declarations of `module`: params first,
/// then buffers, each in declaration order (the rule of templates/Hooks.cuh,
/// which pagedc::ParamsLayout follows on the host).
FailureOr<ParamsStruct> buildParamsStruct(ModuleOp module) {
  ParamsStruct result;
  llvm::StringSet<> used;
  auto fieldName = [&](StringRef wanted) {
    std::string name = wanted.str();
    if (isReservedCppName(name))
      name += "_";
    while (used.contains(name))
      name += "_";
    used.insert(name);
    return name;
  };

  llvm::raw_string_ostream os(result.text);
  os << "struct Params {";
  bool empty = true;
  for (auto param : module.getOps<flex::ParamOp>()) {
    std::optional<StringRef> type = cppTypeName(param.getType());
    if (!type || param.getType().isF16() || param.getType().isBF16())
      return param.emitOpError("has a type the CUDA lowering cannot pass");
    std::string name = fieldName(param.getSymName());
    os << "\n  " << *type << " " << name << ";";
    result.params[param.getSymName()] = name;
    empty = false;
  }
  for (auto buffer : module.getOps<flex::BufferOp>()) {
    std::optional<StringRef> type = cppTypeName(buffer.getElementType());
    if (!type)
      return buffer.emitOpError("has an element type the CUDA lowering "
                                "cannot read");
    BufferField field;
    field.dataName = fieldName(buffer.getSymName());
    field.strideName = fieldName((buffer.getSymName() + "_stride").str());
    field.sizeName = fieldName((buffer.getSymName() + "_size").str());
    field.elementType = buffer.getElementType();
    field.rank = buffer.getRank();
    os << "\n  const " << *type << "* " << field.dataName << ";";
    os << "\n  int64_t " << field.strideName << "[" << field.rank << "];";
    os << "\n  int64_t " << field.sizeName << "[" << field.rank << "];";
    result.buffers[buffer.getSymName()] = std::move(field);
    empty = false;
  }
  os << (empty ? "};" : "\n};");
  return result;
}

//===----------------------------------------------------------------------===//
// Hoisting
//===----------------------------------------------------------------------===//

/// Constants and param reads cost nothing to recompute per element: they are
/// cloned where needed instead of travelling in the row struct.
bool isRematerializable(Operation *op) {
  return op && isa<arith::ConstantOp, flex::ParamRefOp>(op);
}

/// The operations of `mod` whose value depends on params and constants only
/// (e.g. `1 / softcap` after rewriteRowInvariantDivisions): like constants,
/// they are cloned into the element function rather than held per query row,
/// and the CUDA compiler computes them once per CTA (the params are
/// __grid_constant__ and the arithmetic is pure, so the loop over keys does
/// not repeat them). One forward pass: no recursion over long chains.
DenseSet<Operation *> paramOnlyOps(flex::ModOp mod) {
  DenseSet<Operation *> result;
  for (Operation &op : mod.getBody().front().without_terminator()) {
    if (isRematerializable(&op)) {
      result.insert(&op);
      continue;
    }
    if (op.getNumResults() != 1 || op.getNumRegions() != 0 ||
        op.getDialect()->getNamespace() != "arith" || !isMemoryEffectFree(&op))
      continue;
    if (llvm::all_of(op.getOperands(), [&](Value v) {
          return result.contains(v.getDefiningOp());
        }))
      result.insert(&op);
  }
  return result;
}

/// The split of a mod body into the part that runs once per query row and
/// the part that runs per element.
struct HoistingPlan {
  /// Operations that depend on kv (or s), in body order.
  llvm::SetVector<Operation *> elementOps;
  /// Row-part values the element part reads: the fields r0, r1, ... of the
  /// row struct, in this order.
  llvm::SetVector<Value> rowFields;
  /// Param-only operations (paramOnlyOps), cloned where used.
  DenseSet<Operation *> cheap;
  /// Element buffer loads some of whose indices do not depend on kv (or s),
  /// e.g. bias[q, kv]: the bounds test and offset of those dimensions are
  /// computed in the row part and travel in the row struct (two fields per
  /// load, after rowFields), so that the element part adds only the kv
  /// terms. (The kernels that recompute the row part per KV tile would
  /// otherwise form the q terms once per element.)
  struct SplitLoad {
    mutable flex::BufferLoadOp op; // (op handles are not const-correct)
    /// The indices the row part takes, by dimension.
    SmallVector<unsigned> rowDims;
  };
  SmallVector<SplitLoad> splitLoads;
  DenseMap<Operation *, unsigned> splitIndex;

  /// The row struct field numbers of split load `i`: bounds test, offset.
  unsigned splitOkField(unsigned i) const { return rowFields.size() + 2 * i; }
  unsigned splitOffsetField(unsigned i) const { return rowFields.size() + 2 * i + 1; }

  /// The column part (mask mods): element operations whose value depends on
  /// kv alone (with params and constants) through a buffer read, e.g.
  /// `document_id[kv]`. A kernel whose thread holds several rows of one key
  /// computes them once per key (mask_col) instead of once per element
  /// (planColumns).
  DenseSet<Operation *> columnOps;
  /// Column-part values the rest of the element part reads: the fields c0,
  /// c1, ... of the column struct, in this order.
  llvm::SetVector<Value> columnFields;
  /// Other element operations that only the column part reads.
  DenseSet<Operation *> columnInputs;
};

/// The arguments that change from one key to the next: kv, and s for a
/// score mod. Everything computed from them is per element.
DenseSet<Value> perKeyArguments(flex::ModOp mod) {
  DenseSet<Value> varying;
  varying.insert(mod.getKV());
  if (mod.isScore())
    varying.insert(mod.getScoreArg());
  return varying;
}

HoistingPlan planHoisting(flex::ModOp mod) {
  HoistingPlan plan;
  DenseSet<Value> varying = perKeyArguments(mod);
  Block &body = mod.getBody().front();
  for (Operation &op : body.without_terminator()) {
    if (llvm::none_of(op.getOperands(),
                      [&](Value v) { return varying.contains(v); }))
      continue;
    plan.elementOps.insert(&op);
    varying.insert(op.result_begin(), op.result_end());
  }
  plan.cheap = paramOnlyOps(mod);
  auto needsField = [&](Value value) {
    return !varying.contains(value) && !isa<BlockArgument>(value) &&
           !plan.cheap.contains(value.getDefiningOp());
  };
  for (Operation *op : plan.elementOps) {
    if (auto load = dyn_cast<flex::BufferLoadOp>(op)) {
      HoistingPlan::SplitLoad split{load, {}};
      for (auto [dim, index] : llvm::enumerate(load.getIndices()))
        if (!varying.contains(index))
          split.rowDims.push_back(dim);
      if (!split.rowDims.empty()) {
        // Its row indices are computed in the row part: no fields for them.
        plan.splitIndex[op] = plan.splitLoads.size();
        plan.splitLoads.push_back(std::move(split));
        continue;
      }
    }
    for (Value operand : op->getOperands())
      if (needsField(operand))
        plan.rowFields.insert(operand);
  }
  Value result = mod.getYield().getValue();
  if (needsField(result))
    plan.rowFields.insert(result);
  return plan;
}

/// Fills the column part of `plan` (HoistingPlan::columnOps): an element
/// operation belongs to it when it is pure or a buffer read, not a split
/// load, reads only kv, param-only values and other such operations, and
/// is a buffer read or reads one. Arithmetic on kv alone (natten's
/// `kv // W`) stays per element: the CUDA compiler computes it once for a
/// thread's rows by itself, where it does not merge the buffer reads (inline
/// PTX), and holding it in MaskCol only lengthened its live range (the
/// 128 x 128 warpgroup tile spilled for natten).
void planColumns(flex::ModOp mod, HoistingPlan &plan) {
  DenseSet<Value> kvOnly;
  kvOnly.insert(mod.getKV());
  DenseSet<Value> readsBuffer;
  for (Operation *op : plan.elementOps) {
    if (op->getNumResults() != 1 || op->getNumRegions() != 0 || plan.splitIndex.count(op) ||
        !(isa<flex::BufferLoadOp>(op) || isMemoryEffectFree(op)))
      continue;
    if (llvm::any_of(op->getOperands(), [&](Value v) {
          return !kvOnly.contains(v) && !plan.cheap.contains(v.getDefiningOp());
        }))
      continue;
    kvOnly.insert(op->getResult(0));
    if (isa<flex::BufferLoadOp>(op) ||
        llvm::any_of(op->getOperands(), [&](Value v) { return readsBuffer.contains(v); })) {
      plan.columnOps.insert(op);
      readsBuffer.insert(op->getResult(0));
    }
  }
  for (Operation *op : plan.elementOps) {
    if (plan.columnOps.contains(op))
      continue;
    for (Value operand : op->getOperands())
      if (plan.columnOps.contains(operand.getDefiningOp()))
        plan.columnFields.insert(operand);
  }
  Value result = mod.getYield().getValue();
  if (plan.columnOps.contains(result.getDefiningOp()))
    plan.columnFields.insert(result);
  // What only the column part reads (a read's index arithmetic) is left out
  // of mask_at as well.
  for (Operation *op : llvm::reverse(plan.elementOps)) {
    if (plan.columnOps.contains(op) || op->getNumResults() != 1 ||
        op->getResult(0) == result || op->getResult(0).use_empty())
      continue;
    if (llvm::all_of(op->getUsers(), [&](Operation *user) {
          return plan.columnOps.contains(user) || plan.columnInputs.contains(user);
        }))
      plan.columnInputs.insert(op);
  }
}

/// `x / y` where y is the same for every key of a query row (it reads
/// neither kv nor s) becomes `x * (1 / y)`: planHoisting then moves the
/// reciprocal into the row struct, so each element pays one multiplication
/// instead of an IEEE division (a dozen instructions and a slow path on the
/// GPU). The product is within 1.5 ulp of the quotient (docs/language.md).
void rewriteRowInvariantDivisions(flex::ModOp mod) {
  DenseSet<Value> varying = perKeyArguments(mod);
  SmallVector<arith::DivFOp> divisions;
  for (Operation &op : mod.getBody().front().without_terminator()) {
    if (llvm::none_of(op.getOperands(),
                      [&](Value v) { return varying.contains(v); }))
      continue;
    varying.insert(op.result_begin(), op.result_end());
    if (auto div = dyn_cast<arith::DivFOp>(op))
      if (div.getType().isF32() && !varying.contains(div.getRhs()))
        divisions.push_back(div);
  }
  for (arith::DivFOp div : divisions) {
    OpBuilder builder(div);
    Location loc = div.getLoc();
    Value one = builder.create<arith::ConstantOp>(
        loc, builder.getF32FloatAttr(1.0f));
    Value reciprocal = builder.create<arith::DivFOp>(loc, one, div.getRhs());
    Value product =
        builder.create<arith::MulFOp>(loc, div.getLhs(), reciprocal);
    div.replaceAllUsesWith(product);
    div.erase();
  }
}

/// A short description of where a row field comes from, for a comment.
std::string describeField(Value value) {
  Operation *op = value.getDefiningOp();
  std::string text = op->getName().getStringRef().str();
  if (auto load = dyn_cast<flex::BufferLoadOp>(op))
    text += " @" + load.getBuffer().str();
  return text;
}

//===----------------------------------------------------------------------===//
// Buffer reads
//===----------------------------------------------------------------------===//

/// The bounds test and offset of a buffer read over some of its dimensions:
/// for each (dimension d, index i),
///   ok_d = flex_index_ok((int64_t) i, p.buf_size[d]);
///   t_d = flex_index_term((int64_t) i, ok_d, p.buf_stride[d]);
/// and returns (ok_d0 && ok_d1 ..., t_d0 + t_d1 ...). `params` is the hook's
/// `const Params&` argument.
std::pair<Value, Value>
emitIndexTerms(OpBuilder &builder, Location loc, Value params, const BufferField &field,
               ArrayRef<std::pair<unsigned, Value>> indices) {
  MLIRContext *context = builder.getContext();
  Type i64 = builder.getI64Type();
  Type i1 = builder.getI1Type();
  auto arrayType = emitc::ArrayType::get({field.rank}, i64);
  Value strides = builder.create<emitc::MemberOp>(loc, arrayType, field.strideName, params);
  Value sizes = builder.create<emitc::MemberOp>(loc, arrayType, field.sizeName, params);
  auto call = [&](Type result, StringRef callee, ValueRange operands) {
    return builder.create<emitc::CallOpaqueOp>(loc, TypeRange{result}, callee, operands)
        .getResult(0);
  };
  Value offset, inBounds;
  for (auto [dim, index] : indices) {
    Value wide = index;
    if (!index.getType().isInteger(64))
      wide = builder.create<emitc::CastOp>(loc, i64, index);
    Value position = builder.create<emitc::LiteralOp>(loc, emitc::SizeTType::get(context),
                                                      std::to_string(dim));
    Value size = builder.create<emitc::SubscriptOp>(loc, i64, sizes, ValueRange{position});
    Value stride = builder.create<emitc::SubscriptOp>(loc, i64, strides, ValueRange{position});
    Value ok = call(i1, "flex_index_ok", {wide, size});
    Value term = call(i64, "flex_index_term", {wide, ok, stride});
    offset = offset ? builder.create<emitc::AddOp>(loc, i64, offset, term).getResult() : term;
    inBounds =
        inBounds ? builder.create<emitc::LogicalAndOp>(loc, i1, inBounds, ok).getResult() : ok;
  }
  return {inBounds, offset};
}

/// flex_load(p.buf, inBounds, offset): the element, widened to float for
/// f16 / bf16.
Value emitBufferRead(OpBuilder &builder, Location loc, Value params, const BufferField &field,
                     Type resultType, Value inBounds, Value offset) {
  Type elementType = emitcElementType(field.elementType);
  Value data = builder.create<emitc::MemberOp>(loc, emitc::PointerType::get(elementType),
                                               field.dataName, params);
  return builder
      .create<emitc::CallOpaqueOp>(loc, TypeRange{resultType}, "flex_load",
                                   ValueRange{data, inBounds, offset})
      .getResult(0);
}

//===----------------------------------------------------------------------===//
// Hook functions
//===----------------------------------------------------------------------===//

/// Names of one kind of hook.
struct HookNames {
  StringRef rowFunction;     // mask_row / score_row
  StringRef rowStruct;       // MaskRow / ScoreRow
  StringRef elementFunction; // mask / score
  /// The column part's hooks (masks only; empty for scores).
  StringRef columnFunction;        // mask_col
  StringRef columnStruct;          // MaskCol
  StringRef columnElementFunction; // mask_at
};

constexpr HookNames kMaskHooks{"mask_row", "MaskRow", "mask", "mask_col", "MaskCol", "mask_at"};
constexpr HookNames kScoreHooks{"score_row", "ScoreRow", "score", "", "", ""};

/// Builds the hook functions of one kind (from `mod`, or the neutral ones
/// when `mod` is null) at the end of `module`.
class HookBuilder {
public:
  HookBuilder(ModuleOp module, const HookNames &names, bool isScore,
              const ParamsStruct &params)
      : context(module.getContext()), builder(module.getContext()),
        names(names), isScore(isScore), params(params) {
    builder.setInsertionPointToEnd(module.getBody());
    paramsType = emitc::OpaqueType::get(context, "const Params&");
    rowType = emitc::OpaqueType::get(context, names.rowStruct);
    rowRefType = emitc::OpaqueType::get(
        context, ("const " + names.rowStruct + "&").str());
  }

  LogicalResult build(flex::ModOp mod, Location loc) {
    HoistingPlan plan;
    if (mod) {
      rewriteRowInvariantDivisions(mod);
      plan = planHoisting(mod);
    }
    if (failed(emitRowStruct(plan, loc)))
      return failure();
    emitRowFunction(mod, plan, loc);
    emitElementFunction(mod, plan, loc, /*columns=*/false);
    if (names.columnStruct.empty())
      return success();
    if (mod)
      planColumns(mod, plan);
    if (failed(emitColumnStruct(plan, loc)))
      return failure();
    emitColumnFunction(mod, plan, loc);
    emitElementFunction(mod, plan, loc, /*columns=*/true);
    return success();
  }

private:
  /// Clones `roots` and what they depend on in `mod` (block arguments
  /// excepted: `mapping` has them), in body order.
  void cloneSlice(flex::ModOp mod, ArrayRef<Operation *> roots, IRMapping &mapping) {
    DenseSet<Operation *> needed;
    SmallVector<Operation *> worklist(roots.begin(), roots.end());
    while (!worklist.empty()) {
      Operation *op = worklist.pop_back_val();
      if (!op || !needed.insert(op).second)
        continue;
      for (Value operand : op->getOperands())
        worklist.push_back(operand.getDefiningOp());
    }
    for (Operation &op : mod.getBody().front().without_terminator())
      if (needed.contains(&op))
        builder.clone(op, mapping);
  }

  emitc::FuncOp createHook(Location loc, StringRef name, ArrayRef<Type> inputs,
                           Type result) {
    auto func = builder.create<emitc::FuncOp>(
        loc, name, builder.getFunctionType(inputs, result));
    func.setSpecifiersAttr(
        builder.getStrArrayAttr({"__device__", "__forceinline__"}));
    func.addEntryBlock();
    return func;
  }

  /// The struct lines of `fields`: `TYPE PREFIXi; // origin`.
  static LogicalResult printFields(llvm::raw_ostream &os, const llvm::SetVector<Value> &fields,
                                   StringRef prefix, StringRef structKind) {
    for (auto [index, field] : llvm::enumerate(fields)) {
      std::optional<StringRef> type = cppTypeName(field.getType());
      if (!type)
        return field.getDefiningOp()->emitOpError()
               << "produces a type the CUDA lowering cannot keep in a " << structKind
               << " struct";
      os << "\n  " << *type << " " << prefix << index << "; // " << describeField(field);
    }
    return success();
  }

  LogicalResult emitRowStruct(const HoistingPlan &plan, Location loc) {
    std::string text;
    llvm::raw_string_ostream os(text);
    os << "struct " << names.rowStruct << " {";
    if (failed(printFields(os, plan.rowFields, "r", "row")))
      return failure();
    for (auto [index, split] : llvm::enumerate(plan.splitLoads)) {
      auto field = params.buffers.find(split.op.getBuffer());
      if (field == params.buffers.end())
        return split.op.emitOpError("reads an undeclared buffer");
      if (split.op.getIndices().size() != field->second.rank)
        return split.op.emitOpError("has the wrong number of indices");
      os << "\n  bool r" << plan.splitOkField(index) << "; // flex.buffer_load @"
         << split.op.getBuffer() << ": row indices in bounds";
      os << "\n  int64_t r" << plan.splitOffsetField(index) << "; // flex.buffer_load @"
         << split.op.getBuffer() << ": row indices' offset";
    }
    os << (plan.rowFields.empty() && plan.splitLoads.empty() ? "};" : "\n};");
    builder.create<emitc::VerbatimOp>(loc, text);
    return success();
  }

  /// The column struct: one field per HoistingPlan::columnFields value.
  LogicalResult emitColumnStruct(const HoistingPlan &plan, Location loc) {
    std::string text;
    llvm::raw_string_ostream os(text);
    os << "struct " << names.columnStruct << " {";
    if (failed(printFields(os, plan.columnFields, "c", "column")))
      return failure();
    os << (plan.columnFields.empty() ? "};" : "\n};");
    builder.create<emitc::VerbatimOp>(loc, text);
    return success();
  }

  /// NAME_col(params, kv): the column part, stored into the column struct.
  void emitColumnFunction(flex::ModOp mod, const HoistingPlan &plan, Location loc) {
    emitc::FuncOp func = createHook(loc, names.columnFunction,
                                    {paramsType, builder.getI32Type()}, columnType());
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPointToStart(&func.getBody().front());
    IRMapping mapping;
    if (mod) {
      mapping.map(mod.getKV(), func.getArgument(1));
      // The fields' slice: column and param-only operations.
      SmallVector<Operation *> roots;
      for (Value field : plan.columnFields)
        roots.push_back(field.getDefiningOp());
      cloneSlice(mod, roots, mapping);
    }
    auto column = builder.create<emitc::VariableOp>(
        loc, columnType(), emitc::OpaqueAttr::get(context, "{}"));
    for (auto [index, field] : llvm::enumerate(plan.columnFields)) {
      auto member = builder.create<emitc::MemberOp>(loc, field.getType(),
                                                    ("c" + Twine(index)).str(), column);
      builder.create<emitc::AssignOp>(loc, member, mapping.lookup(field));
    }
    builder.create<emitc::ReturnOp>(loc, column.getResult());
  }

  Type columnType() { return emitc::OpaqueType::get(context, names.columnStruct); }

  /// NAME_row(params, b, h, q): the row part, stored into the row struct.
  void emitRowFunction(flex::ModOp mod, const HoistingPlan &plan,
                       Location loc) {
    Type i32 = builder.getI32Type();
    emitc::FuncOp func = createHook(loc, names.rowFunction,
                                    {paramsType, i32, i32, i32}, rowType);
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPointToStart(&func.getBody().front());
    IRMapping mapping;
    if (mod) {
      mapping.map(mod.getB(), func.getArgument(1));
      mapping.map(mod.getH(), func.getArgument(2));
      mapping.map(mod.getQ(), func.getArgument(3));
      SmallVector<Operation *> roots;
      for (Value field : plan.rowFields)
        roots.push_back(field.getDefiningOp());
      for (const HoistingPlan::SplitLoad &split : plan.splitLoads)
        for (unsigned dim : split.rowDims)
          roots.push_back(split.op.getIndices()[dim].getDefiningOp());
      cloneSlice(mod, roots, mapping);
    }
    auto row = builder.create<emitc::VariableOp>(
        loc, rowType, emitc::OpaqueAttr::get(context, "{}"));
    for (auto [index, field] : llvm::enumerate(plan.rowFields)) {
      auto member = builder.create<emitc::MemberOp>(
          loc, field.getType(), ("r" + Twine(index)).str(), row);
      builder.create<emitc::AssignOp>(loc, member, mapping.lookup(field));
    }
    for (auto [index, split] : llvm::enumerate(plan.splitLoads)) {
      SmallVector<std::pair<unsigned, Value>> indices;
      for (unsigned dim : split.rowDims)
        indices.push_back({dim, mapping.lookup(split.op.getIndices()[dim])});
      auto [inBounds, offset] = emitIndexTerms(builder, split.op.getLoc(), func.getArgument(0),
                                               bufferField(split.op), indices);
      builder.create<emitc::AssignOp>(
          loc, rowMember(loc, builder.getI1Type(), plan.splitOkField(index), row), inBounds);
      builder.create<emitc::AssignOp>(
          loc, rowMember(loc, builder.getI64Type(), plan.splitOffsetField(index), row), offset);
    }
    builder.create<emitc::ReturnOp>(loc, row.getResult());
  }

  /// NAME(params, row, [s,] b, h, q, kv): the per-element part; with
  /// `columns`, NAME_at(params, row, col, b, h, q, kv), which takes the
  /// column part's values from `col` (a mask's only).
  void emitElementFunction(flex::ModOp mod, const HoistingPlan &plan,
                           Location loc, bool columns) {
    Type i32 = builder.getI32Type();
    Type f32 = builder.getF32Type();
    SmallVector<Type> inputs = {paramsType, rowRefType};
    if (columns)
      inputs.push_back(
          emitc::OpaqueType::get(context, ("const " + names.columnStruct + "&").str()));
    if (isScore)
      inputs.push_back(f32);
    inputs.append({i32, i32, i32, i32});
    Type resultType = isScore ? f32 : builder.getI1Type();
    emitc::FuncOp func = createHook(
        loc, columns ? names.columnElementFunction : names.elementFunction, inputs, resultType);
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPointToStart(&func.getBody().front());
    unsigned firstIndex = isScore || columns ? 3 : 2;

    if (!mod) {
      // The neutral hook: keep every element, leave the score as it is.
      Value result =
          isScore ? func.getArgument(2)
                  : builder
                        .create<emitc::LiteralOp>(loc, builder.getI1Type(),
                                                  "true")
                        .getResult();
      builder.create<emitc::ReturnOp>(loc, result);
      return;
    }

    IRMapping mapping;
    if (isScore)
      mapping.map(mod.getScoreArg(), func.getArgument(2));
    for (unsigned i = 0; i < 4; ++i)
      mapping.map(mod.getIndexArg(i), func.getArgument(firstIndex + i));
    for (auto [index, field] : llvm::enumerate(plan.rowFields)) {
      auto member = builder.create<emitc::MemberOp>(loc, field.getType(),
                                                    ("r" + Twine(index)).str(),
                                                    func.getArgument(1));
      mapping.map(field, member.getResult());
    }
    if (columns)
      for (auto [index, field] : llvm::enumerate(plan.columnFields))
        mapping.map(field, builder
                               .create<emitc::MemberOp>(loc, field.getType(),
                                                        ("c" + Twine(index)).str(),
                                                        func.getArgument(2))
                               .getResult());
    // Clones the param-only slice of `value` (iteratively, in body order;
    // sorting the slice rather than scanning the body keeps a mod with many
    // param-only values linear).
    auto materialize = [&](Value value) {
      if (mapping.contains(value))
        return;
      DenseSet<Operation *> seen;
      SmallVector<Operation *> slice;
      SmallVector<Operation *> worklist{value.getDefiningOp()};
      while (!worklist.empty()) {
        Operation *def = worklist.pop_back_val();
        if (!def || mapping.contains(def->getResult(0)) ||
            !seen.insert(def).second)
          continue;
        assert(plan.cheap.contains(def) && "value neither mapped nor cheap");
        slice.push_back(def);
        for (Value operand : def->getOperands())
          worklist.push_back(operand.getDefiningOp());
      }
      llvm::sort(slice, [](Operation *a, Operation *b) {
        return a->isBeforeInBlock(b);
      });
      for (Operation *op : slice)
        builder.clone(*op, mapping);
    };
    for (Operation *op : plan.elementOps) {
      if (columns && (plan.columnOps.contains(op) || plan.columnInputs.contains(op)))
        continue;
      auto split = plan.splitIndex.find(op);
      if (split == plan.splitIndex.end()) {
        for (Value operand : op->getOperands())
          materialize(operand);
        builder.clone(*op, mapping);
        continue;
      }
      // A split load: the row struct's bounds test and offset, and the
      // terms of the other (kv-dependent) indices.
      const HoistingPlan::SplitLoad &load = plan.splitLoads[split->second];
      Location opLoc = op->getLoc();
      Value inBounds = rowMember(opLoc, builder.getI1Type(),
                                 plan.splitOkField(split->second), func.getArgument(1));
      Value offset = rowMember(opLoc, builder.getI64Type(),
                               plan.splitOffsetField(split->second), func.getArgument(1));
      SmallVector<std::pair<unsigned, Value>> indices;
      for (auto [dim, index] : llvm::enumerate(load.op.getIndices())) {
        if (llvm::is_contained(load.rowDims, dim))
          continue;
        materialize(index);
        indices.push_back({static_cast<unsigned>(dim), mapping.lookup(index)});
      }
      auto [elementOk, elementOffset] = emitIndexTerms(
          builder, opLoc, func.getArgument(0), bufferField(load.op), indices);
      inBounds = builder.create<emitc::LogicalAndOp>(opLoc, builder.getI1Type(), inBounds,
                                                     elementOk);
      offset = builder.create<emitc::AddOp>(opLoc, builder.getI64Type(), offset, elementOffset);
      mapping.map(load.op.getResult(),
                  emitBufferRead(builder, opLoc, func.getArgument(0), bufferField(load.op),
                                 load.op.getType(), inBounds, offset));
    }
    Value result = mod.getYield().getValue();
    materialize(result);
    builder.create<emitc::ReturnOp>(loc, mapping.lookup(result));
  }

  /// The row struct field `index` of `row` (a row struct or a reference to
  /// one).
  Value rowMember(Location loc, Type type, unsigned index, Value row) {
    return builder.create<emitc::MemberOp>(loc, type, ("r" + Twine(index)).str(), row);
  }

  const BufferField &bufferField(flex::BufferLoadOp load) const {
    return params.buffers.find(load.getBuffer())->second;
  }

  MLIRContext *context;
  OpBuilder builder;
  const HookNames &names;
  bool isScore;
  const ParamsStruct &params;
  Type paramsType, rowType, rowRefType;
};

//===----------------------------------------------------------------------===//
// flex ops -> EmitC
//===----------------------------------------------------------------------===//

/// The `const Params&` argument of the hook function around `op`.
Value paramsArgument(Operation *op) {
  return op->getParentOfType<emitc::FuncOp>().getArgument(0);
}

/// flex.param_ref @x -> p.x
class ParamRefLowering : public OpConversionPattern<flex::ParamRefOp> {
public:
  ParamRefLowering(const TypeConverter &converter, MLIRContext *context,
                   const ParamsStruct &params)
      : OpConversionPattern(converter, context), params(params) {}

  LogicalResult
  matchAndRewrite(flex::ParamRefOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    auto it = params.params.find(op.getName());
    if (it == params.params.end())
      return rewriter.notifyMatchFailure(op, "undeclared param");
    rewriter.replaceOpWithNewOp<emitc::MemberOp>(op, op.getType(), it->second,
                                                 paramsArgument(op));
    return success();
  }

private:
  const ParamsStruct &params;
};

/// flex.buffer_load @buf[i, j] ->
///   ok0 = flex_index_ok((int64_t) i, p.buf_size[0]);
///   t0 = flex_index_term((int64_t) i, ok0, p.buf_stride[0]);  (same for j)
///   flex_load(p.buf, ok0 && ok1, t0 + t1)
/// An index outside [0, size) of its dimension reads 0 without touching
/// memory (docs/language.md, "Buffer reads"); f16 / bf16 elements are
/// widened to float by flex_load.
class BufferLoadLowering : public OpConversionPattern<flex::BufferLoadOp> {
public:
  BufferLoadLowering(const TypeConverter &converter, MLIRContext *context,
                     const ParamsStruct &params)
      : OpConversionPattern(converter, context), params(params) {}

  LogicalResult
  matchAndRewrite(flex::BufferLoadOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    auto it = params.buffers.find(op.getBuffer());
    if (it == params.buffers.end())
      return rewriter.notifyMatchFailure(op, "undeclared buffer");
    const BufferField &field = it->second;
    if (adaptor.getIndices().size() != field.rank)
      return rewriter.notifyMatchFailure(op, "wrong number of indices");
    Location loc = op.getLoc();
    Value params = paramsArgument(op);
    SmallVector<std::pair<unsigned, Value>> indices;
    for (auto [dim, index] : llvm::enumerate(adaptor.getIndices()))
      indices.push_back({static_cast<unsigned>(dim), index});
    auto [inBounds, offset] = emitIndexTerms(rewriter, loc, params, field, indices);
    rewriter.replaceOp(op, emitBufferRead(rewriter, loc, params, field, op.getType(), inBounds,
                                          offset));
    return success();
  }

private:
  const ParamsStruct &params;
};

/// A flex op that is one call of a prelude helper.
template <typename SourceOp>
class HelperCallLowering : public OpConversionPattern<SourceOp> {
public:
  HelperCallLowering(const TypeConverter &converter, MLIRContext *context,
                     StringRef callee)
      : OpConversionPattern<SourceOp>(converter, context), callee(callee) {}

  LogicalResult
  matchAndRewrite(SourceOp op, typename SourceOp::Adaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    rewriter.replaceOpWithNewOp<emitc::CallOpaqueOp>(
        op, op->getResultTypes(), callee, adaptor.getOperands());
    return success();
  }

private:
  StringRef callee;
};

//===----------------------------------------------------------------------===//
// C expressions
//===----------------------------------------------------------------------===//

/// Casts and unary operators: printed before their operand.
bool isPrefixOperator(Operation *op) {
  return isa<emitc::CastOp, emitc::UnaryMinusOp, emitc::UnaryPlusOp,
             emitc::LogicalNotOp, emitc::BitwiseNotOp>(op);
}

/// EmitC's -form-expressions, with one exception: a prefix operator used by
/// another prefix operator stays its own statement. MLIR 19's C++ emitter
/// drops the parentheses around the operand of the inner one when both sit
/// in one expression: `(float) (int64_t) (a - b)` would print as
/// `(float) ((int64_t) a - b)`, and `~(-(a - b))` as `~(-a - b)`.
LogicalResult formExpressions(Operation *root) {
  OpBuilder builder(root->getContext());
  root->walk([&](Operation *op) {
    if (!op->hasTrait<OpTrait::emitc::CExpression>() ||
        isa<emitc::ExpressionOp>(op->getParentOp()))
      return;
    if (isPrefixOperator(op) && llvm::any_of(op->getUsers(), isPrefixOperator))
      return;
    emitc::createExpression(op, builder);
  });
  RewritePatternSet patterns(root->getContext());
  emitc::populateExpressionPatterns(patterns);
  return applyPatternsAndFoldGreedily(root, std::move(patterns));
}

//===----------------------------------------------------------------------===//
// The pass
//===----------------------------------------------------------------------===//

/// Finds the mod `name` of `kind`; an empty name selects none.
FailureOr<flex::ModOp> findMod(ModuleOp module, StringRef name,
                               flex::ModKind kind) {
  if (name.empty())
    return flex::ModOp();
  auto mod = module.lookupSymbol<flex::ModOp>(name);
  StringRef kindName = kind == flex::ModKind::Mask ? "mask" : "score";
  if (!mod)
    return module.emitError()
           << "no " << kindName << " mod named '" << name << "'";
  if (mod.getKind() != kind)
    return mod.emitError() << "'" << name << "' is not a " << kindName
                           << " mod";
  WalkResult walk = mod.walk([&](Operation *op) {
    if (isa<flex::CallOp>(op)) {
      op->emitError("calls must be inlined (-flex-inline-mods) before "
                    "-convert-flex-to-emitc");
      return WalkResult::interrupt();
    }
    if (op->getNumRegions() != 0 && op != mod.getOperation()) {
      op->emitError("operations with regions are not supported by the CUDA "
                    "lowering");
      return WalkResult::interrupt();
    }
    return WalkResult::advance();
  });
  if (walk.wasInterrupted())
    return failure();
  return mod;
}

class ConvertFlexToEmitCPass
    : public pagedc::impl::ConvertFlexToEmitCBase<ConvertFlexToEmitCPass> {
public:
  using ConvertFlexToEmitCBase::ConvertFlexToEmitCBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    MLIRContext *context = &getContext();
    FailureOr<flex::ModOp> maskMod =
        findMod(module, maskName, flex::ModKind::Mask);
    FailureOr<flex::ModOp> scoreMod =
        findMod(module, scoreName, flex::ModKind::Score);
    FailureOr<ParamsStruct> params = buildParamsStruct(module);
    if (failed(maskMod) || failed(scoreMod) || failed(params))
      return signalPassFailure();

    // Remember what was there; everything flex goes once the hooks exist.
    SmallVector<Operation *> original;
    for (Operation &op : module.getBody()->getOperations())
      original.push_back(&op);

    Location loc = module.getLoc();
    OpBuilder builder = OpBuilder::atBlockEnd(module.getBody());
    builder.create<emitc::VerbatimOp>(loc, params->text);
    builder.create<emitc::VerbatimOp>(
        loc, std::string("constexpr bool kHasMask = ") +
                 (*maskMod ? "true" : "false") + ";");
    builder.create<emitc::VerbatimOp>(
        loc, std::string("constexpr bool kHasScore = ") +
                 (*scoreMod ? "true" : "false") + ";");
    HookBuilder maskHooks(module, kMaskHooks, /*isScore=*/false, *params);
    HookBuilder scoreHooks(module, kScoreHooks, /*isScore=*/true, *params);
    if (failed(maskHooks.build(*maskMod, *maskMod ? maskMod->getLoc() : loc)) ||
        failed(
            scoreHooks.build(*scoreMod, *scoreMod ? scoreMod->getLoc() : loc)))
      return signalPassFailure();

    for (Operation *op : original) {
      if (!isa<flex::FlexDialect>(op->getDialect())) {
        op->emitError("unexpected operation in a flex module");
        return signalPassFailure();
      }
      op->erase();
    }

    TypeConverter typeConverter;
    configureCudaEmitCTypeConverter(typeConverter);
    RewritePatternSet patterns(context);
    populateCudaArithMathToEmitCPatterns(typeConverter, patterns);
    patterns.add<ParamRefLowering, BufferLoadLowering>(typeConverter, context,
                                                       *params);
    patterns.add<HelperCallLowering<flex::FloorDivOp>>(typeConverter, context,
                                                       "flex_floordiv");
    patterns.add<HelperCallLowering<flex::FloorModOp>>(typeConverter, context,
                                                       "flex_floormod");
    patterns.add<HelperCallLowering<flex::TanhApproxOp>>(typeConverter, context,
                                                         "pagedc::tanh_approx");

    ConversionTarget target(*context);
    target.addLegalDialect<emitc::EmitCDialect>();
    target.addLegalOp<ModuleOp>();
    target.addIllegalDialect<arith::ArithDialect, math::MathDialect,
                             flex::FlexDialect>();
    if (failed(applyFullConversion(module, target, std::move(patterns))))
      return signalPassFailure();
    if (failed(formExpressions(module)))
      return signalPassFailure();
  }
};

} // namespace

void pagedc::addCudaLoweringPasses(OpPassManager &pm, StringRef maskName,
                                   StringRef scoreName) {
  ConvertFlexToEmitCOptions options;
  options.maskName = maskName.str();
  options.scoreName = scoreName.str();
  pm.addPass(createConvertFlexToEmitC(options));
}

void pagedc::registerCudaLoweringDialects(DialectRegistry &registry) {
  registry.insert<emitc::EmitCDialect>();
}

llvm::StringRef pagedc::getCudaModPrelude() {
  static const char kPrelude[] =
#include "Conversion/CUDA/Prelude.inc"
      ;
  return llvm::StringRef(kPrelude, sizeof(kPrelude) - 1);
}
