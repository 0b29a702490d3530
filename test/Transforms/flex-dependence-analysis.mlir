// -flex-dependence-analysis records what each mod reads, and whether it
// reads q and kv only through q - kv.
// RUN: pagedc-opt %s -flex-dependence-analysis | FileCheck %s --enable-var-scope
// RUN: pagedc-opt %s -flex-inline-mods -flex-dependence-analysis | FileCheck %s --check-prefix=INLINED --enable-var-scope

flex.param @softcap : f32
flex.param @unused_param : i32
flex.buffer @doc : i32 [B, S]
flex.buffer @slopes : f32 [H]
flex.buffer @bias : f32 [H, S, S]

// Causal: {q, kv}, and a comparison of q with kv is diagonal.
// CHECK-LABEL: flex.mod mask @causal
// CHECK-SAME:    attributes {flex.buffers = [], flex.diagonal, flex.params = [], flex.reads = ["q", "kv"]}
flex.mod mask @causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %0 = arith.cmpi sge, %q, %kv : i32
  flex.yield %0 : i1
}

// ALiBi with slopes[h]: {h, q, kv, slopes}; kv - q is diagonal too.
// CHECK-LABEL: flex.mod score @alibi
// CHECK-SAME:    attributes {flex.buffers = [@slopes], flex.diagonal, flex.params = [], flex.reads = ["h", "q", "kv"]}
flex.mod score @alibi(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %slope = flex.buffer_load @slopes[%h] : (i32) -> f32
  %d = arith.subi %kv, %q : i32
  %df = arith.sitofp %d : i32 to f32
  %m = arith.mulf %slope, %df : f32
  %0 = arith.addf %s, %m : f32
  flex.yield %0 : f32
}

// Document mask: {b, q, kv, doc}; q and kv index a buffer, so not diagonal.
// CHECK-LABEL: flex.mod mask @document
// CHECK-SAME:    attributes {flex.buffers = [@doc], flex.params = [], flex.reads = ["b", "q", "kv"]}
flex.mod mask @document(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %dq = flex.buffer_load @doc[%b, %q] : (i32, i32) -> i32
  %dkv = flex.buffer_load @doc[%b, %kv] : (i32, i32) -> i32
  %0 = arith.cmpi eq, %dq, %dkv : i32
  flex.yield %0 : i1
}

// Sliding window: q - kv used twice, plus a compare; still diagonal.
// CHECK-LABEL: flex.mod mask @sliding
// CHECK-SAME:    flex.diagonal
flex.mod mask @sliding(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %c = arith.cmpi sge, %q, %kv : i32
  %d = arith.subi %q, %kv : i32
  %w = arith.constant 1024 : i32
  %n = arith.cmpi sle, %d, %w : i32
  %0 = arith.andi %c, %n : i1
  flex.yield %0 : i1
}

// Negative: prefix LM reads kv on its own (kv < 4), so it is not diagonal.
// CHECK-LABEL: flex.mod mask @prefix_lm
// CHECK-NOT:     flex.diagonal
// CHECK-SAME:    flex.reads = ["q", "kv"]
flex.mod mask @prefix_lm(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %p = arith.constant 4 : i32
  %prefix = arith.cmpi slt, %kv, %p : i32
  %c = arith.cmpi sge, %q, %kv : i32
  %0 = arith.ori %prefix, %c : i1
  flex.yield %0 : i1
}

// Negative: (q + 1) - kv is a function of the diagonal, but the analysis
// only recognizes q and kv combined directly; it must say "not diagonal"
// rather than guess.
// CHECK-LABEL: flex.mod mask @shifted
// CHECK-NOT:     flex.diagonal
// CHECK-SAME:    flex.reads = ["q", "kv"]
flex.mod mask @shifted(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %one = arith.constant 1 : i32
  %q1 = arith.addi %q, %one : i32
  %0 = arith.cmpi sge, %q1, %kv : i32
  flex.yield %0 : i1
}

// Negative: a mod reading only q is not diagonal; the score argument is not
// an index and is not listed; params are listed in declaration order.
// CHECK-LABEL: flex.mod score @q_only
// CHECK-SAME:    attributes {flex.buffers = [@bias], flex.params = [@softcap], flex.reads = ["h", "q"]}
flex.mod score @q_only(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %v = flex.buffer_load @bias[%h, %q, %q] : (i32, i32, i32) -> f32
  %cap = flex.param_ref @softcap : f32
  %x = arith.mulf %v, %cap : f32
  %0 = arith.addf %s, %x : f32
  flex.yield %0 : f32
}

// Negative: a constant mod reads nothing and is not diagonal.
// CHECK-LABEL: flex.mod mask @everything
// CHECK-SAME:    attributes {flex.buffers = [], flex.params = [], flex.reads = []}
flex.mod mask @everything(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %t = arith.constant true
  flex.yield %t : i1
}

// Before inlining the result is conservative: arguments passed to a call
// count as read and are not diagonal, but what the callee reads is included.
// After inlining the same mod is exact: {b, q, kv, doc}, not diagonal, and
// @causal_doc's own h is gone.
// CHECK-LABEL: flex.mod mask @causal_doc
// CHECK-SAME:    attributes {flex.buffers = [@doc], flex.params = [], flex.reads = ["b", "h", "q", "kv"]}
// INLINED-LABEL: flex.mod mask @causal_doc
// INLINED-SAME:    attributes {flex.buffers = [@doc], flex.params = [], flex.reads = ["b", "q", "kv"]}
flex.mod mask @causal_doc(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %d = flex.call @document(%b, %h, %q, %kv) : (i32, i32, i32, i32) -> i1
  %c = flex.call @causal(%b, %h, %q, %kv) : (i32, i32, i32, i32) -> i1
  %0 = arith.andi %d, %c : i1
  flex.yield %0 : i1
}

// After inlining a call of a diagonal mod, the caller is diagonal.
// CHECK-LABEL: flex.mod mask @wrapped_causal
// CHECK-NOT:     flex.diagonal
// CHECK-SAME:    flex.reads = ["b", "h", "q", "kv"]
// INLINED-LABEL: flex.mod mask @wrapped_causal
// INLINED-SAME:    attributes {flex.buffers = [], flex.diagonal, flex.params = [], flex.reads = ["q", "kv"]}
flex.mod mask @wrapped_causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %c = flex.call @causal(%b, %h, %q, %kv) : (i32, i32, i32, i32) -> i1
  flex.yield %c : i1
}

// Re-running replaces stale results instead of keeping them.
// CHECK-LABEL: flex.mod mask @stale
// CHECK-SAME:    attributes {flex.buffers = [], flex.params = [], flex.reads = ["kv"]}
flex.mod mask @stale(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1
    attributes {flex.diagonal, flex.reads = ["b", "q"], flex.buffers = [@doc]} {
  %p = arith.constant 4 : i32
  %0 = arith.cmpi slt, %kv, %p : i32
  flex.yield %0 : i1
}
