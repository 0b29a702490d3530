//===- FlexPasses.td - Passes over the flex dialect --------*- tablegen -*-===//
//
// The passes of pagedc's pipeline (compiler/Pipeline.h); each is implemented
// in compiler/Transforms/<Name>.cpp and tested in test/Transforms/<flag>.mlir.
//
//===----------------------------------------------------------------------===//

#ifndef PAGEDC_FLEX_PASSES_TD
#define PAGEDC_FLEX_PASSES_TD

include "mlir/Pass/PassBase.td"

def FlexInlineMods : Pass<"flex-inline-mods", "::mlir::ModuleOp"> {
  let summary = "Inline every flex.call";
  let description = [{
    Replaces each `flex.call` by a copy of the callee's body, callees first,
    so that no calls remain. Call cycles (rejected by the front end) are
    reported as errors instead of being unrolled forever. The mods that were
    called stay in the module.

    Before:

    ```mlir
    flex.mod mask @causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
      %0 = arith.cmpi sge, %q, %kv : i32
      flex.yield %0 : i1
    }
    flex.mod mask @both(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
      %0 = flex.call @causal(%b, %h, %q, %kv) : (i32, i32, i32, i32) -> i1
      flex.yield %0 : i1
    }
    ```

    After, `@both` reads:

    ```mlir
    flex.mod mask @both(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
      %0 = arith.cmpi sge, %q, %kv : i32
      flex.yield %0 : i1
    }
    ```
  }];
}

def FlexSelectMods : Pass<"flex-select-mods", "::mlir::ModuleOp"> {
  let summary = "Keep only the named mods and the declarations they use";
  let description = [{
    Erases every `flex.mod` that is neither named by `mods` nor called
    (transitively) by a named mod, then every constant, param and buffer
    declaration no remaining mod refers to. Naming a mod that does not exist
    is an error. With an empty `mods` list the pass does nothing.

    `-flex-select-mods=mods=causal` on a module with `@causal` and
    `@alibi` (which reads `@slopes`) leaves `@causal` alone and drops
    `@alibi` and `flex.buffer @slopes`.
  }];
  let options = [
    ListOption<"mods", "mods", "std::string", "Names of the mods to keep">
  ];
}

def FlexFoldConstants : Pass<"flex-fold-constants", "::mlir::ModuleOp"> {
  let summary = "Replace constant reads by their values and fold";
  let description = [{
    Replaces every `flex.const_ref` by an `arith.constant` holding the value
    of its `flex.const_decl`, then folds and canonicalizes the `arith`,
    `math` and `flex` operations of each mod, so that e.g.
    `q - kv <= WINDOW` becomes a compare against a constant.

    Before:

    ```mlir
    flex.const_decl @WINDOW = 1024 : i32
    ...
    %w = flex.const_ref @WINDOW : i32
    %two = arith.constant 2 : i32
    %lim = arith.muli %w, %two : i32
    %keep = arith.cmpi sle, %d, %lim : i32
    ```

    After:

    ```mlir
    %c2048_i32 = arith.constant 2048 : i32
    %keep = arith.cmpi sle, %d, %c2048_i32 : i32
    ```
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect"];
}

def FlexDependenceAnalysis
    : Pass<"flex-dependence-analysis", "::mlir::ModuleOp"> {
  let summary = "Record what each mod reads";
  let description = [{
    Attaches to each `flex.mod`:

    - `flex.reads`: the index arguments it reads, a subset of
      `["b", "h", "q", "kv"]`;
    - `flex.buffers` / `flex.params`: the buffers and params it reads
      (through calls too);
    - `flex.diagonal` (unit): both q and kv are read, and only through
      `q - kv`, `kv - q` or a comparison of q with kv, so the mod is a
      function of the diagonal q - kv (causal, sliding window, relative
      bias, ALiBi).

    The analysis is exact after `-flex-inline-mods` and canonicalization
    (run it last). Before inlining it stays correct but conservative: an
    argument passed to a call counts as read and is not diagonal.

    Example result:

    ```mlir
    flex.mod score @alibi(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
        -> f32 attributes {flex.buffers = [@slopes], flex.diagonal,
                           flex.params = [], flex.reads = ["h", "q", "kv"]}
    ```
  }];
}

#endif // PAGEDC_FLEX_PASSES_TD
