// SPIR-V reflection of the embedded kernels (see kernel_info.h).
#include "host/kernel_info.h"

#include <string_view>

#include <cassert>
#include <map>

#include "shaders/embedded.h"

namespace blue {

namespace {

// SPIR-V opcodes and operands this reader understands (SPIR-V specification, section 3).
constexpr uint32_t kMagic = 0x07230203u;
constexpr uint32_t kOpExecutionMode = 16, kOpCapability = 17, kOpTypeBool = 20, kOpTypeInt = 21,
                   kOpTypeFloat = 22, kOpTypeVector = 23, kOpTypeMatrix = 24, kOpTypeArray = 28,
                   kOpTypeStruct = 30, kOpTypePointer = 32, kOpConstant = 43, kOpSpecConstant = 50,
                   kOpVariable = 59;
constexpr uint32_t kModeLocalSize = 17;
constexpr uint32_t kStorageWorkgroup = 4;

// Sizes of types (bytes, packed without padding: an upper bound is not needed, a close estimate
// of what the driver reserves is) and the values of integer constants, by result id.
struct Types {
    std::map<uint32_t, uint64_t> size;
    std::map<uint32_t, uint64_t> constant;
    std::map<uint32_t, uint32_t> pointee;  // pointer type -> pointee type

    uint64_t of(uint32_t id) const {
        auto it = size.find(id);
        return it == size.end() ? 0 : it->second;
    }
};

// Records what one instruction declares. `w` points at its first operand, `n` operands follow.
void readInstruction(uint32_t op, const uint32_t* w, uint32_t n, Types& t, KernelInfo& k) {
    switch (op) {
        case kOpCapability:
            if (n >= 1) k.capabilities.insert(w[0]);
            break;
        case kOpExecutionMode:
            if (n >= 5 && w[1] == kModeLocalSize) {
                for (int i = 0; i < 3; ++i) k.local_size[i] = w[2 + i];
            }
            break;
        case kOpTypeBool:
            if (n >= 1) t.size[w[0]] = 4;
            break;
        case kOpTypeInt:
        case kOpTypeFloat:
            if (n >= 2) t.size[w[0]] = w[1] / 8;
            break;
        case kOpTypeVector:
        case kOpTypeMatrix:
            if (n >= 3) t.size[w[0]] = t.of(w[1]) * w[2];
            break;
        case kOpTypeArray:
            if (n >= 3) t.size[w[0]] = t.of(w[1]) * t.constant[w[2]];
            break;
        case kOpTypeStruct: {
            uint64_t total = 0;
            for (uint32_t i = 1; i < n; ++i) total += t.of(w[i]);
            if (n >= 1) t.size[w[0]] = total;
            break;
        }
        case kOpTypePointer:
            if (n >= 3) t.pointee[w[0]] = w[2];
            break;
        case kOpConstant:
        case kOpSpecConstant:  // its default: the built width, the widest a plan runs (kernel@W)
            if (n >= 3) t.constant[w[1]] = w[2];
            break;
        case kOpVariable:
            if (n >= 3 && w[2] == kStorageWorkgroup) k.shared_bytes += t.of(t.pointee[w[0]]);
            break;
        default:
            break;
    }
}

}  // namespace

Result<KernelInfo> reflectKernel(const std::string& name, const uint32_t* words, size_t count) {
    if (count < 5 || words[0] != kMagic) {
        return BLUE_ERROR("kernel '%s': not SPIR-V (no magic number in the first word)",
                          name.c_str());
    }
    KernelInfo k;
    k.name = name;
    k.local_size[0] = 0;
    Types types;
    for (size_t at = 5; at < count;) {
        uint32_t length = words[at] >> 16, op = words[at] & 0xFFFFu;
        if (length == 0 || at + length > count) {
            return BLUE_ERROR(
                "kernel '%s': SPIR-V word %zu: instruction of %u words runs past "
                "the end (%zu words)",
                name.c_str(), at, length, count);
        }
        readInstruction(op, words + at + 1, length - 1, types, k);
        at += length;
    }
    if (k.local_size[0] == 0) {
        return BLUE_ERROR("kernel '%s': no LocalSize execution mode", name.c_str());
    }
    return k;
}

const std::vector<KernelInfo>& embeddedKernels() {
    static const std::vector<KernelInfo> kernels = [] {
        std::vector<KernelInfo> list;
        for (size_t i = 0; i < kEmbeddedShaderCount; ++i) {
            const EmbeddedShader& s = kEmbeddedShaders[i];
            // The ceiling micro-kernels are optional (host/peak.cpp checks each against the
            // device and skips what does not fit): they do not decide whether BlueVM runs.
            if (std::string_view(s.name).substr(0, 5) == "peak_") continue;
            Result<KernelInfo> k = reflectKernel(s.name, s.code, s.words);
            assert(k.isOk() && "an embedded kernel is not valid SPIR-V");
            if (k) list.push_back(std::move(k.value()));
        }
        return list;
    }();
    return kernels;
}

}  // namespace blue
