// Reading weight matrices in the GPU weight layout (host/weight_layout.h documents it): rows
// interleaved by 8, each row cut into gblocks of WL_E elements stored in WL_T texels. Define one
// WTYPE_* (and WL_OPERAND, the weight's operand position, default 1) before including. Provides
//   wTexel(base, bpr, row, g, t)        texel t of gblock g of `row`
//   wGroup(base, bpr, row, g, s, w)     elements 32s..32s+31 of gblock g (256-element types)
//   wElement(base, bpr, row, i)         one element (slow; for EMBED)
// base: the tensor's first texel; bpr: gblocks per row = ceil(K / WL_E).
#ifndef WL_OPERAND
#define WL_OPERAND 1
#endif

#if defined(WTYPE_F32)
#define WL_E 4u
#define WL_T 1u
#define WL_PLAIN
#elif defined(WTYPE_F16) || defined(WTYPE_BF16)
#define WL_E 8u
#define WL_T 1u
#define WL_PLAIN
#elif defined(WTYPE_Q8_0)
#define WL_E 256u
#define WL_T 17u
#elif defined(WTYPE_Q4_0)
#define WL_E 256u
#define WL_T 9u
#elif defined(WTYPE_Q4_1)
#define WL_E 256u
#define WL_T 10u
#elif defined(WTYPE_Q5_0)
#define WL_E 256u
#define WL_T 11u
#elif defined(WTYPE_Q5_1)
#define WL_E 256u
#define WL_T 12u
#elif defined(WTYPE_Q2_K)
#define WL_E 256u
#define WL_T 6u
#elif defined(WTYPE_Q3_K)
#define WL_E 256u
#define WL_T 7u
#elif defined(WTYPE_Q4_K)
#define WL_E 256u
#define WL_T 9u
#elif defined(WTYPE_Q5_K)
#define WL_E 256u
#define WL_T 11u
#elif defined(WTYPE_Q6_K)
#define WL_E 256u
#define WL_T 14u
#else
#error "define a WTYPE_* for common/wlayout.glsl"
#endif

uint wIndex(uint base, uint bpr, uint row, uint g, uint t) {
    return base + (((row >> 3) * bpr + g) * WL_T + t) * 8u + (row & 7u);
}
uvec4 wTexel(uint base, uint bpr, uint row, uint g, uint t) {
    return TEXEL(WL_OPERAND, wIndex(base, bpr, row, g, t));
}

// The elements of a plain-type texel, as two vec4 (F16/BF16) or one (F32, second unused).
void plainTexel(uvec4 q, out vec4 a, out vec4 b) {
#if defined(WTYPE_F32)
    a = uintBitsToFloat(q);
    b = vec4(0.0);
#elif defined(WTYPE_F16)
    a = vec4(unpackHalf2x16(q.x), unpackHalf2x16(q.y));
    b = vec4(unpackHalf2x16(q.z), unpackHalf2x16(q.w));
#else  // BF16
    a = uintBitsToFloat(uvec4(q.x << 16, q.x & 0xFFFF0000u, q.y << 16, q.y & 0xFFFF0000u));
    b = uintBitsToFloat(uvec4(q.z << 16, q.z & 0xFFFF0000u, q.w << 16, q.w & 0xFFFF0000u));
#endif
}

uint byteOf(uvec4 t, uint i) { return (t[i >> 2] >> ((i & 3u) * 8u)) & 0xFFu; }
float halfOf(uvec4 t, uint i) { return unpackHalf2x16(t[i >> 1] >> ((i & 1u) * 16u)).x; }
vec4 bytes4(uint word) { return vec4((uvec4(word) >> uvec4(0u, 8u, 16u, 24u)) & 0xFFu); }
vec4 sbytes4(uint word) { return vec4(ivec4(uvec4(word) << uvec4(24u, 16u, 8u, 0u)) >> 24); }

