// -flex-fold-constants replaces flex.const_ref by the declared value and
// folds what that makes constant.
// RUN: pagedc-opt %s -split-input-file -flex-fold-constants | FileCheck %s --enable-var-scope

// `q - kv <= WINDOW` becomes a compare against a constant; WINDOW * 2 folds.
// CHECK-LABEL: flex.mod mask @sliding
// CHECK-NOT:     flex.const_ref
// CHECK-DAG:     %[[W:.+]] = arith.constant 2048 : i32
// CHECK-DAG:     %[[D:.+]] = arith.subi %q, %kv : i32
// CHECK:         %[[R:.+]] = arith.cmpi sle, %[[D]], %[[W]] : i32
// CHECK:         flex.yield %[[R]] : i1
flex.const_decl @WINDOW = 1024 : i32
flex.mod mask @sliding(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %w = flex.const_ref @WINDOW : i32
  %two = arith.constant 2 : i32
  %lim = arith.muli %w, %two : i32
  %d = arith.subi %q, %kv : i32
  %r = arith.cmpi sle, %d, %lim : i32
  flex.yield %r : i1
}

// -----

// Float constants, and flex arithmetic on them, fold too.
// CHECK-LABEL: flex.mod score @scaled
// CHECK-NOT:     flex.const_ref
// CHECK-NOT:     flex.floormod
// CHECK:         %[[C:.+]] = arith.constant 5.000000e-01 : f32
// CHECK:         %[[R:.+]] = arith.mulf %s, %[[C]] : f32
// CHECK:         flex.yield %[[R]] : f32
flex.const_decl @SCALE = -1.5 : f32
flex.mod score @scaled(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %scale = flex.const_ref @SCALE : f32
  %one = arith.constant 1.0 : f32
  %m = flex.floormod %scale, %one : f32
  %r = arith.mulf %s, %m : f32
  flex.yield %r : f32
}

// -----

// A boolean constant that decides a select removes the other branch.
// CHECK-LABEL: flex.mod mask @switch
// CHECK-NEXT:    %[[R:.+]] = arith.cmpi sge, %q, %kv : i32
// CHECK-NEXT:    flex.yield %[[R]] : i1
flex.const_decl @CAUSAL = true
flex.mod mask @switch(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %causal = flex.const_ref @CAUSAL : i1
  %lower = arith.cmpi sge, %q, %kv : i32
  %t = arith.constant true
  %r = arith.select %causal, %lower, %t : i1
  flex.yield %r : i1
}

// -----

// Negative: params are runtime values and must not be folded, even with a
// default; the declarations themselves stay.
// CHECK:       flex.const_decl @UNUSED = 3 : i32
// CHECK:       flex.param @cap : f32 = 3.000000e+01 : f32
// CHECK-LABEL: flex.mod score @capped
// CHECK:         %[[CAP:.+]] = flex.param_ref @cap : f32
// CHECK:         arith.divf %s, %[[CAP]] : f32
flex.const_decl @UNUSED = 3 : i32
flex.param @cap : f32 = 30.0 : f32
flex.mod score @capped(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %cap = flex.param_ref @cap : f32
  %x = arith.divf %s, %cap : f32
  flex.yield %x : f32
}
