// RUN: pagedc-opt %s --convert-flex-to-cpu --split-input-file --verify-diagnostics
// RUN: not pagedc-opt %s --convert-flex-to-cpu=mods=nope 2>&1 | FileCheck %s --check-prefix=MISSING

// Selecting a mod the module does not have names it.
// MISSING: error: no mod named 'nope'

// Calls must be inlined (-flex-inline-mods) before the CPU conversion.
flex.mod mask @causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %0 = arith.cmpi sge, %q, %kv : i32
  flex.yield %0 : i1
}
flex.mod mask @outer(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  // expected-error @+1 {{flex.call remains: run -flex-inline-mods before the CPU conversion}}
  %0 = flex.call @causal(%b, %h, %q, %kv) : (i32, i32, i32, i32) -> i1
  flex.yield %0 : i1
}