#ifndef WL_PLAIN
// Elements 32s .. 32s+31 of gblock g, as 8 vec4.
void wGroup(uint base, uint bpr, uint row, uint g, uint s, out vec4 w[8]) {
#if defined(WTYPE_Q8_0)
    float d = halfOf(wTexel(base, bpr, row, g, 0u), s);
    uvec4 a = wTexel(base, bpr, row, g, 1u + 2u * s), b = wTexel(base, bpr, row, g, 2u + 2u * s);
    for (uint j = 0u; j < 4u; ++j) {
        w[j] = d * sbytes4(a[j]);
        w[j + 4u] = d * sbytes4(b[j]);
    }
#elif defined(WTYPE_Q4_0) || defined(WTYPE_Q4_1) || defined(WTYPE_Q5_0) || defined(WTYPE_Q5_1)
    float d = halfOf(wTexel(base, bpr, row, g, 0u), s);
#if defined(WTYPE_Q4_1) || defined(WTYPE_Q5_1)
    float m = halfOf(wTexel(base, bpr, row, g, 1u), s);
    const uint qh_t = 2u;
#elif defined(WTYPE_Q4_0)
    const float m_off = -8.0;
    const uint qh_t = 1u;
#else
    const float m_off = -16.0;
    const uint qh_t = 1u;
#endif
#if defined(WTYPE_Q5_0) || defined(WTYPE_Q5_1)
    uint qh = wTexel(base, bpr, row, g, qh_t + (s >> 2))[s & 3u];
    uvec4 q = wTexel(base, bpr, row, g, qh_t + 2u + s);
#else
    uvec4 q = wTexel(base, bpr, row, g, qh_t + s);
#endif
    for (uint j = 0u; j < 4u; ++j) {
        uvec4 lo = (uvec4(q[j]) >> uvec4(0u, 8u, 16u, 24u)) & 15u;
        uvec4 hi = (uvec4(q[j]) >> uvec4(4u, 12u, 20u, 28u)) & 15u;
#if defined(WTYPE_Q5_0) || defined(WTYPE_Q5_1)
        lo |= ((uvec4(qh) >> (uvec4(0u, 1u, 2u, 3u) + 4u * j)) & 1u) << 4;
        hi |= ((uvec4(qh) >> (uvec4(16u, 17u, 18u, 19u) + 4u * j)) & 1u) << 4;
#endif
#if defined(WTYPE_Q4_1) || defined(WTYPE_Q5_1)
        w[j] = d * vec4(lo) + m;
        w[j + 4u] = d * vec4(hi) + m;
#else
        w[j] = d * (vec4(lo) + m_off);
        w[j + 4u] = d * (vec4(hi) + m_off);
#endif
    }
#else  // K-quants: the whole llama block is in texels 0 .. WL_T-1
    uvec4 blk[WL_T];
    for (uint t = 0u; t < WL_T; ++t) blk[t] = wTexel(base, bpr, row, g, t);
#define KB(i) ((blk[(i) >> 4][((i) >> 2) & 3u] >> (((i) & 3u) * 8u)) & 0xFFu)
#define KH(i) unpackHalf2x16(blk[(i) >> 4][((i) >> 2) & 3u] >> (((i) & 2u) * 8u)).x
#if defined(WTYPE_Q4_K) || defined(WTYPE_Q5_K)
    float d = KH(0u), dmin = KH(2u);
    uint sc, mn;
    if (s < 4u) {
        sc = KB(4u + s) & 63u;
        mn = KB(8u + s) & 63u;
    } else {
        sc = (KB(8u + s) & 15u) | ((KB(s) >> 6) << 4);
        mn = (KB(8u + s) >> 4) | ((KB(4u + s) >> 6) << 4);
    }
    float scale = d * float(sc), minv = dmin * float(mn);
#if defined(WTYPE_Q4_K)
    const uint qs = 16u;
#else
    const uint qs = 48u;
#endif
    for (uint e = 0u; e < 32u; e += 4u) {
        vec4 v;
        for (uint k = 0u; k < 4u; ++k) {
            uint l = e + k;
            uint q = (KB(qs + 32u * (s >> 1) + l) >> (4u * (s & 1u))) & 15u;
#if defined(WTYPE_Q5_K)
            q |= ((KB(16u + l) >> s) & 1u) << 4;
#endif
            v[k] = scale * float(q) - minv;
        }
        w[e >> 2] = v;
    }
#elif defined(WTYPE_Q6_K)
    float d = KH(208u);
    uint h = s >> 2, k = s & 3u;
    for (uint e = 0u; e < 32u; e += 4u) {
        vec4 v;
        for (uint c = 0u; c < 4u; ++c) {
            uint l = e + c;
            uint lo = (KB(64u * h + 32u * (k & 1u) + l) >> (4u * (k >> 1))) & 15u;
            uint hi = (KB(128u + 32u * h + l) >> (2u * k)) & 3u;
            int sc = int(KB(192u + 8u * h + 2u * k + l / 16u) << 24) >> 24;
            v[c] = d * float(sc) * float(int(lo | (hi << 4)) - 32);
        }
        w[e >> 2] = v;
    }
#elif defined(WTYPE_Q2_K)
    float d = KH(80u), dmin = KH(82u);
    uint h = s >> 2, j = s & 3u;
    for (uint e = 0u; e < 32u; e += 4u) {
        vec4 v;
        for (uint c = 0u; c < 4u; ++c) {
            uint l = e + c;
            uint q = (KB(16u + 32u * h + l) >> (2u * j)) & 3u;
            uint sb = KB(8u * h + 2u * j + l / 16u);
            v[c] = d * float(sb & 15u) * float(q) - dmin * float(sb >> 4);
        }
        w[e >> 2] = v;
    }
#elif defined(WTYPE_Q3_K)
    float d = KH(108u);
    uint h = s >> 2, j = s & 3u;
    for (uint e = 0u; e < 32u; e += 4u) {
        vec4 v;
        for (uint c = 0u; c < 4u; ++c) {
            uint l = e + c;
            uint sidx = 8u * h + 2u * j + l / 16u;
            uint low = sidx < 8u ? (KB(96u + sidx) & 15u) : (KB(96u + sidx - 8u) >> 4);
            uint high = (KB(104u + (sidx & 3u)) >> (2u * (sidx >> 2))) & 3u;
            int sc = int(low | (high << 4)) - 32;
            uint q = (KB(32u + 32u * h + l) >> (2u * j)) & 3u;
            uint hb = (KB(l) >> (4u * h + j)) & 1u;
            v[c] = d * float(sc) * float(int(q | (hb << 2)) - 4);
        }
        w[e >> 2] = v;
    }
#endif
#undef KB
#undef KH
#endif
}
#endif

// One element of `row` (element i), for EMBED.
float wElement(uint base, uint bpr, uint row, uint i) {
#ifdef WL_PLAIN
    vec4 a, b;
    plainTexel(wTexel(base, bpr, row, i / WL_E, 0u), a, b);
    uint j = i % WL_E;
    return j < 4u ? a[j] : b[j - 4u];
#else
    vec4 w[8];
    wGroup(base, bpr, row, i / WL_E, (i % WL_E) / 32u, w);
    uint j = i % 32u;
    return w[j >> 2][j & 3u];
#endif
}
