#version 450
// A custom kernel that writes a slot (contract: vm/kernel_abi.h), for `filter SLOT with drop into
// TARGET param TOKEN`: the slot's tokens without `param`, in order. results[0] = tokens dropped.
// One invocation does the work: the order of the kept tokens is a running count, and slots are
// short; a long slot would use a prefix sum over the workgroup.
layout(local_size_x = 1) in;

layout(set = 0, binding = 0) readonly buffer Items { uint items[]; };
layout(set = 0, binding = 1) readonly buffer Slots { uint slots[]; };
layout(set = 0, binding = 2) buffer Results { float results[]; };
layout(set = 0, binding = 3) buffer Out { uint out_slots[]; };
layout(push_constant) uniform Args {
    uint items_base, in_base, in_stride, out_base, out_stride, param, out_slot_base,
        out_slot_stride;
} args;

void main() {
    uint inst = items[args.items_base + gl_WorkGroupID.y];
    uint base = args.in_base + inst * args.in_stride;
    uint len = min(slots[base], args.in_stride - 1u);
    uint to = args.out_slot_base + inst * args.out_slot_stride;
    uint cap = args.out_slot_stride - 1u, kept = 0u;
    for (uint i = 0u; i < len; ++i) {
        uint t = slots[base + 1u + i];
        if (t != args.param && kept < cap) {
            out_slots[to + 1u + kept] = t;
            ++kept;
        }
    }
    out_slots[to] = kept;
    results[args.out_base + inst * args.out_stride] = float(len - kept);
}
