// The contract a custom kernel keeps: SPIR-V a module carries (section KERNELS, run by the tensor
// instruction KERNEL) may declare exactly these resources and nothing else. Plain #defines only,
// so GLSL kernels may copy them and C++ checks them (vm/kernel.cpp, host/machine_kernel.cpp).
//
// A custom kernel runs once per item: one workgroup per instance that asked for its block, the
// item being gl_WorkGroupID.y (gl_WorkGroupID.x is 0; gl_NumWorkGroups.y is the item count).
//
//   layout(local_size_x = X, local_size_y = Y, local_size_z = Z) in;  // X*Y*Z <= 256
//   layout(set = 0, binding = 0) readonly buffer Items { uint items[]; };
//   layout(set = 0, binding = 1) readonly buffer Slots { uint slots[]; };
//   layout(set = 0, binding = 2) buffer Results { float results[]; };  // or uint
//   layout(set = 0, binding = 3) buffer Out { uint out_slots[]; };      // `filter ... into` only
//   layout(push_constant) uniform Args {
//       uint items_base, in_base, in_stride, out_base, out_stride, param,
//            out_slot_base, out_slot_stride;  // a prefix may do
//   } args;
//
//   item i's instance:  n = items[items_base + i]
//   n's slot:           slots[in_base + n * in_stride]: its length in tokens, then the tokens
//                       (capacity in_stride - 1)
//   n's results:        BLUE_KERNEL_RESULT_WORDS words from results[out_base + n * out_stride]
//   param:              the `score ... param` value (a number, or a text's one token)
//   n's written slot:   out_slots[out_slot_base + n * out_slot_stride]: the kernel writes the
//                       length, then the tokens (capacity out_slot_stride - 1); the program
//                       copies them into the target slot, clamping the length to its capacity
//
// Bindings 0 and 1 must be declared readonly; any binding may be left out, and binding 3 only
// a kernel run by `filter` may declare (the verifier checks it against the instruction). No other set,
// binding, image, sampler, uniform buffer or physical pointer; no capability beyond Shader (and
// Matrix, implied by it), so that every Vulkan 1.2 device runs it; workgroup (shared) memory at
// most BLUE_KERNEL_MAX_SHARED bytes, the minimum every Vulkan device offers.
#ifndef BLUE_VM_KERNEL_ABI_H
#define BLUE_VM_KERNEL_ABI_H

#define BLUE_KERNEL_BIND_ITEMS 0
#define BLUE_KERNEL_BIND_SLOTS 1
#define BLUE_KERNEL_BIND_RESULTS 2
#define BLUE_KERNEL_BIND_OUT 3
#define BLUE_KERNEL_BINDINGS 4

#define BLUE_KERNEL_PC_ITEMS_BASE 0
#define BLUE_KERNEL_PC_IN_BASE 1
#define BLUE_KERNEL_PC_IN_STRIDE 2
#define BLUE_KERNEL_PC_OUT_BASE 3
#define BLUE_KERNEL_PC_OUT_STRIDE 4
#define BLUE_KERNEL_PC_PARAM 5
#define BLUE_KERNEL_PC_OUT_SLOT_BASE 6
#define BLUE_KERNEL_PC_OUT_SLOT_STRIDE 7
#define BLUE_KERNEL_PUSH_WORDS 8

#define BLUE_KERNEL_RESULT_WORDS 16       // most result words per instance
#define BLUE_KERNEL_MAX_INVOCATIONS 256u  // local_size_x * y * z
#define BLUE_KERNEL_MAX_SHARED 16384u     // bytes of workgroup memory
#define BLUE_KERNEL_MAX_WORDS (1u << 20)  // SPIR-V words per kernel (4 MiB)
#define BLUE_KERNEL_MAX_COUNT 64u         // kernels per module

#endif  // BLUE_VM_KERNEL_ABI_H
