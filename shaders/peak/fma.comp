#version 450
// Device ceiling: FP32 fused multiply-add throughput (host/peak.cpp). CHAINS independent vec4
// chains x = x * m + c, unrolled eight times per iteration, so the compiler can keep them in
// flight at once; the result is written so nothing is optimised away. 2 * 4 * 8 * CHAINS FLOPs per
// invocation per iteration (a multiply and an add per lane, whether or not the compiler fuses).
layout(local_size_x_id = 0) in;

layout(set = 0, binding = 1, std430) writeonly buffer Out { float words[]; } result;

layout(push_constant) uniform Params {
    uint iterations;
    float m;  // close to 1, so the chains stay finite
} pc;

void main() {
    uint id = gl_GlobalInvocationID.x;
    vec4 c = vec4(float(id & 7u) * 1e-3, 1e-3, -1e-3, 2e-3);
    vec4 x[CHAINS];
    for (int k = 0; k < CHAINS; ++k) x[k] = vec4(float(k) + 0.5, 0.25, -0.5, float(id & 3u));
    for (uint i = 0u; i < pc.iterations; ++i) {
        for (int u = 0; u < 8; ++u) {
            for (int k = 0; k < CHAINS; ++k) x[k] = fma(x[k], vec4(pc.m), c);
        }
    }
    vec4 s = vec4(0.0);
    for (int k = 0; k < CHAINS; ++k) s += x[k];
    result.words[id] = s.x + s.y + s.z + s.w;
}
