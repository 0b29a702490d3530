// RUN: pagedc-opt %s --convert-flex-to-cpu --pagedc-lower-cpu-to-llvm | FileCheck %s --enable-var-scope

// The whole CPU pipeline ends in the LLVM dialect only. tanh (and
// tanh_approx) become a polynomial, so row loops can vectorise; tan, which
// has no LLVM intrinsic, becomes a libm call the JIT resolves in-process.
flex.param @softcap : f32 = 3.000000e+01 : f32
flex.mod score @capped(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %cap = flex.param_ref @softcap : f32
  %0 = arith.divf %s, %cap : f32
  %1 = flex.tanh_approx %0 : f32
  %2 = arith.mulf %cap, %1 : f32
  %3 = math.tan %2 : f32
  flex.yield %3 : f32
}
// CHECK-DAG: llvm.func @tanf(f32) -> f32
// CHECK-LABEL: llvm.func @score_row_capped(
// CHECK-SAME: %{{.*}}: !llvm.ptr {llvm.noalias}
// CHECK-NOT: math.tanh
// CHECK-NOT: scf.for
// CHECK-NOT: arith.
// CHECK: llvm.call @tanf(%{{.*}}) : (f32) -> f32
// CHECK-NOT: @tanhf
// CHECK: llvm.return
