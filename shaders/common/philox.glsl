// Philox4x32-10, the GPU twin of vm/philox.h: the same (seed, counter) gives the same number.
uvec4 philox4x32(uvec4 ctr, uvec2 key) {
    const uint kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
    const uint kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
    for (int round = 0; round < 10; ++round) {
        uint hi0, lo0, hi1, lo1;
        umulExtended(kM0, ctr.x, hi0, lo0);
        umulExtended(kM1, ctr.z, hi1, lo1);
        ctr = uvec4(hi1 ^ ctr.y ^ key.x, lo1, hi0 ^ ctr.w ^ key.y, lo0);
        key += uvec2(kW0, kW1);
    }
    return ctr;
}

float philoxUniform(uint seed, uint counter) {
    uvec4 r = philox4x32(uvec4(counter, 0u, 0u, 0u), uvec2(seed, 0x426C7565u));
    return float(r.x >> 8) * (1.0 / 16777216.0);
}
