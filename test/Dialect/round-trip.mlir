// Every flex op parses, verifies and prints back in its custom form, and the
// printed form parses again to the same text.
// RUN: pagedc-opt %s | FileCheck %s --enable-var-scope
// RUN: pagedc-opt %s | pagedc-opt | FileCheck %s --enable-var-scope
// RUN: pagedc-opt %s -mlir-print-op-generic | pagedc-opt | FileCheck %s --enable-var-scope

// CHECK: flex.const_decl @WINDOW = 1024 : i32
flex.const_decl @WINDOW = 1024 : i32
// CHECK: flex.const_decl @SCALE = 5.000000e-01 : f32
flex.const_decl @SCALE = 0.5 : f32
// CHECK: flex.const_decl @BIG = 4294967296 : i64
flex.const_decl @BIG = 4294967296 : i64
// CHECK: flex.const_decl @ON = true
flex.const_decl @ON = true

// CHECK: flex.param @softcap : f32 = 3.000000e+01 : f32
flex.param @softcap : f32 = 30.0 : f32
// CHECK: flex.param @offset : i32{{$}}
flex.param @offset : i32
// CHECK: flex.param @enabled : i1 = false
flex.param @enabled : i1 = false

// CHECK: flex.buffer @slopes : f32 [H]
flex.buffer @slopes : f32 [H]
// CHECK: flex.buffer @doc : i32 [B, S]
flex.buffer @doc : i32 [B, S]
// CHECK: flex.buffer @bias : bf16 [128, ?]
flex.buffer @bias : bf16 [128, ?]
// CHECK: flex.buffer @half : f16 [?, ?, 4, D]
flex.buffer @half : f16 [?, ?, 4, D]
// CHECK: flex.buffer @wide : i64 [N]
flex.buffer @wide : i64 [N]
// CHECK: flex.buffer @keep : i1 [8]
flex.buffer @keep : i1 [8]

// Block arguments print as %b, %h, %q, %kv whatever the input called them.
// CHECK-LABEL: flex.mod mask @causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
// CHECK-NEXT:    %[[KEEP:.+]] = arith.cmpi sge, %q, %kv : i32
// CHECK-NEXT:    flex.yield %[[KEEP]] : i1
// CHECK-NEXT:  }
flex.mod mask @causal(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: i32) -> i1 {
  %0 = arith.cmpi sge, %arg2, %arg3 : i32
  flex.yield %0 : i1
}

// CHECK-LABEL: flex.mod mask @reads_everything(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1
// CHECK-SAME:    attributes {flex.buffers = [@doc], flex.params = [@offset], flex.reads = ["b", "q", "kv"]}
// CHECK:         %[[C:.+]] = flex.call @causal(%b, %h, %q, %kv) : (i32, i32, i32, i32) -> i1
// CHECK:         %[[W:.+]] = flex.const_ref @WINDOW : i32
// CHECK:         %[[O:.+]] = flex.param_ref @offset : i32
// CHECK:         %[[DQ:.+]] = flex.buffer_load @doc[%b, %q] : (i32, i32) -> i32
// CHECK:         %[[DKV:.+]] = flex.buffer_load @doc[%b, %kv] : (i32, i32) -> i32
// CHECK:         flex.floordiv %[[DQ]], %[[W]] : i32
// CHECK:         flex.floormod %[[DKV]], %[[O]] : i32
flex.mod mask @reads_everything(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1
    attributes {flex.reads = ["b", "q", "kv"], flex.buffers = [@doc],
                flex.params = [@offset]} {
  %c = flex.call @causal(%b, %h, %q, %kv) : (i32, i32, i32, i32) -> i1
  %w = flex.const_ref @WINDOW : i32
  %o = flex.param_ref @offset : i32
  %dq = flex.buffer_load @doc[%b, %q] : (i32, i32) -> i32
  %dkv = flex.buffer_load @doc[%b, %kv] : (i32, i32) -> i32
  %x = flex.floordiv %dq, %w : i32
  %y = flex.floormod %dkv, %o : i32
  %same = arith.cmpi eq, %x, %y : i32
  %r = arith.andi %c, %same : i1
  flex.yield %r : i1
}

// CHECK-LABEL: flex.mod score @capped(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32
// CHECK-SAME:    attributes {flex.diagonal}
// CHECK:         flex.buffer_load @slopes[%h] : (i32) -> f32
// CHECK:         flex.buffer_load @bias[%q, %kv] : (i32, i32) -> f32
// CHECK:         flex.buffer_load @wide[%{{.+}}] : (i64) -> i64
// CHECK:         flex.buffer_load @keep[%q] : (i32) -> i1
// CHECK:         flex.floordiv %{{.+}}, %{{.+}} : f32
// CHECK:         flex.floormod %{{.+}}, %{{.+}} : i64
// CHECK:         flex.tanh_approx %{{.+}} : f32
// CHECK:         flex.yield %{{.+}} : f32
flex.mod score @capped(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32
    attributes {flex.diagonal} {
  %slope = flex.buffer_load @slopes[%h] : (i32) -> f32
  %bias = flex.buffer_load @bias[%q, %kv] : (i32, i32) -> f32
  %q64 = arith.extsi %q : i32 to i64
  %wide = flex.buffer_load @wide[%q64] : (i64) -> i64
  %keep = flex.buffer_load @keep[%q] : (i32) -> i1
  %cap = flex.param_ref @softcap : f32
  %x = flex.floordiv %s, %cap : f32
  %m = flex.floormod %wide, %q64 : i64
  %t = flex.tanh_approx %x : f32
  flex.yield %t : f32
}
