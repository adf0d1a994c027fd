#version 450
#extension GL_GOOGLE_include_directive : require
// TSCALE: dst = a * f.
#define ELEM_OP(x, y) ((x) * (y))
#include "common/elementwise.glsl"
