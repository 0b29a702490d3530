// RUN: pagedc-opt --convert-flex-to-emitc="mask=document score=scaled" %s | FileCheck %s --enable-var-scope

// Hoisting: doc[b, q] does not depend on kv and moves to mask_row; doc[b, kv]
// does and stays in mask, but the bounds test and offset of its b index are
// computed in mask_row (row fields r1, r2), so mask adds only kv's term. A
// param read is recomputed where it is used rather
// than stored in the row struct, and a score that uses s and params only has
// an empty ScoreRow.

flex.param @scale : f32 = 2.000000e+00 : f32
flex.buffer @doc : i32 [B, S]
flex.mod mask @document(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %0 = flex.buffer_load @doc[%b, %q] : (i32, i32) -> i32
  %1 = flex.buffer_load @doc[%b, %kv] : (i32, i32) -> i32
  %2 = arith.cmpi eq, %0, %1 : i32
  flex.yield %2 : i1
}
flex.mod score @scaled(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %0 = flex.param_ref @scale : f32
  %1 = arith.mulf %s, %0 : f32
  flex.yield %1 : f32
}

// CHECK:       emitc.verbatim "struct MaskRow {\0A  int32_t r0; // flex.buffer_load @doc\0A  bool r1; // flex.buffer_load @doc: row indices in bounds\0A  int64_t r2; // flex.buffer_load @doc: row indices' offset\0A};"
// CHECK-LABEL: emitc.func @mask_row(
// CHECK-SAME:      %[[P:[^:]*]]: !emitc.opaque<"const Params&">, %[[B:[^:]*]]: i32, %{{[^:]*}}: i32, %[[Q:[^:]*]]: i32)
// CHECK:         emitc.cast %[[B]] : i32 to i64
// CHECK:         emitc.cast %[[Q]] : i32 to i64
// CHECK:         "emitc.member"(%[[P]]) <{member = "doc"}>
// CHECK:         <{member = "r0"}>
// CHECK:         emitc.assign
// CHECK:         emitc.cast %[[B]] : i32 to i64
// CHECK:         %[[OK:.*]] = emitc.expression : i1 {
// CHECK-NEXT:      emitc.call_opaque "flex_index_ok"
// CHECK:         %[[TERM:.*]] = emitc.expression : i64 {
// CHECK-NEXT:      emitc.call_opaque "flex_index_term"({{.*}}, %[[OK]],
// CHECK:         %[[R1:.*]] = "emitc.member"(%{{.*}}) <{member = "r1"}>
// CHECK-NEXT:    emitc.assign %[[OK]] : i1 to %[[R1]] : i1
// CHECK-NEXT:    %[[R2:.*]] = "emitc.member"(%{{.*}}) <{member = "r2"}>
// CHECK-NEXT:    emitc.assign %[[TERM]] : i64 to %[[R2]] : i64
// CHECK-LABEL: emitc.func @mask(
// CHECK-SAME:      %[[P:[^:]*]]: !emitc.opaque<"const Params&">, %[[ROW:[^:]*]]: !emitc.opaque<"const MaskRow&">, %[[B:[^:]*]]: i32, %{{[^:]*}}: i32, %[[Q:[^:]*]]: i32, %[[KV:[^:]*]]: i32)
// CHECK-NEXT:    %[[FIELD:.*]] = "emitc.member"(%[[ROW]]) <{member = "r0"}>
// CHECK-NEXT:    %[[ROWOK:.*]] = "emitc.member"(%[[ROW]]) <{member = "r1"}>
// CHECK-NEXT:    %[[ROWOFF:.*]] = "emitc.member"(%[[ROW]]) <{member = "r2"}>
// CHECK-NOT:     emitc.cast %[[B]]
// CHECK-NOT:     emitc.cast %[[Q]]
// CHECK:         emitc.cast %[[KV]] : i32 to i64
// CHECK:         %[[OTHER:.*]] = emitc.expression : i32 {
// CHECK-NEXT:      %[[ALL:.*]] = emitc.logical_and %[[ROWOK]], %{{.*}} : i1, i1
// CHECK-NEXT:      %[[AT:.*]] = emitc.add %[[ROWOFF]], %{{.*}} : (i64, i64) -> i64
// CHECK-NEXT:      emitc.call_opaque "flex_load"(%{{.*}}, %[[ALL]], %[[AT]])
// CHECK:         emitc.cmp eq, %[[FIELD]], %[[OTHER]]
// CHECK:       emitc.verbatim "struct ScoreRow {};"
// CHECK-LABEL: emitc.func @score(
// CHECK-SAME:      %[[P:[^:]*]]: !emitc.opaque<"const Params&">, %{{[^:]*}}: !emitc.opaque<"const ScoreRow&">, %[[S:[^:]*]]: f32,
// CHECK-NEXT:    %[[SCALE:.*]] = "emitc.member"(%[[P]]) <{member = "scale"}> : (!emitc.opaque<"const Params&">) -> f32
// CHECK-NEXT:    %[[E:.*]] = emitc.expression : f32 {
// CHECK-NEXT:      %[[M:.*]] = emitc.mul %[[S]], %[[SCALE]] : (f32, f32) -> f32
