//===- FlexOps.td - Operations of the flex dialect ---------*- tablegen -*-===//
//
// Declarations (const_decl, param, buffer), the mod container (mod, yield),
// reads of declarations (const_ref, param_ref, buffer_load), calls between
// mods, and PyTorch arithmetic missing from arith/math.
//
//===----------------------------------------------------------------------===//

#ifndef PAGEDC_FLEX_OPS_TD
#define PAGEDC_FLEX_OPS_TD

include "FlexDialect.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/OpAsmInterface.td"
include "mlir/IR/BuiltinAttributeInterfaces.td"
include "mlir/Interfaces/CallInterfaces.td"
include "mlir/Interfaces/ControlFlowInterfaces.td"
include "mlir/Interfaces/FunctionInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"

/// Scalar types mods compute with.
def Flex_Scalar : AnyTypeOf<[I1, I32, I64, F32]>;
/// Operand types of flex.floordiv and flex.floormod.
def Flex_Numeric : AnyTypeOf<[I32, I64, F32]>;
/// Types of buffer indices.
def Flex_Index : AnyTypeOf<[I32, I64]>;

//===----------------------------------------------------------------------===//
// Declarations
//===----------------------------------------------------------------------===//

def Flex_ConstDeclOp : Flex_Op<"const_decl", [Symbol]> {
  let summary = "a compile-time constant";
  let description = [{
    Declares the compile-time constant `@NAME` with its final value, computed
    by the front end (including `-D NAME=value` overrides). The value is an
    i1, i32, i64 or f32 attribute. `flex.const_ref` reads it; the
    `-flex-fold-constants` pass replaces every read by an `arith.constant`.

    Example:

    ```mlir
    flex.const_decl @WINDOW = 1024 : i32
    flex.const_decl @SCALE = 5.000000e-01 : f32
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, TypedAttrInterface:$value);
  let assemblyFormat = "$sym_name `=` $value attr-dict";
  let hasVerifier = 1;
}

def Flex_ParamOp : Flex_Op<"param", [Symbol]> {
  let summary = "a runtime scalar parameter";
  let description = [{
    Declares the runtime scalar `@NAME` of type i32, f32 or i1, bound at
    launch without recompiling. An optional default value of the same type
    is used when the launch binds none. Params are numbered in declaration
    order for the runtime ABI.

    Example:

    ```mlir
    flex.param @softcap : f32 = 3.000000e+01 : f32
    flex.param @offset : i32
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, TypeAttr:$type,
                       OptionalAttr<TypedAttrInterface>:$default_value);
  let assemblyFormat = "$sym_name `:` $type (`=` $default_value^)? attr-dict";
  let hasVerifier = 1;
}

def Flex_BufferOp : Flex_Op<"buffer", [Symbol]> {
  let summary = "a captured tensor";
  let description = [{
    Declares the captured tensor `@NAME`, bound at launch. The element type
    is one of i32, i64, f32, f16, bf16 or i1 (bool); the rank is 1 to 4.
    Each dimension is a fixed size (an integer), a name (all dimensions with
    the same name must agree at launch) or `?` (any size). In the `dims`
    attribute these are an IntegerAttr, a StringAttr and a UnitAttr.
    Buffers are numbered in declaration order for the runtime ABI.

    Example:

    ```mlir
    flex.buffer @slopes : f32 [H]
    flex.buffer @doc : i32 [B, S]
    flex.buffer @bias : bf16 [128, ?]
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, TypeAttr:$element_type,
                       ArrayAttr:$dims);
  let assemblyFormat =
      "$sym_name `:` $element_type custom<BufferDims>($dims) attr-dict";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The number of dimensions.
    unsigned getRank() { return getDims().size(); }
    /// The type a flex.buffer_load of this buffer produces: f32 for every
    /// float element type, the element type otherwise.
    ::mlir::Type getLoadType();
  }];
}

//===----------------------------------------------------------------------===//
// Mods
//===----------------------------------------------------------------------===//

def Flex_ModOp : Flex_Op<"mod", [
    FunctionOpInterface, IsolatedFromAbove, SingleBlock,
    DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmBlockArgumentNames"]>
  ]> {
  let summary = "a mask mod or a score mod";
  let description = [{
    A mod is a function of the attention indices. A `mask` mod takes
    `(b, h, q, kv)`, all i32, and yields i1 (true keeps the element). A
    `score` mod takes `(s, b, h, q, kv)` with `s: f32`, the scaled q.k logit,
    and yields the new f32 score. The body is one block ending in
    `flex.yield`. Mods may call each other with `flex.call` until
    `-flex-inline-mods` inlines the calls.

    After `-flex-dependence-analysis` a mod carries what it reads:
    `flex.reads` (index arguments), `flex.buffers`, `flex.params`, and the
    unit attribute `flex.diagonal` when q and kv are read only through
    (q - kv).

    Example:

    ```mlir
    flex.mod mask @causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
      %0 = arith.cmpi sge, %q, %kv : i32
      flex.yield %0 : i1
    }
    flex.mod score @relative(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
        -> f32 attributes {flex.reads = ["q", "kv"], flex.diagonal} {
      %0 = arith.subi %q, %kv : i32
      %1 = arith.sitofp %0 : i32 to f32
      %2 = arith.addf %s, %1 : f32
      flex.yield %2 : f32
    }
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, Flex_ModKind:$kind,
                       TypeAttrOf<FunctionType>:$function_type,
                       OptionalAttr<DictArrayAttr>:$arg_attrs,
                       OptionalAttr<DictArrayAttr>:$res_attrs);
  let regions = (region SizedRegion<1>:$body);
  let hasCustomAssemblyFormat = 1;
  let hasVerifier = 1;
  let skipDefaultBuilders = 1;
  let builders = [
    OpBuilder<(ins "::llvm::StringRef":$name, "ModKind":$kind)>
  ];
  let extraClassDeclaration = [{
    /// The signature every mod of `kind` has.
    static ::mlir::FunctionType getSignature(::mlir::MLIRContext *context,
                                             ModKind kind);
    /// The names of the arguments of a mod of `kind`, in order
    /// ("s" first for scores, then "b", "h", "q", "kv").
    static ::llvm::ArrayRef<::llvm::StringRef> getArgNames(ModKind kind);

    bool isMask() { return getKind() == ModKind::Mask; }
    bool isScore() { return getKind() == ModKind::Score; }
    /// The index arguments b, h, q and kv (the last four arguments).
    ::mlir::BlockArgument getB() { return getIndexArg(0); }
    ::mlir::BlockArgument getH() { return getIndexArg(1); }
    ::mlir::BlockArgument getQ() { return getIndexArg(2); }
    ::mlir::BlockArgument getKV() { return getIndexArg(3); }
    /// The score argument of a score mod (null for masks).
    ::mlir::BlockArgument getScoreArg() {
      return isScore() ? getBody().getArgument(0) : ::mlir::BlockArgument();
    }
    /// The index argument `i` of (b, h, q, kv).
    ::mlir::BlockArgument getIndexArg(unsigned i) {
      return getBody().getArgument(getBody().getNumArguments() - 4 + i);
    }
    /// The terminator of the body.
    class YieldOp getYield();

    //===- FunctionOpInterface / CallableOpInterface ----------------------===//
    ::mlir::Region *getCallableRegion() { return &getBody(); }
    ::llvm::ArrayRef<::mlir::Type> getArgumentTypes() {
      return getFunctionType().getInputs();
    }
    ::llvm::ArrayRef<::mlir::Type> getResultTypes() {
      return getFunctionType().getResults();
    }
  }];
}

def Flex_YieldOp : Flex_Op<"yield", [
    Pure, Terminator, ReturnLike, HasParent<"ModOp">
  ]> {
  let summary = "the result of a mod";
  let description = [{
    Ends the body of a `flex.mod` with its result: i1 for masks, f32 for
    scores.

    Example:

    ```mlir
    flex.yield %keep : i1
    ```
  }];
  let arguments = (ins Flex_Scalar:$value);
  let assemblyFormat = "$value attr-dict `:` type($value)";
  let hasVerifier = 1;
}

def Flex_CallOp : Flex_Op<"call", [
    CallOpInterface, DeclareOpInterfaceMethods<SymbolUserOpInterface>
  ]> {
  let summary = "a call of another mod";
  let description = [{
    Calls the mod `@callee` with explicit arguments, which may be any
    expressions of the right types. The callee must be a `flex.mod` whose
    signature matches the operand and result types. A score mod may not call
    a mask mod. `-flex-inline-mods` replaces every call by the callee's body.

    Example:

    ```mlir
    %keep = flex.call @causal(%b, %h, %q, %kv)
        : (i32, i32, i32, i32) -> i1
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$callee,
                       Variadic<Flex_Scalar>:$operands);
  let results = (outs Flex_Scalar:$result);
  let assemblyFormat = [{
    $callee `(` $operands `)` attr-dict `:` functional-type($operands, results)
  }];
  let extraClassDeclaration = [{
    //===- CallOpInterface ------------------------------------------------===//
    ::mlir::CallInterfaceCallable getCallableForCallee() {
      return getCalleeAttr();
    }
    void setCalleeFromCallable(::mlir::CallInterfaceCallable callee) {
      setCalleeAttr(::llvm::cast<::mlir::FlatSymbolRefAttr>(
          callee.get<::mlir::SymbolRefAttr>()));
    }
    ::mlir::Operation::operand_range getArgOperands() { return getOperands(); }
    ::mlir::MutableOperandRange getArgOperandsMutable() {
      return getOperandsMutable();
    }
  }];
}

//===----------------------------------------------------------------------===//
// Reads of declarations
//===----------------------------------------------------------------------===//

def Flex_ConstRefOp : Flex_Op<"const_ref", [
    Pure, DeclareOpInterfaceMethods<SymbolUserOpInterface>
  ]> {
  let summary = "reads a compile-time constant";
  let description = [{
    The value of the `flex.const_decl @NAME`; the result type must be the
    declaration's type. `-flex-fold-constants` replaces it by an
    `arith.constant`.

    Example:

    ```mlir
    %w = flex.const_ref @WINDOW : i32
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$name);
  let results = (outs Flex_Scalar:$result);
  let assemblyFormat = "$name attr-dict `:` type($result)";
}

def Flex_ParamRefOp : Flex_Op<"param_ref", [
    Pure, DeclareOpInterfaceMethods<SymbolUserOpInterface>
  ]> {
  let summary = "reads a runtime param";
  let description = [{
    The launch-time value of the `flex.param @NAME`; the result type must be
    the param's type.

    Example:

    ```mlir
    %cap = flex.param_ref @softcap : f32
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$name);
  let results = (outs Flex_Scalar:$result);
  let assemblyFormat = "$name attr-dict `:` type($result)";
}

def Flex_BufferLoadOp : Flex_Op<"buffer_load", [
    Pure, DeclareOpInterfaceMethods<SymbolUserOpInterface>
  ]> {
  let summary = "reads one element of a captured buffer";
  let description = [{
    Reads `@NAME[i0, ..., iN]`. There is one i32 or i64 index per dimension of
    the buffer. Float buffers (f32, f16, bf16) read as f32, i32 as i32, i64
    as i64 and bool as i1. Indices out of bounds are undefined behaviour, as
    in PyTorch's kernels.

    Example:

    ```mlir
    %slope = flex.buffer_load @slopes[%h] : (i32) -> f32
    %d = flex.buffer_load @doc[%b, %q] : (i32, i32) -> i32
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$buffer,
                       Variadic<Flex_Index>:$indices);
  let results = (outs Flex_Scalar:$result);
  let assemblyFormat = [{
    $buffer `[` $indices `]` attr-dict `:` functional-type($indices, $result)
  }];
}

//===----------------------------------------------------------------------===//
// Arithmetic
//===----------------------------------------------------------------------===//

class Flex_BinaryOp<string mnemonic, list<Trait> traits = []>
    : Flex_Op<mnemonic, !listconcat(traits, [
        NoMemoryEffect, SameOperandsAndResultType])> {
  let arguments = (ins Flex_Numeric:$lhs, Flex_Numeric:$rhs);
  let results = (outs Flex_Numeric:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($result)";
  let hasFolder = 1;
}

def Flex_FloorDivOp : Flex_BinaryOp<"floordiv"> {
  let summary = "floor division with PyTorch semantics (`//`)";
  let description = [{
    The quotient rounded toward negative infinity, on i32, i64 and f32, as
    `torch.floor_divide`: `-7 // 2 == -4`. For f32 the result is the floor
    of the exact quotient computed as PyTorch does (via fmod). Integer
    division by zero is undefined behaviour.

    Example:

    ```mlir
    %row = flex.floordiv %q, %width : i32
    ```
  }];
}

def Flex_FloorModOp : Flex_BinaryOp<"floormod"> {
  let summary = "remainder with PyTorch semantics (`%`)";
  let description = [{
    The remainder of floor division, on i32, i64 and f32: it takes the sign
    of the divisor, as `torch.remainder` and Python's `%` do:
    `-7 % 2 == 1`, `7 % -2 == -1`. Integer remainder by zero is undefined
    behaviour.

    Example:

    ```mlir
    %col = flex.floormod %q, %width : i32
    ```
  }];
}

def Flex_TanhApproxOp : Flex_Op<"tanh_approx", [
    Pure, SameOperandsAndResultType
  ]> {
  let summary = "fast approximate tanh";
  let description = [{
    tanh(x) where a fast hardware approximation is allowed: the CUDA lowering
    uses `tanh.approx.f32`, the CPU lowering an exact tanh. Constant operands
    fold to the exact value.

    Example:

    ```mlir
    %t = flex.tanh_approx %x : f32
    ```
  }];
  let arguments = (ins F32:$operand);
  let results = (outs F32:$result);
  let assemblyFormat = "$operand attr-dict `:` type($result)";
  let hasFolder = 1;
}

#endif // PAGEDC_FLEX_OPS_TD
