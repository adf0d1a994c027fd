#version 450
#extension GL_GOOGLE_include_directive : require
// SWIGLU: dst = silu(a) * b.
#define ELEM_BINARY
#define ELEM_OP(x, y) ((x) / (1.0 + exp(-(x))) * (y))
#include "common/elementwise.glsl"
