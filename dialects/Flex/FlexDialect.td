//===- FlexDialect.td - The flex dialect -------------------*- tablegen -*-===//
//
// The `flex` dialect holds FlexAttention-style mods (mask_mod / score_mod)
// after the front end has checked them: the declarations they refer to
// (compile-time constants, runtime params, captured buffers), the mods
// themselves, and the few arithmetic operations PyTorch has that `arith` and
// `math` lack.
//
//===----------------------------------------------------------------------===//

#ifndef PAGEDC_FLEX_DIALECT_TD
#define PAGEDC_FLEX_DIALECT_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/EnumAttr.td"

def Flex_Dialect : Dialect {
  let name = "flex";
  let cppNamespace = "::pagedc::flex";
  let summary = "FlexAttention mask and score mods";
  let description = [{
    A module of `flex` operations is one compiled `.attn` program. Top-level
    symbols declare compile-time constants (`flex.const_decl`), runtime scalar
    params (`flex.param`) and captured tensors (`flex.buffer`); `flex.mod`
    operations hold the mask and score mods. Mod bodies are single blocks of
    `arith`, `math` and `flex` operations ending in `flex.yield`.

    Passes attach analysis results to `flex.mod` operations as discardable
    attributes in the dialect's namespace (`flex.reads`, `flex.buffers`,
    `flex.params`, `flex.diagonal`); the dialect verifies their shape.
  }];
  let dependentDialects = [
    "::mlir::arith::ArithDialect",
    "::mlir::math::MathDialect"
  ];
  let hasOperationAttrVerify = 1;
  let hasConstantMaterializer = 1;
  let extraClassDeclaration = [{
    /// Attribute names written by the dependence analysis on `flex.mod`.
    /// `flex.reads`: array of the index arguments read, a subset of
    /// ["b", "h", "q", "kv"] in that order.
    static constexpr ::llvm::StringLiteral kReadsAttrName = "flex.reads";
    /// `flex.buffers`: array of FlatSymbolRefAttr, the buffers read.
    static constexpr ::llvm::StringLiteral kBuffersAttrName = "flex.buffers";
    /// `flex.params`: array of FlatSymbolRefAttr, the params read.
    static constexpr ::llvm::StringLiteral kParamsAttrName = "flex.params";
    /// `flex.diagonal`: unit; q and kv are read only through (q - kv).
    static constexpr ::llvm::StringLiteral kDiagonalAttrName = "flex.diagonal";
  }];
}

/// The two kinds of mods.
def Flex_ModKind : I32EnumAttr<"ModKind", "kind of a flex.mod", [
    I32EnumAttrCase<"Mask", 0, "mask">,
    I32EnumAttrCase<"Score", 1, "score">
  ]> {
  let cppNamespace = "::pagedc::flex";
}

class Flex_Op<string mnemonic, list<Trait> traits = []>
    : Op<Flex_Dialect, mnemonic, traits>;

#endif // PAGEDC_FLEX_DIALECT_TD
