#version 450
#extension GL_GOOGLE_include_directive : require
// SWIGLU: dst = silu(a) * b.
#include "common/activations.glsl"
#define ELEM_BINARY
#define ELEM_OP(x, y) siluTimes(x, y)
#include "common/elementwise.glsl"
