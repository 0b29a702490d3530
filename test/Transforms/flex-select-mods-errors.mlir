// -flex-select-mods names the mod it cannot find.
// RUN: pagedc-opt %s -flex-select-mods=mods=causal,nope -verify-diagnostics

// expected-error @+1 {{-flex-select-mods: there is no mod named 'nope'}}
module {
  flex.mod mask @causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
    %0 = arith.cmpi sge, %q, %kv : i32
    flex.yield %0 : i1
  }
}
