// The element-type table (see dtype.h).
#include "vm/dtype.h"

#include <cctype>

namespace blue {

namespace {
constexpr DTypeInfo kDTypes[] = {
#define BLUE_DTYPE_INFO(name, id, be, bb, sup) {DType::name, #name, be, bb, sup},
    BLUE_DTYPES(BLUE_DTYPE_INFO)
#undef BLUE_DTYPE_INFO
};
}  // namespace

std::optional<DTypeInfo> dtypeInfo(uint32_t ggml_id) {
    for (const DTypeInfo& info : kDTypes) {
        if (uint32_t(info.type) == ggml_id) return info;
    }
    return std::nullopt;
}

std::string_view dtypeName(DType t) {
    auto info = dtypeInfo(t);
    return info ? info->name : std::string_view("?");
}

std::optional<DType> dtypeFromName(std::string_view name) {
    for (const DTypeInfo& info : kDTypes) {
        if (info.name.size() != name.size()) continue;
        bool same = true;
        for (size_t i = 0; i < name.size() && same; ++i) {
            same = std::toupper(static_cast<unsigned char>(name[i])) == info.name[i];
        }
        if (same) return info.type;
    }
    return std::nullopt;
}

std::optional<uint64_t> dtypeRowBytes(DType t, uint64_t n) {
    auto info = dtypeInfo(t);
    if (!info || n % info->block_elems != 0) return std::nullopt;
    return n / info->block_elems * info->block_bytes;
}

}  // namespace blue
