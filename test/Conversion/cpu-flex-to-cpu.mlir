// RUN: pagedc-opt %s --convert-flex-to-cpu --split-input-file | FileCheck %s --enable-var-scope

// A mask becomes a ModABI row function: params are read once before the
// loop over kv; the body is the mod's body with kv = kv_begin + i. Its pure
// index arithmetic also gets an interval block classifier.
flex.param @window : i32
flex.mod mask @sliding(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %w = flex.param_ref @window : i32
  %0 = arith.cmpi sge, %q, %kv : i32
  %1 = arith.subi %q, %kv : i32
  %2 = arith.cmpi sle, %1, %w : i32
  %3 = arith.andi %0, %2 : i1
  flex.yield %3 : i1
}
// CHECK-LABEL: func.func @mask_row_sliding(
// CHECK-SAME: %[[CTX:[a-z0-9]+]]: !llvm.ptr, %{{.*}}: i32, %{{.*}}: i32, %[[Q:[a-z0-9]+]]: i32, %[[BEGIN:[a-z0-9]+]]: i32, %[[COUNT:[a-z0-9]+]]: i32, %[[OUT:[a-z0-9]+]]: !llvm.ptr {llvm.noalias})
// CHECK: %[[SLOTS_ADDR:.*]] = llvm.getelementptr %[[CTX]][0, 1]
// CHECK: %[[SLOTS:.*]] = llvm.load %[[SLOTS_ADDR]]
// CHECK: %[[W_ADDR:.*]] = llvm.getelementptr %[[SLOTS]][0] : (!llvm.ptr) -> !llvm.ptr, i32
// CHECK: %[[W:.*]] = llvm.load %[[W_ADDR]] : !llvm.ptr -> i32
// CHECK: scf.for %[[I:.*]] =
// CHECK: %[[I32:.*]] = arith.index_cast %[[I]] : index to i32
// CHECK: %[[KV:.*]] = arith.addi %[[BEGIN]], %[[I32]] : i32
// CHECK: arith.cmpi sge, %[[Q]], %[[KV]] : i32
// CHECK: %[[D:.*]] = arith.subi %[[Q]], %[[KV]] : i32
// CHECK: arith.cmpi sle, %[[D]], %[[W]] : i32
// CHECK: %[[BYTE:.*]] = arith.extui %{{.*}} : i1 to i8
// CHECK: llvm.store %[[BYTE]]
// CHECK-LABEL: func.func @mask_block_class_sliding(
// CHECK-SAME: -> i32
// CHECK: return %{{.*}} : i32

// -----

// A score reads its buffer through the context's descriptor (data pointer
// and strides, loaded before the loop), converts bf16 by shifting its bits
// into an f32 and rewrites `//` with Python's rounding (no plain divsi result).
flex.buffer @bias : bf16 [H, ?]
flex.mod score @biased(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %c4 = arith.constant 4 : i32
  %0 = flex.floordiv %kv, %c4 : i32
  %1 = flex.buffer_load @bias[%h, %0] : (i32, i32) -> f32
  %2 = arith.addf %s, %1 : f32
  flex.yield %2 : f32
}
// CHECK-LABEL: func.func @score_row_biased(
// CHECK: llvm.getelementptr %{{.*}}[0, 2, 0] : (!llvm.ptr) -> !llvm.ptr, !llvm.struct<(ptr, array<4 x i64>, array<4 x i64>)>
// CHECK: llvm.getelementptr %{{.*}}[0, 2, 1] : (!llvm.ptr) -> !llvm.ptr, !llvm.struct<(ptr, array<4 x i64>, array<4 x i64>)>
// CHECK: scf.for
// CHECK: %[[S:.*]] = llvm.load %{{.*}} : !llvm.ptr -> f32
// CHECK: %[[QUOT:.*]] = arith.divsi
// CHECK: %[[REM:.*]] = arith.remsi
// CHECK: arith.select %{{.*}}, %{{.*}}, %[[QUOT]] : i32
// CHECK: %[[RAW:.*]] = llvm.load %{{.*}} : !llvm.ptr -> i16
// CHECK: %[[WIDE:.*]] = arith.extui %[[RAW]] : i16 to i32
// CHECK: %[[BITS:.*]] = arith.shli %[[WIDE]], %{{.*}} : i32
// CHECK: %[[VALUE:.*]] = arith.bitcast %[[BITS]] : i32 to f32
// CHECK: %[[SUM:.*]] = arith.addf %[[S]], %[[VALUE]] : f32
// CHECK: llvm.store %[[SUM]]
// CHECK-NOT: mask_block_class

// -----

// A mask that reads a buffer gets no block classifier: intervals would make
// nearly every block partial, and element-wise classification is exact.
flex.buffer @doc : i32 [S]
flex.mod mask @document(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %0 = flex.buffer_load @doc[%q] : (i32) -> i32
  %1 = flex.buffer_load @doc[%kv] : (i32) -> i32
  %2 = arith.cmpi eq, %0, %1 : i32
  flex.yield %2 : i1
}
// CHECK-LABEL: func.func @mask_row_document(
// CHECK-NOT: func.func @mask_block_class_document
