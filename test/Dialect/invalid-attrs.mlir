// The dialect verifies the analysis attributes passes attach to flex.mod.
// RUN: pagedc-opt %s -split-input-file -verify-diagnostics

// expected-error @+1 {{'flex.mod' op attribute 'flex.reads' must be an array of "b", "h", "q" or "kv" in argument order, found "q"}}
flex.mod mask @m(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1
    attributes {flex.reads = ["kv", "q"]} {
  %r = arith.cmpi sge, %q, %kv : i32
  flex.yield %r : i1
}

// -----

// expected-error @+1 {{'flex.mod' op attribute 'flex.reads' must be an array of "b", "h", "q" or "kv" in argument order, found "s"}}
flex.mod score @m(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32
    attributes {flex.reads = ["s"]} {
  flex.yield %s : f32
}

// -----

// expected-error @+1 {{'flex.mod' op attribute 'flex.reads' must be an array of "b", "h", "q" or "kv" in argument order}}
flex.mod mask @m(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1
    attributes {flex.reads = "q"} {
  %r = arith.cmpi sge, %q, %kv : i32
  flex.yield %r : i1
}

// -----

// expected-error @+1 {{'flex.mod' op attribute 'flex.buffers' must be an array of symbol references, found "doc"}}
flex.mod mask @m(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1
    attributes {flex.buffers = ["doc"]} {
  %r = arith.cmpi sge, %q, %kv : i32
  flex.yield %r : i1
}

// -----

// expected-error @+1 {{'flex.mod' op attribute 'flex.params' must be an array of symbol references, found 3 : i64}}
flex.mod mask @m(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1
    attributes {flex.params = [3]} {
  %r = arith.cmpi sge, %q, %kv : i32
  flex.yield %r : i1
}

// -----

// expected-error @+1 {{'flex.mod' op attribute 'flex.diagonal' must be a unit attribute}}
flex.mod mask @m(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1
    attributes {flex.diagonal = true} {
  %r = arith.cmpi sge, %q, %kv : i32
  flex.yield %r : i1
}

// -----

// expected-error @+1 {{unknown flex attribute 'flex.diagonals'}}
flex.mod mask @m(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1
    attributes {flex.diagonals} {
  %r = arith.cmpi sge, %q, %kv : i32
  flex.yield %r : i1
}

// -----

// expected-error @+1 {{'flex.reads' may only be attached to a flex.mod}}
func.func @f() attributes {flex.reads = []} {
  return
}
