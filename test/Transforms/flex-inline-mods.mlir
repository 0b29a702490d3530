// -flex-inline-mods replaces every flex.call by the callee's body.
// RUN: pagedc-opt %s -split-input-file -flex-inline-mods | FileCheck %s --enable-var-scope
// RUN: pagedc-opt %s -split-input-file -flex-inline-mods -mlir-print-debuginfo -mlir-print-local-scope | FileCheck %s --check-prefix=LOC

// A call of a mask by another mask: the callee's compare replaces the call.
// CHECK-LABEL: flex.mod mask @sliding
// CHECK-NOT:     flex.call
// CHECK:         %[[CAUSAL:.+]] = arith.cmpi sge, %q, %kv : i32
// CHECK:         %[[D:.+]] = arith.subi %q, %kv : i32
// CHECK:         %[[NEAR:.+]] = arith.cmpi sle, %[[D]], %{{.+}} : i32
// CHECK:         %[[R:.+]] = arith.andi %[[CAUSAL]], %[[NEAR]] : i1
// CHECK:         flex.yield %[[R]] : i1
// The callee stays: it may be selected on its own.
// CHECK-LABEL: flex.mod mask @causal
flex.mod mask @sliding(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %c = flex.call @causal(%b, %h, %q, %kv) : (i32, i32, i32, i32) -> i1
  %d = arith.subi %q, %kv : i32
  %w = arith.constant 256 : i32
  %n = arith.cmpi sle, %d, %w : i32
  %r = arith.andi %c, %n : i1
  flex.yield %r : i1
}
flex.mod mask @causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %0 = arith.cmpi sge, %q, %kv : i32
  flex.yield %0 : i1
}

// -----

// Arguments are arbitrary expressions and substitute the callee's
// parameters; chains of calls are inlined callee-first, so nothing remains.
// CHECK-LABEL: flex.mod mask @outer
// CHECK-NOT:     flex.call
// CHECK:         %[[OFF:.+]] = flex.buffer_load @off[%q] : (i32) -> i32
// CHECK:         %[[Q2:.+]] = arith.subi %q, %[[OFF]] : i32
// CHECK:         arith.cmpi sge, %[[Q2]], %kv : i32
// CHECK-LABEL: flex.mod mask @middle
// CHECK-NOT:     flex.call
// CHECK:         arith.cmpi sge, %q, %kv : i32
flex.buffer @off : i32 [S]
flex.mod mask @outer(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %o = flex.buffer_load @off[%q] : (i32) -> i32
  %q2 = arith.subi %q, %o : i32
  %r = flex.call @middle(%b, %h, %q2, %kv) : (i32, i32, i32, i32) -> i1
  flex.yield %r : i1
}
flex.mod mask @middle(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %r = flex.call @leaf(%b, %h, %q, %kv) : (i32, i32, i32, i32) -> i1
  flex.yield %r : i1
}
flex.mod mask @leaf(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %0 = arith.cmpi sge, %q, %kv : i32
  flex.yield %0 : i1
}

// -----

// A score calling a score twice gets two copies; a callee that yields its
// argument directly leaves no operation behind.
// CHECK-LABEL: flex.mod score @twice
// CHECK-NOT:     flex.call
// CHECK:         %[[A:.+]] = arith.mulf %s, %s : f32
// CHECK:         %[[B:.+]] = arith.mulf %[[A]], %[[A]] : f32
// CHECK:         flex.yield %[[B]] : f32
flex.mod score @twice(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %a = flex.call @square(%s, %b, %h, %q, %kv) : (f32, i32, i32, i32, i32) -> f32
  %x = flex.call @square(%a, %b, %h, %q, %kv) : (f32, i32, i32, i32, i32) -> f32
  %y = flex.call @identity(%x, %b, %h, %q, %kv) : (f32, i32, i32, i32, i32) -> f32
  flex.yield %y : f32
}
flex.mod score @square(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %0 = arith.mulf %s, %s : f32
  flex.yield %0 : f32
}
flex.mod score @identity(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  flex.yield %s : f32
}

// -----

// Negative: a module without calls is left exactly as it was.
// CHECK-LABEL: flex.mod mask @plain
// CHECK-NEXT:    %[[R:.+]] = arith.cmpi sle, %q, %kv : i32
// CHECK-NEXT:    flex.yield %[[R]] : i1
// CHECK-NEXT:  }
flex.mod mask @plain(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %0 = arith.cmpi sle, %q, %kv : i32
  flex.yield %0 : i1
}

// -----

// Inlined operations point at both the callee's source and the call site.
// LOC-LABEL: flex.mod mask @caller
// LOC:         arith.cmpi sge, %q, %kv : i32 loc(callsite("inner.attn":2:3 at "outer.attn":7:9))
flex.mod mask @caller(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %r = flex.call @callee(%b, %h, %q, %kv) : (i32, i32, i32, i32) -> i1 loc("outer.attn":7:9)
  flex.yield %r : i1
}
flex.mod mask @callee(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %0 = arith.cmpi sge, %q, %kv : i32 loc("inner.attn":2:3)
  flex.yield %0 : i1
}
