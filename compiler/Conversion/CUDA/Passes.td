//===- Passes.td - flex -> EmitC for CUDA ------------------*- tablegen -*-===//
//
// The CUDA code-generation pass. Its output is translated to C++ with
// emitc::translateToCpp and placed inside `namespace pagedc_mods` of a kernel
// translation unit (compiler/Target).
//
//===----------------------------------------------------------------------===//

#ifndef PAGEDC_CONVERSION_CUDA_PASSES_TD
#define PAGEDC_CONVERSION_CUDA_PASSES_TD

include "mlir/Pass/PassBase.td"

def ConvertFlexToEmitC : Pass<"convert-flex-to-emitc", "::mlir::ModuleOp"> {
  let summary = "Lower the selected mods to the EmitC hook functions of "
                "templates/Hooks.cuh";
  let description = [{
    Replaces a flex module (after inlining and constant folding) by the EmitC
    form of the kernel hooks: `struct Params` (one field per `flex.param`,
    then per `flex.buffer` a data pointer and its strides, in declaration
    order), `kHasMask` / `kHasScore`, and for the mask mod named by `mask`
    and the score mod named by `score` a row function and an element
    function.

    **Hoisting.** Operations that do not depend (transitively) on `kv`, nor
    on `s` for a score mod, run once per query row in `mask_row` /
    `score_row`; the values the per-element function needs from them become
    fields `r0, r1, ...` of `MaskRow` / `ScoreRow`. Constants and param reads
    are recomputed where used instead. An absent mod gets the neutral hooks
    (`mask` returns true, `score` returns `s`).

    `flex.buffer_load @buf[i, j]` becomes `p.buf[i * p.buf_stride[0] + j *
    p.buf_stride[1]]` in int64, f16/bf16 elements read through
    `pagedc::to_float`; `flex.param_ref @x` becomes `p.x`;
    `flex.floordiv`/`flex.floormod` call the prelude's `flex_floordiv` /
    `flex_floormod` (PyTorch semantics); `flex.tanh_approx` calls
    `pagedc::tanh_approx` (`tanh.approx.f32`). `math` ops call CUDA's
    precise f32 functions (`math.roundeven` is `rintf`); integer
    add/sub/mul are the plain signed C operators.

    Finally C expressions are formed as by `-form-expressions` (one statement
    per value used more than once), except that a cast or unary operator
    feeding another one stays its own statement: MLIR 19's C++ emitter loses
    the parentheses of the inner operand in that case.

    Before (`-convert-flex-to-emitc="score=alibi"`):

    ```mlir
    flex.buffer @slopes : f32 [H]
    flex.mod score @alibi(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
        -> f32 {
      %0 = flex.buffer_load @slopes[%h] : (i32) -> f32
      %1 = arith.subi %kv, %q : i32
      %2 = arith.sitofp %1 : i32 to f32
      %3 = arith.mulf %0, %2 : f32
      %4 = arith.addf %s, %3 : f32
      flex.yield %4 : f32
    }
    ```

    After (as C++):

    ```c++
    struct Params {
      const float* slopes;
      int64_t slopes_stride[1];
    };
    struct ScoreRow {
      float r0; // flex.buffer_load @slopes
    };
    __device__ __forceinline__ ScoreRow score_row(const Params& v1,
        int32_t v2, int32_t v3, int32_t v4) {
      ScoreRow v5 = {};
      v5.r0 = v1.slopes[(int64_t) v3 * v1.slopes_stride[0]];
      return v5;
    }
    __device__ __forceinline__ float score(const Params& v1,
        const ScoreRow& v2, float v3, int32_t v4, int32_t v5, int32_t v6,
        int32_t v7) {
      return v3 + v2.r0 * (float) (v7 - v6);
    }
    ```
  }];
  let options = [
    Option<"maskName", "mask", "std::string", /*default=*/"",
           "The mask mod to lower (empty: none)">,
    Option<"scoreName", "score", "std::string", /*default=*/"",
           "The score mod to lower (empty: none)">
  ];
  let dependentDialects = ["::mlir::emitc::EmitCDialect"];
}

#endif // PAGEDC_CONVERSION_CUDA_PASSES_TD
