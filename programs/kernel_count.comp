#version 450
// A custom kernel for programs/kernel_score.cas (contract: vm/kernel_abi.h). Per instance, over
// its slot: results[0] = how many tokens equal `param`, results[1] = the slot's length,
// results[2] = their ratio (0 for an empty slot). One workgroup per instance; a tree reduction.
layout(local_size_x = 64) in;

layout(set = 0, binding = 0) readonly buffer Items { uint items[]; };
layout(set = 0, binding = 1) readonly buffer Slots { uint slots[]; };
layout(set = 0, binding = 2) buffer Results { float results[]; };
layout(push_constant) uniform Args {
    uint items_base, in_base, in_stride, out_base, out_stride, param;
} args;

shared uint partial[64];

void main() {
    uint inst = items[args.items_base + gl_WorkGroupID.y];
    uint base = args.in_base + inst * args.in_stride;
    uint len = min(slots[base], args.in_stride - 1u);
    uint lid = gl_LocalInvocationID.x;
    uint count = 0u;
    for (uint i = lid; i < len; i += 64u) count += slots[base + 1u + i] == args.param ? 1u : 0u;
    partial[lid] = count;
    barrier();
    for (uint s = 32u; s > 0u; s >>= 1) {
        if (lid < s) partial[lid] += partial[lid + s];
        barrier();
    }
    if (lid == 0u) {
        uint at = args.out_base + inst * args.out_stride;
        results[at] = float(partial[0]);
        results[at + 1u] = float(len);
        results[at + 2u] = len > 0u ? float(partial[0]) / float(len) : 0.0;
    }
}
