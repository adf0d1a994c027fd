#version 450
// Device ceiling: streaming read bandwidth (host/peak.cpp). Every texel of the source buffer is
// read exactly once; the invocations XOR what they read into one word each, so nothing is
// optimised away and the host can check that all of it was read. Walks: invocations form groups
// of G lanes (push constant); each group owns a contiguous chunk and lane l of the group reads
// texels base + G*j + l, four independent loads in flight. G = 8 is lavapipe's subgroup walking
// its own chunk; G = all invocations is the GPU-style "lane i reads base + i" over the grid.
// Source: SOURCE_IMAGE (uimageBuffer, imageLoad), SOURCE_SAMPLER (usamplerBuffer, texelFetch)
// or neither (a storage buffer of uvec4).
layout(local_size_x_id = 0) in;

#if defined(SOURCE_IMAGE)
layout(set = 0, binding = 0, rgba32ui) uniform readonly uimageBuffer src;
uvec4 load(uint t) { return imageLoad(src, int(t)); }
#elif defined(SOURCE_SAMPLER)
layout(set = 0, binding = 0) uniform usamplerBuffer src;
uvec4 load(uint t) { return texelFetch(src, int(t)); }
#else
layout(set = 0, binding = 0, std430) readonly buffer Src { uvec4 texels[]; } src;
uvec4 load(uint t) { return src.texels[t]; }
#endif
layout(set = 0, binding = 1, std430) writeonly buffer Out { uint words[]; } result;

layout(push_constant) uniform Params {
    uint texels;  // in the source; a multiple of (invocations * 4)
    uint group;   // lanes per walk (divides the invocations)
} pc;

void main() {
    uint id = gl_GlobalInvocationID.x;
    uint invocations = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    uint lane = id % pc.group, chunk = id / pc.group;
    uint chunk_texels = pc.texels / (invocations / pc.group);
    uint base = chunk * chunk_texels + lane;
    uvec4 a0 = uvec4(0u), a1 = uvec4(0u), a2 = uvec4(0u), a3 = uvec4(0u);
    uint step = pc.group * 4u;
    for (uint j = 0u; j < chunk_texels; j += step) {
        a0 ^= load(base + j);
        a1 ^= load(base + j + pc.group);
        a2 ^= load(base + j + 2u * pc.group);
        a3 ^= load(base + j + 3u * pc.group);
    }
    uvec4 a = a0 ^ a1 ^ a2 ^ a3;
    result.words[id] = a.x ^ a.y ^ a.z ^ a.w;
}
