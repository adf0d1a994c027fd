#version 450
#extension GL_GOOGLE_include_directive : require
// TMUL: dst = a * b.
#define ELEM_BINARY
#define ELEM_OP(x, y) ((x) * (y))
#include "common/elementwise.glsl"
