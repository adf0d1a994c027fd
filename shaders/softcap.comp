#version 450
#extension GL_GOOGLE_include_directive : require
// SOFTCAP: dst = f * tanh(a / f), tanh written as 1 - 2 / (exp(2x) + 1) (defined for any x).
#define ELEM_OP(x, y) ((y) * (1.0 - 2.0 / (exp(2.0 * (x) / (y)) + 1.0)))
#include "common/elementwise.glsl"
