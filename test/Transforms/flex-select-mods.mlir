// -flex-select-mods keeps the named mods, the mods they call and the
// declarations those use.
// RUN: pagedc-opt %s -flex-select-mods=mods=doc_causal,alibi | FileCheck %s --enable-var-scope
// RUN: pagedc-opt %s -flex-select-mods=mods=causal | FileCheck %s --check-prefix=ONE --enable-var-scope
// RUN: pagedc-opt %s -flex-select-mods | FileCheck %s --check-prefix=ALL

// Kept: both named mods, @document and @causal (called by @doc_causal),
// @doc and @slopes (read by kept mods), the const they use; dropped:
// @unrelated, @bias (only @unrelated reads it), @softcap, @UNUSED.
// CHECK-NOT:   @UNUSED
// CHECK:       flex.const_decl @SHIFT
// CHECK-NOT:   @softcap
// CHECK:       flex.buffer @doc
// CHECK:       flex.buffer @slopes
// CHECK-NOT:   @bias
// CHECK:       flex.mod mask @causal
// CHECK:       flex.mod mask @document
// CHECK:       flex.mod mask @doc_causal
// CHECK:       flex.mod score @alibi
// CHECK-NOT:   @unrelated

// Negative: a mod that calls nothing and reads nothing keeps nothing else.
// ONE:         module {
// ONE-NEXT:      flex.mod mask @causal
// ONE-NOT:       flex.
// ONE:           flex.yield
// ONE-NEXT:    }
// ONE-NEXT:  }

// Negative: without a list nothing is dropped.
// ALL-COUNT-5: flex.mod

flex.const_decl @UNUSED = 1 : i32
flex.const_decl @SHIFT = 2 : i32
flex.param @softcap : f32
flex.buffer @doc : i32 [B, S]
flex.buffer @slopes : f32 [H]
flex.buffer @bias : f32 [S, S]
flex.mod mask @causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %0 = arith.cmpi sge, %q, %kv : i32
  flex.yield %0 : i1
}
flex.mod mask @document(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %dq = flex.buffer_load @doc[%b, %q] : (i32, i32) -> i32
  %dkv = flex.buffer_load @doc[%b, %kv] : (i32, i32) -> i32
  %0 = arith.cmpi eq, %dq, %dkv : i32
  flex.yield %0 : i1
}
flex.mod mask @doc_causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %d = flex.call @document(%b, %h, %q, %kv) : (i32, i32, i32, i32) -> i1
  %c = flex.call @causal(%b, %h, %q, %kv) : (i32, i32, i32, i32) -> i1
  %0 = arith.andi %d, %c : i1
  flex.yield %0 : i1
}
flex.mod score @alibi(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %shift = flex.const_ref @SHIFT : i32
  %h2 = arith.addi %h, %shift : i32
  %slope = flex.buffer_load @slopes[%h2] : (i32) -> f32
  %d = arith.subi %kv, %q : i32
  %df = arith.sitofp %d : i32 to f32
  %m = arith.mulf %slope, %df : f32
  %0 = arith.addf %s, %m : f32
  flex.yield %0 : f32
}
flex.mod score @unrelated(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %v = flex.buffer_load @bias[%q, %kv] : (i32, i32) -> f32
  %cap = flex.param_ref @softcap : f32
  %0 = arith.mulf %v, %cap : f32
  flex.yield %0 : f32
}
