// Verifier errors of flex.mod and flex.yield: the signature of each kind of
// mod and the type of its result.
// RUN: pagedc-opt %s -split-input-file -verify-diagnostics

// expected-error @+1 {{'flex.mod' op a mask mod takes 4 arguments, got 3}}
flex.mod mask @m(%b: i32, %h: i32, %q: i32) -> i1 {
  %t = arith.constant true
  flex.yield %t : i1
}

// -----

// expected-error @+1 {{'flex.mod' op a score mod takes 5 arguments, got 4}}
flex.mod score @s(%b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %z = arith.constant 0.0 : f32
  flex.yield %z : f32
}

// -----

// expected-error @+1 {{'flex.mod' op a mask mod takes arguments of types ('i32', 'i32', 'i32', 'i32'), got ('i32', 'i32', 'i64', 'i32')}}
flex.mod mask @m(%b: i32, %h: i32, %q: i64, %kv: i32) -> i1 {
  %t = arith.constant true
  flex.yield %t : i1
}

// -----

// The score comes first and is f32.
// expected-error @+1 {{'flex.mod' op a score mod takes arguments of types ('f32', 'i32', 'i32', 'i32', 'i32'), got ('i32', 'i32', 'i32', 'i32', 'f32')}}
flex.mod score @s(%b: i32, %h: i32, %q: i32, %kv: i32, %s: f32) -> f32 {
  flex.yield %s : f32
}

// -----

// expected-error @+1 {{'flex.mod' op a mask mod yields 'i1', got 'f32'}}
flex.mod mask @m(%b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %z = arith.constant 0.0 : f32
  flex.yield %z : f32
}

// -----

// expected-error @+1 {{'flex.mod' op a score mod yields 'f32', got 'i1'}}
flex.mod score @s(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %t = arith.constant true
  flex.yield %t : i1
}

// -----

flex.mod mask @m(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %z = arith.constant 0.0 : f32
  // expected-error @+1 {{'flex.yield' op yields 'f32' but the enclosing mod yields 'i1'}}
  flex.yield %z : f32
}

// -----

func.func @not_a_mod() {
  %t = arith.constant true
  // expected-error @+1 {{'flex.yield' op expects parent op 'flex.mod'}}
  flex.yield %t : i1
}

// -----

// expected-error @+1 {{expected 'mask' or 'score', got 'prefix'}}
flex.mod prefix @m(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %t = arith.constant true
  flex.yield %t : i1
}

// -----

// A body must end with flex.yield.
flex.mod mask @m(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  // expected-error @+1 {{block with no terminator}}
  %t = arith.constant true
}
