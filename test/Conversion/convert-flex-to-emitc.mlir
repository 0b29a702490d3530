// RUN: pagedc-opt --split-input-file --verify-diagnostics --convert-flex-to-emitc="mask=causal score=alibi" %s | FileCheck %s --enable-var-scope

// The selected mods become the hooks; kv-independent slopes[h] is
// computed in score_row and read from the ScoreRow field r0 in score.

flex.param @cap : f32 = 3.000000e+01 : f32
flex.buffer @slopes : f32 [H]
flex.mod mask @causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %0 = arith.cmpi sge, %q, %kv : i32
  flex.yield %0 : i1
}
flex.mod score @alibi(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %0 = flex.buffer_load @slopes[%h] : (i32) -> f32
  %1 = arith.subi %kv, %q : i32
  %2 = arith.sitofp %1 : i32 to f32
  %3 = arith.mulf %0, %2 : f32
  %4 = arith.addf %s, %3 : f32
  flex.yield %4 : f32
}
// An unselected mod disappears.
flex.mod mask @unused(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %0 = arith.cmpi eq, %q, %kv : i32
  flex.yield %0 : i1
}

// CHECK-LABEL: module {
// CHECK-NEXT:    emitc.verbatim "struct Params {\0A  float cap;\0A  const float* slopes;\0A  int64_t slopes_stride[1];\0A  int64_t slopes_size[1];\0A};"
// CHECK-NEXT:    emitc.verbatim "constexpr bool kHasMask = true;"
// CHECK-NEXT:    emitc.verbatim "constexpr bool kHasScore = true;"
// CHECK-NEXT:    emitc.verbatim "struct MaskRow {};"
// CHECK-NEXT:    emitc.func @mask_row(%{{.*}}: !emitc.opaque<"const Params&">, %{{.*}}: i32, %{{.*}}: i32, %{{.*}}: i32) -> !emitc.opaque<"MaskRow"> attributes {specifiers = ["__device__", "__forceinline__"]} {
// CHECK-NEXT:      %[[ROW:.*]] = "emitc.variable"() <{value = #emitc.opaque<"{}">}> : () -> !emitc.opaque<"MaskRow">
// CHECK-NEXT:      emitc.return %[[ROW]]
// CHECK-NEXT:    }
// CHECK-NEXT:    emitc.func @mask(%{{.*}}: !emitc.opaque<"const Params&">, %{{.*}}: !emitc.opaque<"const MaskRow&">, %{{.*}}: i32, %{{.*}}: i32, %[[Q:.*]]: i32, %[[KV:.*]]: i32) -> i1
// CHECK-NEXT:      %[[E:.*]] = emitc.expression : i1 {
// CHECK-NEXT:        %[[C:.*]] = emitc.cmp ge, %[[Q]], %[[KV]] : (i32, i32) -> i1
// CHECK-NEXT:        emitc.yield %[[C]] : i1
// CHECK-NEXT:      }
// CHECK-NEXT:      emitc.return %[[E]] : i1
// CHECK-NEXT:    }
// Causal reads nothing of kv alone: an empty column struct, and mask_at is
// mask with the column argument.
// CHECK-NEXT:    emitc.verbatim "struct MaskCol {};"
// CHECK-NEXT:    emitc.func @mask_col(%{{.*}}: !emitc.opaque<"const Params&">, %{{.*}}: i32) -> !emitc.opaque<"MaskCol"> attributes {specifiers = ["__device__", "__forceinline__"]} {
// CHECK-NEXT:      %[[COL:.*]] = "emitc.variable"() <{value = #emitc.opaque<"{}">}> : () -> !emitc.opaque<"MaskCol">
// CHECK-NEXT:      emitc.return %[[COL]]
// CHECK-NEXT:    }
// CHECK-NEXT:    emitc.func @mask_at(%{{.*}}: !emitc.opaque<"const Params&">, %{{.*}}: !emitc.opaque<"const MaskRow&">, %{{.*}}: !emitc.opaque<"const MaskCol&">, %{{.*}}: i32, %{{.*}}: i32, %[[Q:.*]]: i32, %[[KV:.*]]: i32) -> i1
// CHECK-NEXT:      %[[E:.*]] = emitc.expression : i1 {
// CHECK-NEXT:        %[[C:.*]] = emitc.cmp ge, %[[Q]], %[[KV]] : (i32, i32) -> i1
// CHECK-NEXT:        emitc.yield %[[C]] : i1
// CHECK-NEXT:      }
// CHECK-NEXT:      emitc.return %[[E]] : i1
// CHECK-NEXT:    }
// CHECK-NEXT:    emitc.verbatim "struct ScoreRow {\0A  float r0; // flex.buffer_load @slopes\0A};"
// CHECK-NEXT:    emitc.func @score_row(%[[P:.*]]: !emitc.opaque<"const Params&">, %{{.*}}: i32, %[[H:.*]]: i32, %{{.*}}: i32)
// CHECK-NEXT:      %[[STRIDES:.*]] = "emitc.member"(%[[P]]) <{member = "slopes_stride"}> : (!emitc.opaque<"const Params&">) -> !emitc.array<1xi64>
// CHECK-NEXT:      %[[SIZES:.*]] = "emitc.member"(%[[P]]) <{member = "slopes_size"}> : (!emitc.opaque<"const Params&">) -> !emitc.array<1xi64>
// CHECK-NEXT:      %[[WIDE:.*]] = emitc.expression : i64 {
// CHECK-NEXT:        %[[CAST:.*]] = emitc.cast %[[H]] : i32 to i64
// CHECK-NEXT:        emitc.yield %[[CAST]] : i64
// CHECK-NEXT:      }
// CHECK-NEXT:      %[[ZERO:.*]] = emitc.literal "0" : !emitc.size_t
// CHECK-NEXT:      %[[SIZE:.*]] = emitc.subscript %[[SIZES]][%[[ZERO]]]
// CHECK-NEXT:      %[[STRIDE:.*]] = emitc.subscript %[[STRIDES]][%[[ZERO]]]
// CHECK-NEXT:      %[[OK:.*]] = emitc.expression : i1 {
// CHECK-NEXT:        %[[C:.*]] = emitc.call_opaque "flex_index_ok"(%[[WIDE]], %[[SIZE]]) : (i64, i64) -> i1
// CHECK-NEXT:        emitc.yield %[[C]] : i1
// CHECK-NEXT:      }
// CHECK-NEXT:      %[[OFFSET:.*]] = emitc.expression : i64 {
// CHECK-NEXT:        %[[C:.*]] = emitc.call_opaque "flex_index_term"(%[[WIDE]], %[[OK]], %[[STRIDE]]) : (i64, i1, i64) -> i64
// CHECK-NEXT:        emitc.yield %[[C]] : i64
// CHECK-NEXT:      }
// CHECK-NEXT:      %[[DATA:.*]] = "emitc.member"(%[[P]]) <{member = "slopes"}> : (!emitc.opaque<"const Params&">) -> !emitc.ptr<f32>
// CHECK-NEXT:      %[[SLOPE:.*]] = emitc.expression : f32 {
// CHECK-NEXT:        %[[C:.*]] = emitc.call_opaque "flex_load"(%[[DATA]], %[[OK]], %[[OFFSET]]) : (!emitc.ptr<f32>, i1, i64) -> f32
// CHECK-NEXT:        emitc.yield %[[C]] : f32
// CHECK-NEXT:      }
// CHECK-NEXT:      %[[ROW:.*]] = "emitc.variable"() <{value = #emitc.opaque<"{}">}> : () -> !emitc.opaque<"ScoreRow">
// CHECK-NEXT:      %[[FIELD:.*]] = "emitc.member"(%[[ROW]]) <{member = "r0"}> : (!emitc.opaque<"ScoreRow">) -> f32
// CHECK-NEXT:      emitc.assign %[[SLOPE]] : f32 to %[[FIELD]] : f32
// CHECK-NEXT:      emitc.return %[[ROW]]
// CHECK-NEXT:    }
// CHECK-NEXT:    emitc.func @score(%{{.*}}: !emitc.opaque<"const Params&">, %[[ROW:.*]]: !emitc.opaque<"const ScoreRow&">, %[[S:.*]]: f32, %{{.*}}: i32, %{{.*}}: i32, %[[Q:.*]]: i32, %[[KV:.*]]: i32)
// CHECK-NEXT:      %[[SLOPE:.*]] = "emitc.member"(%[[ROW]]) <{member = "r0"}>
// CHECK-NEXT:      %[[E:.*]] = emitc.expression : f32 {
// CHECK-NEXT:        %[[D:.*]] = emitc.sub %[[KV]], %[[Q]] : (i32, i32) -> i32
// CHECK-NEXT:        %[[F:.*]] = emitc.cast %[[D]] : i32 to f32
// CHECK-NEXT:        %[[M:.*]] = emitc.mul %[[SLOPE]], %[[F]] : (f32, f32) -> f32
// CHECK-NEXT:        %[[A:.*]] = emitc.add %[[S]], %[[M]] : (f32, f32) -> f32
// CHECK-NEXT:        emitc.yield %[[A]] : f32
// CHECK-NEXT:      }
// CHECK-NEXT:      emitc.return %[[E]] : f32
// CHECK-NEXT:    }
// CHECK-NEXT:  }
// CHECK-NOT:   flex.

// -----

// Selecting a mod that does not exist is an error.
// expected-error @+1 {{no mask mod named 'causal'}}
module {
  flex.mod score @alibi(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
    flex.yield %s : f32
  }
}

// -----

// Selecting a score mod as the mask is an error.
flex.buffer @slopes : f32 [H]
// expected-error @+1 {{'causal' is not a mask mod}}
flex.mod score @causal(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  flex.yield %s : f32
}
flex.mod score @alibi(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  flex.yield %s : f32
}
