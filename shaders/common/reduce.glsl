// Workgroup reductions over REDUCE_WG invocations (define REDUCE_WG before including). Every
// invocation gets the result. Fixed order, so results are deterministic.
shared float reduce_f[REDUCE_WG];

float workgroupSum(float v) {
    uint lid = gl_LocalInvocationID.x;
    barrier();
    reduce_f[lid] = v;
    barrier();
    for (uint s = REDUCE_WG / 2u; s > 0u; s >>= 1) {
        if (lid < s) reduce_f[lid] += reduce_f[lid + s];
        barrier();
    }
    return reduce_f[0];
}

float workgroupMax(float v) {
    uint lid = gl_LocalInvocationID.x;
    barrier();
    reduce_f[lid] = v;
    barrier();
    for (uint s = REDUCE_WG / 2u; s > 0u; s >>= 1) {
        if (lid < s) reduce_f[lid] = max(reduce_f[lid], reduce_f[lid + s]);
        barrier();
    }
    return reduce_f[0];
}
