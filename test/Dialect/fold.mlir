// Folders of flex.floordiv, flex.floormod and flex.tanh_approx, with
// PyTorch's semantics for negative operands.
// RUN: pagedc-opt %s -canonicalize | FileCheck %s --enable-var-scope

// Floor division rounds toward negative infinity: -7 // 2 == -4,
// 7 // -2 == -4, -7 // -2 == 3.
// CHECK-LABEL: func.func @floordiv_int
// CHECK-DAG:     %[[M4:.+]] = arith.constant -4 : i32
// CHECK-DAG:     %[[P3:.+]] = arith.constant 3 : i32
// CHECK:         return %[[M4]], %[[M4]], %[[P3]]
func.func @floordiv_int() -> (i32, i32, i32) {
  %m7 = arith.constant -7 : i32
  %p7 = arith.constant 7 : i32
  %p2 = arith.constant 2 : i32
  %m2 = arith.constant -2 : i32
  %a = flex.floordiv %m7, %p2 : i32
  %b = flex.floordiv %p7, %m2 : i32
  %c = flex.floordiv %m7, %m2 : i32
  return %a, %b, %c : i32, i32, i32
}

// The remainder takes the sign of the divisor: -7 % 2 == 1, 7 % -2 == -1,
// -7 % -2 == -1, and 6 % -3 == 0.
// CHECK-LABEL: func.func @floormod_int
// CHECK-DAG:     %[[P1:.+]] = arith.constant 1 : i64
// CHECK-DAG:     %[[M1:.+]] = arith.constant -1 : i64
// CHECK-DAG:     %[[Z:.+]] = arith.constant 0 : i64
// CHECK:         return %[[P1]], %[[M1]], %[[M1]], %[[Z]]
func.func @floormod_int() -> (i64, i64, i64, i64) {
  %m7 = arith.constant -7 : i64
  %p7 = arith.constant 7 : i64
  %p2 = arith.constant 2 : i64
  %m2 = arith.constant -2 : i64
  %p6 = arith.constant 6 : i64
  %m3 = arith.constant -3 : i64
  %a = flex.floormod %m7, %p2 : i64
  %b = flex.floormod %p7, %m2 : i64
  %c = flex.floormod %m7, %m2 : i64
  %d = flex.floormod %p6, %m3 : i64
  return %a, %b, %c, %d : i64, i64, i64, i64
}

// On floats too: -7.5 // 2 == -4, -7.5 % 2 == 0.5, 7.5 % -2 == -0.5.
// CHECK-LABEL: func.func @float
// CHECK-DAG:     %[[Q:.+]] = arith.constant -4.000000e+00 : f32
// CHECK-DAG:     %[[R:.+]] = arith.constant 5.000000e-01 : f32
// CHECK-DAG:     %[[S:.+]] = arith.constant -5.000000e-01 : f32
// CHECK:         return %[[Q]], %[[R]], %[[S]]
func.func @float() -> (f32, f32, f32) {
  %m = arith.constant -7.5 : f32
  %p = arith.constant 7.5 : f32
  %two = arith.constant 2.0 : f32
  %mtwo = arith.constant -2.0 : f32
  %q = flex.floordiv %m, %two : f32
  %r = flex.floormod %m, %two : f32
  %s = flex.floormod %p, %mtwo : f32
  return %q, %r, %s : f32, f32, f32
}

// x // 1 == x and x % 1 == 0 for any integer x.
// CHECK-LABEL: func.func @identities
// CHECK-SAME:    (%[[X:.+]]: i32)
// CHECK:         %[[Z:.+]] = arith.constant 0 : i32
// CHECK:         return %[[X]], %[[Z]]
func.func @identities(%x: i32) -> (i32, i32) {
  %one = arith.constant 1 : i32
  %a = flex.floordiv %x, %one : i32
  %b = flex.floormod %x, %one : i32
  return %a, %b : i32, i32
}

// Not folded: division by zero and INT_MIN // -1 are undefined, and
// non-constant operands have no value to fold to.
// CHECK-LABEL: func.func @no_fold
// CHECK:         flex.floordiv
// CHECK:         flex.floormod
// CHECK:         flex.floordiv
// CHECK:         flex.floordiv %arg0, %{{.+}} : i32
func.func @no_fold(%x: i32) -> (i32, i32, i32, i32) {
  %zero = arith.constant 0 : i32
  %five = arith.constant 5 : i32
  %min = arith.constant -2147483648 : i32
  %m1 = arith.constant -1 : i32
  %a = flex.floordiv %five, %zero : i32
  %b = flex.floormod %five, %zero : i32
  %c = flex.floordiv %min, %m1 : i32
  %d = flex.floordiv %x, %five : i32
  return %a, %b, %c, %d : i32, i32, i32, i32
}

// tanh_approx folds to the exact tanh of a constant, and stays otherwise.
// CHECK-LABEL: func.func @tanh_approx
// CHECK-DAG:     %[[T:.+]] = arith.constant 0.761594{{[0-9]+}} : f32
// CHECK-DAG:     %[[Y:.+]] = flex.tanh_approx %arg0 : f32
// CHECK:         return %[[T]], %[[Y]]
func.func @tanh_approx(%x: f32) -> (f32, f32) {
  %one = arith.constant 1.0 : f32
  %t = flex.tanh_approx %one : f32
  %y = flex.tanh_approx %x : f32
  return %t, %y : f32, f32
}
