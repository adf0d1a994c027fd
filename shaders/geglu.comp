#version 450
#extension GL_GOOGLE_include_directive : require
// GEGLU: dst = gelu(a) * b, gelu with tanh written as x / (1 + exp(-2y)), y = sqrt(2/pi)(x + 0.044715x^3)
// (tanh of a large argument is undefined in some drivers; exp overflows to inf, giving 0 or x).
#define ELEM_BINARY
#define ELEM_OP(x, y) ((x) / (1.0 + exp(-1.5957691216 * ((x) + 0.044715 * (x) * (x) * (x)))) * (y))
#include "common/elementwise.glsl"
