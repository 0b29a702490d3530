// RUN: pagedc-opt --split-input-file --convert-flex-to-emitc="mask=document_causal" %s | FileCheck %s --enable-var-scope

// The column part of a mask: what depends on kv alone (doc[kv], and
// kv - offsets[doc[kv]] through it) moves to mask_col and travels in the
// MaskCol fields c0, c1; mask_at reads them and loads nothing. mask keeps
// the whole element part for the kernels that call it per element.

flex.buffer @doc : i32 [S]
flex.buffer @offsets : i32 [?]
flex.mod mask @document_causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %0 = flex.buffer_load @doc[%q] : (i32) -> i32
  %1 = flex.buffer_load @doc[%kv] : (i32) -> i32
  %2 = arith.cmpi eq, %0, %1 : i32
  %3 = flex.buffer_load @offsets[%1] : (i32) -> i32
  %4 = arith.subi %kv, %3 : i32
  %5 = flex.buffer_load @offsets[%0] : (i32) -> i32
  %6 = arith.subi %q, %5 : i32
  %7 = arith.cmpi sge, %6, %4 : i32
  %8 = arith.andi %2, %7 : i1
  flex.yield %8 : i1
}

// CHECK-LABEL: emitc.func @mask(
// CHECK-COUNT-2: emitc.call_opaque "flex_load"
// CHECK:         emitc.return
// CHECK:       emitc.verbatim "struct MaskCol {\0A  int32_t c0; // flex.buffer_load @doc\0A  int32_t c1; // arith.subi\0A};"
// CHECK-LABEL: emitc.func @mask_col(
// CHECK-SAME:      %[[P:[^:]*]]: !emitc.opaque<"const Params&">, %[[KV:[^:]*]]: i32) -> !emitc.opaque<"MaskCol">
// CHECK:         emitc.cast %[[KV]] : i32 to i64
// CHECK:         %[[DOC:.*]] = emitc.expression : i32 {
// CHECK-NEXT:      emitc.call_opaque "flex_load"
// CHECK:         %[[START:.*]] = emitc.expression : i32 {
// CHECK-NEXT:      emitc.call_opaque "flex_load"
// CHECK:         %[[REL:.*]] = emitc.expression : i32 {
// CHECK-NEXT:      emitc.sub %[[KV]], %[[START]]
// CHECK:         %[[COL:.*]] = "emitc.variable"()
// CHECK:         %[[C0:.*]] = "emitc.member"(%[[COL]]) <{member = "c0"}>
// CHECK-NEXT:    emitc.assign %[[DOC]] : i32 to %[[C0]]
// CHECK:         %[[C1:.*]] = "emitc.member"(%[[COL]]) <{member = "c1"}>
// CHECK-NEXT:    emitc.assign %[[REL]] : i32 to %[[C1]]
// CHECK-NEXT:    emitc.return %[[COL]]
// CHECK-LABEL: emitc.func @mask_at(
// CHECK-SAME:      %{{[^:]*}}: !emitc.opaque<"const Params&">, %[[ROW:[^:]*]]: !emitc.opaque<"const MaskRow&">, %[[COLARG:[^:]*]]: !emitc.opaque<"const MaskCol&">
// CHECK-NOT:     flex_load
// CHECK-DAG:     %[[R0:.*]] = "emitc.member"(%[[ROW]]) <{member = "r0"}>
// CHECK-DAG:     %[[R1:.*]] = "emitc.member"(%[[ROW]]) <{member = "r1"}>
// CHECK-DAG:     %[[D:.*]] = "emitc.member"(%[[COLARG]]) <{member = "c0"}>
// CHECK-DAG:     %[[K:.*]] = "emitc.member"(%[[COLARG]]) <{member = "c1"}>
// CHECK-NOT:     flex_load
// CHECK:           emitc.cmp eq, %[[R0]], %[[D]]
// CHECK-NEXT:      emitc.cmp ge, %[[R1]], %[[K]]
// CHECK-NOT:     flex_load
// CHECK:       emitc.verbatim "struct ScoreRow {};"

// -----

// A mask of kv alone: its result is the column field, and mask_at returns it.
flex.buffer @keep : i32 [S]
flex.mod mask @document_causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %c0 = arith.constant 0 : i32
  %0 = flex.buffer_load @keep[%kv] : (i32) -> i32
  %1 = arith.cmpi ne, %0, %c0 : i32
  flex.yield %1 : i1
}

// CHECK:       emitc.verbatim "struct MaskCol {\0A  bool c0; // arith.cmpi\0A};"
// CHECK-LABEL: emitc.func @mask_at(
// CHECK-SAME:      %[[COLARG:[^:]*]]: !emitc.opaque<"const MaskCol&">
// CHECK-NEXT:    %[[C0:.*]] = "emitc.member"(%[[COLARG]]) <{member = "c0"}> : (!emitc.opaque<"const MaskCol&">) -> i1
// CHECK-NEXT:    emitc.return %[[C0]] : i1

// -----

// A key read that takes the batch index as well (doc[b, kv]) is not of kv
// alone: it stays in mask_at (its b term from the row struct) and MaskCol is
// empty.
flex.buffer @doc : i32 [B, S]
flex.mod mask @document_causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %0 = flex.buffer_load @doc[%b, %q] : (i32, i32) -> i32
  %1 = flex.buffer_load @doc[%b, %kv] : (i32, i32) -> i32
  %2 = arith.cmpi eq, %0, %1 : i32
  flex.yield %2 : i1
}

// CHECK:       emitc.verbatim "struct MaskCol {};"
// CHECK-LABEL: emitc.func @mask_at(
// CHECK:         emitc.call_opaque "flex_load"
// CHECK:       emitc.verbatim "struct ScoreRow {};"

// -----

// Arithmetic on kv alone is not held (natten's kv // W: the CUDA compiler
// shares it between a thread's rows by itself): MaskCol is empty and mask_at
// computes it. A read's index arithmetic (kv // 4 for starts[kv // 4]) runs
// in mask_col only.
flex.buffer @starts : i32 [?]
flex.mod mask @document_causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %c4 = arith.constant 4 : i32
  %0 = flex.floordiv %kv, %c4 : i32
  %1 = flex.buffer_load @starts[%0] : (i32) -> i32
  %2 = arith.cmpi sle, %1, %q : i32
  %3 = arith.muli %kv, %kv : i32
  %4 = arith.cmpi sge, %q, %3 : i32
  %5 = arith.andi %2, %4 : i1
  flex.yield %5 : i1
}

// CHECK:       emitc.verbatim "struct MaskCol {\0A  int32_t c0; // flex.buffer_load @starts\0A};"
// CHECK-LABEL: emitc.func @mask_col(
// CHECK:         emitc.call_opaque "flex_floordiv"
// CHECK:         emitc.call_opaque "flex_load"
// CHECK-LABEL: emitc.func @mask_at(
// CHECK-NOT:     flex_floordiv
// CHECK-NOT:     flex_load
// CHECK:         emitc.mul
// CHECK-NOT:     flex_floordiv
// CHECK-NOT:     flex_load
// CHECK:       emitc.verbatim "struct ScoreRow {};"
