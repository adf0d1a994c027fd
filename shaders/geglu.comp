#version 450
#extension GL_GOOGLE_include_directive : require
// GEGLU: dst = gelu(a) * b (common/activations.glsl).
#include "common/activations.glsl"
#define ELEM_BINARY
#define ELEM_OP(x, y) geluTimes(x, y)
#include "common/elementwise.glsl"
