// Bindings and push constants shared by every BlueVM kernel. Define BLUE_CONTROL_COHERENT as
// `coherent` before including this where invocations of one dispatch communicate through the
// control buffer (the sequencer); tensor kernels leave it empty.
#extension GL_GOOGLE_include_directive : require

#include "blue_config.h"
#include "vm/abi.h"

#ifndef BLUE_CONTROL_COHERENT
#define BLUE_CONTROL_COHERENT
#endif

layout(set = 0, binding = BLUE_BIND_CONTROL, std430) BLUE_CONTROL_COHERENT buffer Control {
    uint ctl[];
};
layout(set = 0, binding = BLUE_BIND_CONTROL, std430) BLUE_CONTROL_COHERENT buffer ControlI {
    int ctl_i[];
};
layout(set = 0, binding = BLUE_BIND_IO, std430) coherent buffer IO {
    uint io[];
};
layout(set = 0, binding = BLUE_BIND_PAGES, std430) buffer PageU {
    uint d[];
} page_u[BLUE_MAX_PAGES];
layout(set = 0, binding = BLUE_BIND_PAGES, std430) buffer PageF {
    float d[];
} page_f[BLUE_MAX_PAGES];
layout(set = 0, binding = BLUE_BIND_PAGES, std430) buffer PageV4 {
    vec4 d[];
} page_v4[BLUE_MAX_PAGES];

// Per-dispatch texel views of the tensor operands' pages (blue_config.h, set 1): the fast read
// path on CPU-backed drivers (lavapipe vectorizes image loads; its storage-buffer loads are
// per-lane scalar loops). `op` must be a constant: the operand's position in the instruction.
layout(set = BLUE_SET_OPERANDS, binding = 0, rgba32ui) uniform readonly uimageBuffer tex[BLUE_MAX_TEX_OPERANDS];

#define TEXEL(op, index) imageLoad(tex[op], int(index))
#define TEXELF(op, index) uintBitsToFloat(imageLoad(tex[op], int(index)))

layout(push_constant) uniform Push {
    uint w[BLUE_PUSH_WORDS];
} pc;
