// The GLU activations, one expression each for the element-wise kernels (SWIGLU, GEGLU) and the
// matmul epilogue that fuses them (MATMULGLU): both give the same floats. gelu is the tanh form
// written as x / (1 + exp(-2y)), y = sqrt(2/pi)(x + 0.044715x^3) (tanh of a large argument is
// undefined in some drivers; exp overflows to inf, giving 0 or x). vm/tensor_ops_internal.h has the
// reference.
#include "blue_config.h"
float siluTimes(float x, float y) { return x / (1.0 + exp(-x)) * y; }
float geluTimes(float x, float y) { return x / (1.0 + exp(-1.5957691216 * (x + 0.044715 * x * x * x))) * y; }

// MATMUL's epilogue (blue_config.h BLUE_MM_*): a product v given what dst holds.
float mmEpilogue(uint mode, float v, float old) {
    if (mode == BLUE_MM_ADD) return old + v;
    if (mode == BLUE_MM_SILU) return siluTimes(v, old);
    return geluTimes(v, old);
}
