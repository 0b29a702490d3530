// -flex-inline-mods reports call cycles (which the front end rejects as
// recursion) instead of inlining forever.
// RUN: pagedc-opt %s -split-input-file -flex-inline-mods -verify-diagnostics

// A mod calling itself.
flex.mod mask @self(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  // expected-error @+1 {{'flex.call' op closes a call cycle through 'self'; mods cannot be recursive}}
  %r = flex.call @self(%b, %h, %q, %kv) : (i32, i32, i32, i32) -> i1
  flex.yield %r : i1
}

// -----

// A cycle through three mods is reported once, where it closes.
flex.mod score @a(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %r = flex.call @b(%s, %b, %h, %q, %kv) : (f32, i32, i32, i32, i32) -> f32
  flex.yield %r : f32
}
flex.mod score @b(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %r = flex.call @c(%s, %b, %h, %q, %kv) : (f32, i32, i32, i32, i32) -> f32
  flex.yield %r : f32
}
flex.mod score @c(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  // expected-error @+1 {{'flex.call' op closes a call cycle through 'a'; mods cannot be recursive}}
  %r = flex.call @a(%s, %b, %h, %q, %kv) : (f32, i32, i32, i32, i32) -> f32
  flex.yield %r : f32
}
