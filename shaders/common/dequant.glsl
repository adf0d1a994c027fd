// Reading weights of any supported type: define exactly one WTYPE_* before including. Rows are
// rows of a GGUF tensor in llama.cpp's byte layout (vm/quant.h documents every block).
//   WBLOCK: elements per block; wrowBytes(k): bytes of a row of k elements;
//   dequantBlock(page, offset, out): the block at byte `offset` into out[0 .. WBLOCK);
//   dequantElement(page, row_offset, i): element i of the row at byte row_offset.
#include "common/bytes.glsl"

#if defined(WTYPE_F32)
#define WBLOCK 1u
uint wrowBytes(uint k) { return k * 4u; }
float dequantElement(uint page, uint row, uint i) { return page_f[page].d[row / 4u + i]; }
#elif defined(WTYPE_F16)
#define WBLOCK 1u
uint wrowBytes(uint k) { return k * 2u; }
float dequantElement(uint page, uint row, uint i) { return loadHalf(page, row + 2u * i); }
#elif defined(WTYPE_BF16)
#define WBLOCK 1u
uint wrowBytes(uint k) { return k * 2u; }
float dequantElement(uint page, uint row, uint i) { return uintBitsToFloat(loadU16(page, row + 2u * i) << 16); }
#elif defined(WTYPE_Q8_0)
// block: f16 d, int8 q[32]; x = d * q
#define WBLOCK 32u
uint wrowBytes(uint k) { return k / 32u * 34u; }
float dequantElement(uint page, uint row, uint i) {
    uint b = row + (i / 32u) * 34u;
    int q = int(loadByte(page, b + 2u + i % 32u) << 24) >> 24;
    return loadHalf(page, b) * float(q);
}
#elif defined(WTYPE_Q4_0)
// block: f16 d, u8 qs[16]; element j < 16: low nibble of qs[j], j >= 16: high nibble of qs[j-16];
// x = d * (q - 8)
#define WBLOCK 32u
uint wrowBytes(uint k) { return k / 32u * 18u; }
float dequantElement(uint page, uint row, uint i) {
    uint b = row + (i / 32u) * 18u, j = i % 32u;
    uint q = (loadByte(page, b + 2u + (j & 15u)) >> (j < 16u ? 0u : 4u)) & 15u;
    return loadHalf(page, b) * (float(q) - 8.0);
}
#else
#error "define a WTYPE_* for common/dequant.glsl"
#endif
