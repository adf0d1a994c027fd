// Element types of tensors: the GGML type ids used by GGUF files and by Blue-IR tensor tables.
// One table (BLUE_DTYPES) gives each type its id, name, elements per block and bytes per block;
// byte layouts of the quantized blocks are exactly llama.cpp's (see vm/quant.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace blue {

// X(name, ggml_id, block_elems, block_bytes, supported)
// `supported`: BlueVM can load, dequantize and compute with it. Unsupported ids are still named so
// errors can say "tensor 'blk.0.attn_q.weight' has type IQ2_XXS, which BlueVM does not support".
#define BLUE_DTYPES(X)              \
    X(F32, 0, 1, 4, true)           \
    X(F16, 1, 1, 2, true)           \
    X(Q4_0, 2, 32, 18, true)        \
    X(Q4_1, 3, 32, 20, true)        \
    X(Q5_0, 6, 32, 22, true)        \
    X(Q5_1, 7, 32, 24, true)        \
    X(Q8_0, 8, 32, 34, true)        \
    X(Q8_1, 9, 32, 36, true)        \
    X(Q2_K, 10, 256, 84, true)      \
    X(Q3_K, 11, 256, 110, true)     \
    X(Q4_K, 12, 256, 144, true)     \
    X(Q5_K, 13, 256, 176, true)     \
    X(Q6_K, 14, 256, 210, true)     \
    X(Q8_K, 15, 256, 292, true)     \
    X(IQ2_XXS, 16, 256, 66, false)  \
    X(IQ2_XS, 17, 256, 74, false)   \
    X(IQ3_XXS, 18, 256, 98, false)  \
    X(IQ1_S, 19, 256, 50, false)    \
    X(IQ4_NL, 20, 32, 18, true)     \
    X(IQ3_S, 21, 256, 110, false)   \
    X(IQ2_S, 22, 256, 82, false)    \
    X(IQ4_XS, 23, 256, 136, true)   \
    X(I8, 24, 1, 1, true)           \
    X(I16, 25, 1, 2, true)          \
    X(I32, 26, 1, 4, true)          \
    X(I64, 27, 1, 8, false)         \
    X(F64, 28, 1, 8, false)         \
    X(IQ1_M, 29, 256, 56, false)    \
    X(BF16, 30, 1, 2, true)         \
    X(TQ1_0, 34, 256, 54, true)     \
    X(TQ2_0, 35, 256, 66, true)     \
    X(MXFP4, 39, 32, 17, true)

enum class DType : uint32_t {
#define BLUE_DTYPE_ENUM(name, id, be, bb, sup) name = id,
    BLUE_DTYPES(BLUE_DTYPE_ENUM)
#undef BLUE_DTYPE_ENUM
};

struct DTypeInfo {
    DType type;
    std::string_view name;
    uint32_t block_elems;  // elements per block (1 for plain types)
    uint32_t block_bytes;  // bytes per block
    bool supported;
};

// Returns the description of a GGML type id, or nullopt for ids no GGML version defined.
std::optional<DTypeInfo> dtypeInfo(uint32_t ggml_id);
inline std::optional<DTypeInfo> dtypeInfo(DType t) { return dtypeInfo(uint32_t(t)); }
std::string_view dtypeName(DType t);
std::optional<DType> dtypeFromName(std::string_view name);  // case-insensitive: "q4_0", "F16"

// Bytes of a row of `n` elements, or nullopt when n is not a whole number of blocks.
std::optional<uint64_t> dtypeRowBytes(DType t, uint64_t n);

}  // namespace blue
