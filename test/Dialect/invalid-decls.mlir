// Verifier errors of the declarations: flex.const_decl, flex.param and
// flex.buffer.
// RUN: pagedc-opt %s -split-input-file -verify-diagnostics

// expected-error @+1 {{'flex.const_decl' op value must be an i1, i32, i64 or f32 constant, got 1.000000e+00 : f64}}
flex.const_decl @X = 1.0 : f64

// -----

// expected-error @+1 {{'flex.const_decl' op value must be an i1, i32, i64 or f32 constant, got "text"}}
flex.const_decl @X = "text"

// -----

// expected-error @+1 {{'flex.const_decl' op value must be an i1, i32, i64 or f32 constant, got 7 : i16}}
flex.const_decl @X = 7 : i16

// -----

// expected-error @+1 {{'flex.param' op type must be i32, f32 or i1, got 'i64'}}
flex.param @p : i64

// -----

// expected-error @+1 {{'flex.param' op default value 1 : i32 does not have the param's type 'f32'}}
flex.param @p : f32 = 1 : i32

// -----

// expected-error @+1 {{'flex.buffer' op element type must be i32, i64, f32, f16, bf16 or i1, got 'f64'}}
flex.buffer @b : f64 [4]

// -----

// expected-error @+1 {{'flex.buffer' op rank must be 1 to 4, got 0}}
flex.buffer @b : f32 []

// -----

// expected-error @+1 {{'flex.buffer' op rank must be 1 to 4, got 5}}
flex.buffer @b : f32 [1, 2, 3, 4, 5]

// -----

// expected-error @+1 {{'flex.buffer' op fixed dimensions must be positive, got 0}}
flex.buffer @b : f32 [0]

// -----

// expected-error @+1 {{'flex.buffer' op a dimension must be an integer, a name or unit (any size), got 1.500000e+00 : f32}}
"flex.buffer"() <{sym_name = "b", element_type = f32, dims = [1.5 : f32]}> : () -> ()

// -----

// expected-error @+1 {{'flex.buffer' op dimension names must not be empty}}
"flex.buffer"() <{sym_name = "b", element_type = f32, dims = [""]}> : () -> ()

// -----

// expected-error @+1 {{expected a dimension: an integer, a name or '?'}}
flex.buffer @b : f32 [*]

// -----

flex.const_decl @X = 1 : i32
// expected-error @+2 {{redefinition of symbol named 'X'}}
// expected-note @-2 {{see existing symbol definition here}}
flex.param @X : i32
