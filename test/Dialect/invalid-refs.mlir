// Verifier errors of the operations that refer to symbols: flex.call,
// flex.const_ref, flex.param_ref and flex.buffer_load.
// RUN: pagedc-opt %s -split-input-file -verify-diagnostics

flex.mod mask @m(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  // expected-error @+1 {{'flex.call' op refers to '@missing', which is not defined}}
  %r = flex.call @missing(%b, %h, %q, %kv) : (i32, i32, i32, i32) -> i1
  flex.yield %r : i1
}

// -----

flex.const_decl @WINDOW = 4 : i32
flex.mod mask @m(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  // expected-error @+1 {{'flex.call' op refers to '@WINDOW', which is not a flex.mod}}
  %r = flex.call @WINDOW(%b, %h, %q, %kv) : (i32, i32, i32, i32) -> i1
  flex.yield %r : i1
}

// -----

flex.mod mask @inner(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %t = arith.constant true
  flex.yield %t : i1
}
flex.mod mask @m(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  // expected-error @+1 {{'flex.call' op passes ('i32', 'i32', 'i32') but '@inner' takes ('i32', 'i32', 'i32', 'i32')}}
  %r = flex.call @inner(%b, %h, %q) : (i32, i32, i32) -> i1
  flex.yield %r : i1
}

// -----

flex.mod score @inner(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  flex.yield %s : f32
}
flex.mod score @m(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %x = arith.sitofp %q : i32 to f32
  // expected-error @+1 {{'flex.call' op passes ('i32', 'i32', 'i32', 'f32', 'i32') but '@inner' takes ('f32', 'i32', 'i32', 'i32', 'i32')}}
  %r = flex.call @inner(%b, %h, %q, %x, %kv) : (i32, i32, i32, f32, i32) -> f32
  flex.yield %r : f32
}

// -----

flex.mod mask @inner(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %t = arith.constant true
  flex.yield %t : i1
}
flex.mod score @m(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  // expected-error @+1 {{'flex.call' op expects 'f32' but '@inner' yields 'i1'}}
  %r = flex.call @inner(%b, %h, %q, %kv) : (i32, i32, i32, i32) -> f32
  flex.yield %r : f32
}

// -----

// Types match, but a score may still not call a mask (Sema rejects it too).
flex.mod mask @inner(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %t = arith.constant true
  flex.yield %t : i1
}
flex.mod score @m(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  // expected-error @+1 {{'flex.call' op a score mod may not call the mask mod '@inner'}}
  %keep = flex.call @inner(%b, %h, %q, %kv) : (i32, i32, i32, i32) -> i1
  %ninf = arith.constant 0xFF800000 : f32
  %r = arith.select %keep, %s, %ninf : f32
  flex.yield %r : f32
}

// -----

flex.mod mask @m(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  // expected-error @+1 {{'flex.const_ref' op refers to '@W', which is not defined}}
  %w = flex.const_ref @W : i32
  %r = arith.cmpi sle, %q, %w : i32
  flex.yield %r : i1
}

// -----

flex.param @W : i32
flex.mod mask @m(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  // expected-error @+1 {{'flex.const_ref' op refers to '@W', which is not a flex.const_decl}}
  %w = flex.const_ref @W : i32
  %r = arith.cmpi sle, %q, %w : i32
  flex.yield %r : i1
}

// -----

flex.const_decl @W = 2.5 : f32
flex.mod mask @m(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  // expected-error @+1 {{'flex.const_ref' op has type 'i32' but '@W' has type 'f32'}}
  %w = flex.const_ref @W : i32
  %r = arith.cmpi sle, %q, %w : i32
  flex.yield %r : i1
}

// -----

flex.mod score @m(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  // expected-error @+1 {{'flex.param_ref' op refers to '@cap', which is not defined}}
  %c = flex.param_ref @cap : f32
  flex.yield %c : f32
}

// -----

flex.buffer @cap : f32 [1]
flex.mod score @m(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  // expected-error @+1 {{'flex.param_ref' op refers to '@cap', which is not a flex.param}}
  %c = flex.param_ref @cap : f32
  flex.yield %c : f32
}

// -----

flex.param @cap : i32
flex.mod score @m(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  // expected-error @+1 {{'flex.param_ref' op has type 'f32' but '@cap' has type 'i32'}}
  %c = flex.param_ref @cap : f32
  flex.yield %c : f32
}

// -----

flex.mod score @m(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  // expected-error @+1 {{'flex.buffer_load' op refers to '@bias', which is not defined}}
  %v = flex.buffer_load @bias[%q] : (i32) -> f32
  flex.yield %v : f32
}

// -----

flex.param @bias : f32
flex.mod score @m(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  // expected-error @+1 {{'flex.buffer_load' op refers to '@bias', which is not a flex.buffer}}
  %v = flex.buffer_load @bias[%q] : (i32) -> f32
  flex.yield %v : f32
}

// -----

flex.buffer @bias : f32 [H, S, S]
flex.mod score @m(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  // expected-error @+1 {{'flex.buffer_load' op has 2 indices but '@bias' has rank 3}}
  %v = flex.buffer_load @bias[%q, %kv] : (i32, i32) -> f32
  flex.yield %v : f32
}

// -----

// Half-precision buffers read as f32, never as f16 ...
flex.buffer @bias : f16 [S]
flex.mod mask @m(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  // expected-error @+1 {{'flex.buffer_load' op result #0 must be 1-bit signless integer or 32-bit signless integer or 64-bit signless integer or 32-bit float, but got 'f16'}}
  %v = flex.buffer_load @bias[%q] : (i32) -> f16
  %t = arith.constant true
  flex.yield %t : i1
}

// -----

// ... nor as an integer.
flex.buffer @bias : bf16 [S]
flex.mod mask @m(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  // expected-error @+1 {{'flex.buffer_load' op reads 'i32' but elements of '@bias' ('bf16') read as 'f32'}}
  %v = flex.buffer_load @bias[%q] : (i32) -> i32
  %t = arith.constant true
  flex.yield %t : i1
}

// -----

// i64 buffers stay i64.
flex.buffer @doc : i64 [S]
flex.mod mask @m(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  // expected-error @+1 {{'flex.buffer_load' op reads 'i32' but elements of '@doc' ('i64') read as 'i64'}}
  %v = flex.buffer_load @doc[%q] : (i32) -> i32
  %t = arith.constant true
  flex.yield %t : i1
}

// -----

flex.buffer @bias : f32 [S]
flex.mod score @m(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %x = arith.sitofp %q : i32 to f32
  // expected-error @+1 {{'flex.buffer_load' op operand #0 must be variadic of 32-bit signless integer or 64-bit signless integer, but got 'f32'}}
  %v = flex.buffer_load @bias[%x] : (f32) -> f32
  flex.yield %v : f32
}

// -----

// Bool buffers read as i1.
flex.buffer @keep : i1 [S]
flex.mod mask @m(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  // expected-error @+1 {{'flex.buffer_load' op reads 'i32' but elements of '@keep' ('i1') read as 'i1'}}
  %v = flex.buffer_load @keep[%q] : (i32) -> i32
  %t = arith.constant true
  flex.yield %t : i1
}
