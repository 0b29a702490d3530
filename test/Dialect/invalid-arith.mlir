// Type constraints of flex.floordiv, flex.floormod and flex.tanh_approx.
// RUN: pagedc-opt %s -split-input-file -verify-diagnostics

func.func @bool_floordiv(%a: i1, %b: i1) -> i1 {
  // expected-error @+1 {{'flex.floordiv' op operand #0 must be 32-bit signless integer or 64-bit signless integer or 32-bit float, but got 'i1'}}
  %r = flex.floordiv %a, %b : i1
  return %r : i1
}

// -----

func.func @f64_floormod(%a: f64, %b: f64) -> f64 {
  // expected-error @+1 {{'flex.floormod' op operand #0 must be 32-bit signless integer or 64-bit signless integer or 32-bit float, but got 'f64'}}
  %r = flex.floormod %a, %b : f64
  return %r : f64
}

// -----

func.func @mixed(%a: i32, %b: i64) -> i32 {
  // expected-error @+1 {{'flex.floordiv' op requires the same type for all operands and results}}
  %r = "flex.floordiv"(%a, %b) : (i32, i64) -> i32
  return %r : i32
}

// -----

func.func @int_tanh(%a: i32) -> i32 {
  // expected-error @+1 {{'flex.tanh_approx' op operand #0 must be 32-bit float, but got 'i32'}}
  %r = "flex.tanh_approx"(%a) : (i32) -> i32
  return %r : i32
}
