// The GPU layout of weight matrices. Files keep llama.cpp's byte layouts; on upload every 2-D
// WEIGHT tensor is repacked (same information, nearly the same size) into a layout that kernels
// read with whole 16-byte texel loads:
//
//   - the row is cut into "gblocks" of E elements stored in T texels:
//       F32: E = 4, T = 1     F16/BF16: E = 8, T = 1
//       Q8_0 / Q4_0 / IQ4_NL / Q4_1 / Q5_0 / Q5_1: E = 256 (8 llama blocks),
//       T = 17 / 9 / 9 / 10 / 11 / 12:
//         texel 0: the 8 blocks' f16 scales d (block b: word b/2, half b%2);
//         Q4_1/Q5_1: next texel their mins m; Q5_0/Q5_1: next 2 texels the 8 blocks' qh words;
//         then each block's quant bytes (1 texel, Q8_0 2) unchanged;
//       K-quants, TQ1_0, TQ2_0: E = 256, one llama block padded with zeros to T = ceil(bytes / 16)
//         texels;
//       MXFP4: E = 256 (8 llama blocks), T = 9: bytes 0..7 of texel 0 the 8 blocks' E8M0 scales,
//         texel 1 + b block b's 16 quant bytes;
//       IQ4_XS: E = 256, T = 9: texel 0 the block's 8 header bytes (d, scales_h, scales_l) and 8
//         zeros, texel 1 + s the 16 quant bytes of sub-block s;
//   - rows are padded to a multiple of 8 and interleaved by 8, so the 8 lanes of a SIMD group
//     that own rows 8o..8o+7 read adjacent texels:
//       texel(row, gblock g, t) = ((row / 8) * gblocks_per_row + g) * T + t) * 8 + row % 8
//   - padding (elements past K, rows past N) is zero, which contributes nothing.
// shaders/common/wlayout.glsl reads the same layout.
#pragma once

#include <cstdint>

#include "vm/dtype.h"

namespace blue {

struct WeightLayout {
    uint32_t block_elems = 1;     // E
    uint32_t block_texels = 1;    // T
    uint64_t blocks_per_row = 0;  // ceil(K / E)
    uint64_t rows_padded = 0;     // N rounded up to 8
    uint64_t bytes = 0;           // total size in the page
};

// The GPU layout of a [K, N] matrix of `type`, or nullopt when the type has no GPU layout.
bool weightLayout(DType type, uint64_t k, uint64_t n, WeightLayout* out);

// Repacks rows [row_begin, row_end) (a multiple of 8 apart, or to N) of a llama-layout matrix into
// `dst`, the start of the tensor's GPU storage (layout.bytes, zeroed beforehand).
void repackRows(DType type, const uint8_t* src, uint64_t k, uint64_t n, const WeightLayout& layout,
                uint64_t row_begin, uint64_t row_end, uint8_t* dst);

// Repacks a whole matrix using `threads` threads (0: hardware concurrency).
void repackMatrix(DType type, const uint8_t* src, uint64_t k, uint64_t n, const WeightLayout& layout,
                  uint8_t* dst, unsigned threads = 0);

}  // namespace blue
