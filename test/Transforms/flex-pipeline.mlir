// -flex-pipeline is buildPipeline() with default options: inline, fold
// constants, canonicalize, CSE, canonicalize, dependence analysis.
// RUN: pagedc-opt %s -flex-pipeline | FileCheck %s --enable-var-scope
// RUN: pagedc-opt %s -flex-pipeline | pagedc-opt -flex-pipeline | FileCheck %s --enable-var-scope

flex.const_decl @WINDOW = 256 : i32
flex.buffer @slopes : f32 [H]

// Inlining @causal twice leaves one compare after CSE, and `c & c` then
// folds to `c`; the constant window
// is folded in and the result is diagonal.
// CHECK-LABEL: flex.mod mask @sliding(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1
// CHECK-SAME:    attributes {flex.buffers = [], flex.diagonal, flex.params = [], flex.reads = ["q", "kv"]}
// CHECK-DAG:     %[[W:.+]] = arith.constant 256 : i32
// CHECK-DAG:     %[[C:.+]] = arith.cmpi sge, %q, %kv : i32
// CHECK-DAG:     %[[D:.+]] = arith.subi %q, %kv : i32
// CHECK:         %[[N:.+]] = arith.cmpi sle, %[[D]], %[[W]] : i32
// CHECK:         %[[R:.+]] = arith.andi %[[C]], %[[N]] : i1
// CHECK-NEXT:    flex.yield %[[R]] : i1
flex.mod mask @sliding(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %c1 = flex.call @causal(%b, %h, %q, %kv) : (i32, i32, i32, i32) -> i1
  %c2 = flex.call @causal(%b, %h, %q, %kv) : (i32, i32, i32, i32) -> i1
  %c = arith.andi %c1, %c2 : i1
  %d = arith.subi %q, %kv : i32
  %w = flex.const_ref @WINDOW : i32
  %n = arith.cmpi sle, %d, %w : i32
  %r = arith.andi %c, %n : i1
  flex.yield %r : i1
}
flex.mod mask @causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %0 = arith.cmpi sge, %q, %kv : i32
  flex.yield %0 : i1
}

// Dead reads disappear before the analysis: the slope is loaded but unused,
// so neither h nor @slopes is read.
// CHECK-LABEL: flex.mod score @relative
// CHECK-SAME:    attributes {flex.buffers = [], flex.diagonal, flex.params = [], flex.reads = ["q", "kv"]}
// CHECK-NOT:     flex.buffer_load
flex.mod score @relative(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %unused = flex.buffer_load @slopes[%h] : (i32) -> f32
  %d = arith.subi %q, %kv : i32
  %df = arith.sitofp %d : i32 to f32
  %0 = arith.addf %s, %df : f32
  flex.yield %0 : f32
}
