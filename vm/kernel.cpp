// Checks of custom kernels' SPIR-V (see kernel.h and the contract in kernel_abi.h). The reader
// treats the words as hostile: every instruction's length is checked against the words left,
// every id against the header's bound, and type sizes are computed with overflow checks.
#include "vm/kernel.h"

#include <spirv-tools/libspirv.h>

#include <map>

#include "vm/kernel_abi.h"

namespace blue {

namespace {

// SPIR-V numbers this checker uses (SPIR-V specification, section 3).
enum : uint32_t {
    kMagic = 0x07230203,
    kMaxVersion = 0x00010500,  // SPIR-V 1.5: what Vulkan 1.2 accepts
    kOpExtInstImport = 11,
    kOpMemoryModel = 14,
    kOpEntryPoint = 15,
    kOpExecutionMode = 16,
    kOpCapability = 17,
    kOpTypeInt = 21,
    kOpTypeFloat = 22,
    kOpTypeVector = 23,
    kOpTypeMatrix = 24,
    kOpTypeArray = 28,
    kOpTypeRuntimeArray = 29,
    kOpTypeStruct = 30,
    kOpTypePointer = 32,
    kOpConstant = 43,
    kOpConstantComposite = 44,
    kOpSpecConstantTrue = 48,
    kOpSpecConstantOp = 52,
    kOpVariable = 59,
    kOpDecorate = 71,
    kOpMemberDecorate = 72,
    kOpExecutionModeId = 331,
    kDecBlock = 2,
    kDecBufferBlock = 3,
    kDecArrayStride = 6,
    kDecBuiltIn = 11,
    kDecNonWritable = 24,
    kDecBinding = 33,
    kDecDescriptorSet = 34,
    kDecOffset = 35,
    kBuiltInWorkgroupSize = 25,
    kModeLocalSize = 17,
    kModeLocalSizeId = 38,
    kModelGLCompute = 5,
    kScInput = 1,
    kScUniform = 2,
    kScWorkgroup = 4,
    kScPrivate = 6,
    kScFunction = 7,
    kScPushConstant = 9,
    kScStorageBuffer = 12,
    kCapMatrix = 0,
    kCapShader = 1,
};

const char* storageClassName(uint32_t sc) {
    switch (sc) {
        case 0:
            return "UniformConstant (images, samplers)";
        case 3:
            return "Output";
        case 5:
            return "CrossWorkgroup";
        case 8:
            return "Generic";
        case 10:
            return "AtomicCounter";
        case 11:
            return "Image";
        case 5349:
            return "PhysicalStorageBuffer";
    }
    return "an unsupported storage class";
}

struct Inst {
    uint32_t op;
    std::span<const uint32_t> w;  // operands (without the header word)
};

struct Reader {
    std::string what;
    std::vector<Inst> insts;
    uint32_t bound = 0;
    // Reflection gathered in one pass.
    std::map<uint32_t, std::vector<uint32_t>>
        types;                               // id -> the type instruction's words (op first)
    std::map<uint32_t, uint32_t> constants;  // 32-bit OpConstant values
    std::map<uint32_t, std::vector<uint32_t>> composites;
    std::map<uint32_t, std::map<uint32_t, std::vector<uint32_t>>>
        decorations;  // id -> dec -> literals
    std::map<std::pair<uint32_t, uint32_t>, std::map<uint32_t, uint32_t>> member_decs;

    Status fail(const std::string& msg) const {
        return BLUE_ERROR("%s: %s", what.c_str(), msg.c_str());
    }

    Status read(std::span<const uint32_t> words) {
        if (words.size() < 5)
            return fail(
                strFormat("not SPIR-V: %zu words, shorter than the 5-word header", words.size()));
        if (words[0] != kMagic)
            return fail(strFormat(
                "not SPIR-V: first word 0x%08x is not the magic number 0x07230203", words[0]));
        if (words[1] > kMaxVersion || (words[1] & 0xFF0000FFu)) {
            return fail(strFormat("SPIR-V version 0x%08x: at most 1.5 (Vulkan 1.2)", words[1]));
        }
        bound = words[3];
        if (bound == 0 || bound > (1u << 22))
            return fail(strFormat("id bound %u is out of range", bound));
        for (size_t at = 5; at < words.size();) {
            uint32_t n = words[at] >> 16, op = words[at] & 0xFFFF;
            if (n == 0 || n > words.size() - at) {
                return fail(strFormat(
                    "truncated: the instruction at word %zu claims %u words, %zu are left", at, n,
                    words.size() - at));
            }
            insts.push_back({op, words.subspan(at + 1, n - 1)});
            at += n;
        }
        for (const Inst& in : insts) gather(in);
        return Status::ok();
    }

    void gather(const Inst& in) {
        auto& w = in.w;
        if (((in.op >= kOpTypeInt && in.op <= kOpTypeStruct) || in.op == kOpTypePointer) &&
            !w.empty()) {
            std::vector<uint32_t> t{in.op};
            t.insert(t.end(), w.begin() + 1, w.end());
            types[w[0]] = std::move(t);
        } else if (in.op == kOpConstant && w.size() == 3) {
            constants[w[1]] = w[2];
        } else if (in.op == kOpConstantComposite && w.size() >= 2) {
            composites[w[1]] = {w.begin() + 2, w.end()};
        } else if (in.op == kOpDecorate && w.size() >= 2) {
            decorations[w[0]][w[1]] = {w.begin() + 2, w.end()};
        } else if (in.op == kOpMemberDecorate && w.size() >= 3) {
            member_decs[{w[0], w[1]}][w[2]] = w.size() > 3 ? w[3] : 0;
        }
    }

    bool decorated(uint32_t id, uint32_t dec, uint32_t* value = nullptr) const {
        auto it = decorations.find(id);
        if (it == decorations.end()) return false;
        auto d = it->second.find(dec);
        if (d == it->second.end()) return false;
        if (value) *value = d->second.empty() ? 0 : d->second[0];
        return true;
    }

    // Size in bytes of a type (plain layout: arrays by ArrayStride when decorated), or an error.
    // Runtime arrays count as 0 bytes (only buffers may end in one).
    Result<uint64_t> typeSize(uint32_t id, int depth = 0) const {
        auto it = types.find(id);
        if (it == types.end() || depth > 16)
            return fail(strFormat("type %%%u is not a sized type", id));
        const std::vector<uint32_t>& t = it->second;
        switch (t[0]) {
            case kOpTypeInt:
            case kOpTypeFloat:
                if (t.size() < 2 || t[1] % 8 || t[1] == 0)
                    return fail("a scalar type of odd width");
                return uint64_t(t[1] / 8);
            case kOpTypeVector:
            case kOpTypeMatrix: {
                if (t.size() < 3) return fail("a malformed vector type");
                BLUE_TRY_ASSIGN(uint64_t e, typeSize(t[1], depth + 1));
                return e * t[2];
            }
            case kOpTypeArray: {
                if (t.size() < 3 || !constants.count(t[2]))
                    return fail("an array whose length is not a constant");
                BLUE_TRY_ASSIGN(uint64_t e, typeSize(t[1], depth + 1));
                uint32_t stride = 0;
                if (decorated(id, kDecArrayStride, &stride)) e = std::max<uint64_t>(e, stride);
                uint64_t n = constants.at(t[2]);
                if (e && n > (uint64_t(1) << 40) / e) return fail("an array too large");
                return e * n;
            }
            case kOpTypeRuntimeArray:
                return uint64_t(0);
            case kOpTypeStruct: {
                uint64_t end = 0;
                for (uint32_t k = 1; k < t.size(); ++k) {
                    BLUE_TRY_ASSIGN(uint64_t e, typeSize(t[k], depth + 1));
                    uint64_t at = end;
                    auto md = member_decs.find({id, k - 1});
                    if (md != member_decs.end() && md->second.count(kDecOffset))
                        at = md->second.at(kDecOffset);
                    end = std::max(end, at + e);
                }
                return end;
            }
        }
        return fail(strFormat("type %%%u (opcode %u) has no size a kernel may use", id, t[0]));
    }

    // True when every member of the struct `id` is NonWritable, or the variable is.
    bool readonly(uint32_t var, uint32_t st) const {
        if (decorated(var, kDecNonWritable)) return true;
        auto it = types.find(st);
        if (it == types.end() || it->second[0] != kOpTypeStruct) return false;
        for (uint32_t k = 0; k + 1 < it->second.size(); ++k) {
            auto md = member_decs.find({st, k});
            if (md == member_decs.end() || !md->second.count(kDecNonWritable)) return false;
        }
        return true;
    }
};

Status checkHeaderInstrs(const Reader& r, KernelShape* shape, uint32_t* entry_id) {
    uint32_t entries = 0;
    bool local = false;
    for (const Inst& in : r.insts) {
        auto& w = in.w;
        if (in.op == kOpCapability) {
            if (w.empty()) return r.fail("malformed OpCapability");
            if (w[0] != kCapShader && w[0] != kCapMatrix) {
                return r.fail(
                    strFormat("declares SPIR-V capability %u; a custom kernel may use only Shader, "
                              "so that every "
                              "Vulkan 1.2 device runs it",
                              w[0]));
            }
        } else if (in.op == kOpExtInstImport) {
            std::string name(reinterpret_cast<const char*>(w.data() + 1), (w.size() - 1) * 4);
            name = name.c_str();
            if (name != "GLSL.std.450")
                return r.fail("imports extended instructions '" + name + "' (only GLSL.std.450)");
        } else if (in.op == kOpEntryPoint) {
            ++entries;
            if (w.size() < 3) return r.fail("malformed OpEntryPoint");
            if (w[0] != kModelGLCompute) {
                return r.fail(
                    strFormat("entry point has execution model %u, not GLCompute (5): a kernel is "
                              "a compute shader",
                              w[0]));
            }
            std::string name(reinterpret_cast<const char*>(w.data() + 2), (w.size() - 2) * 4);
            name = name.c_str();
            if (name != "main") return r.fail("entry point is named '" + name + "', not 'main'");
            *entry_id = w[1];
        } else if (in.op == kOpExecutionMode || in.op == kOpExecutionModeId) {
            if (w.size() < 2) return r.fail("malformed OpExecutionMode");
            if (w[1] == kModeLocalSizeId || in.op == kOpExecutionModeId) {
                return r.fail(
                    "workgroup size given by ids (LocalSizeId): give it as literals (local_size_x "
                    "= N)");
            }
            if (w[1] == kModeLocalSize) {
                if (w.size() < 5) return r.fail("malformed LocalSize");
                local = true;
                for (int k = 0; k < 3; ++k) shape->local[k] = w[2 + k];
            }
        } else if (in.op >= kOpSpecConstantTrue && in.op <= kOpSpecConstantOp) {
            return r.fail("declares specialization constants; a custom kernel gets none");
        }
    }
    if (entries != 1)
        return r.fail(
            strFormat("has %u entry points, needs exactly one (GLCompute 'main')", entries));
    if (!local) return r.fail("declares no workgroup size (LocalSize)");
    // A constant decorated WorkgroupSize overrides LocalSize.
    for (const auto& [id, decs] : r.decorations) {
        auto b = decs.find(kDecBuiltIn);
        if (b == decs.end() || b->second.empty() || b->second[0] != kBuiltInWorkgroupSize) continue;
        auto c = r.composites.find(id);
        if (c == r.composites.end() || c->second.size() != 3)
            return r.fail("WorkgroupSize is not a constant of three literals");
        for (int k = 0; k < 3; ++k) {
            auto v = r.constants.find(c->second[k]);
            if (v == r.constants.end())
                return r.fail("WorkgroupSize is not a constant of three literals");
            shape->local[k] = v->second;
        }
    }
    uint64_t inv = uint64_t(shape->local[0]) * shape->local[1] * shape->local[2];
    if (inv == 0 || inv > BLUE_KERNEL_MAX_INVOCATIONS) {
        return r.fail(
            strFormat("workgroup size %ux%ux%u is %llu invocations; the contract allows 1 to %u",
                      shape->local[0], shape->local[1], shape->local[2], (unsigned long long)inv,
                      BLUE_KERNEL_MAX_INVOCATIONS));
    }
    return Status::ok();
}

Status checkBuffer(const Reader& r, uint32_t var, uint32_t pointee, uint32_t sc,
                   KernelShape* shape) {
    uint32_t set = 0, binding = 0;
    if (!r.decorated(var, kDecDescriptorSet, &set) || !r.decorated(var, kDecBinding, &binding)) {
        return r.fail(strFormat("buffer variable %%%u has no descriptor set or binding", var));
    }
    if (set != 0)
        return r.fail(
            strFormat("a buffer in descriptor set %u (binding %u): the contract has set 0 only",
                      set, binding));
    if (binding >= BLUE_KERNEL_BINDINGS) {
        return r.fail(
            strFormat("binding %u: the contract has bindings 0 (items), 1 (slots), 2 (results) and "
                      "3 (out) only",
                      binding));
    }
    bool ssbo = sc == kScStorageBuffer || r.decorated(pointee, kDecBufferBlock);
    if (!ssbo)
        return r.fail(
            strFormat("binding %u is a uniform buffer; the contract's bindings are storage buffers",
                      binding));
    if (shape->bindings & (1u << binding))
        return r.fail(strFormat("binding %u is declared twice", binding));
    shape->bindings |= 1u << binding;
    const bool input = binding == BLUE_KERNEL_BIND_ITEMS || binding == BLUE_KERNEL_BIND_SLOTS;
    if (input && !r.readonly(var, pointee)) {
        return r.fail(strFormat("binding %u (%s) must be declared readonly", binding,
                                binding == BLUE_KERNEL_BIND_ITEMS ? "items" : "slots"));
    }
    return Status::ok();
}

Status checkVariables(const Reader& r, KernelShape* shape) {
    for (const Inst& in : r.insts) {
        if (in.op != kOpVariable) continue;
        if (in.w.size() < 3) return r.fail("malformed OpVariable");
        uint32_t ptr = in.w[0], var = in.w[1], sc = in.w[2];
        auto pt = r.types.find(ptr);
        if (pt == r.types.end() || pt->second[0] != kOpTypePointer || pt->second.size() < 3) {
            return r.fail(strFormat("variable %%%u does not have a pointer type", var));
        }
        uint32_t pointee = pt->second[2];
        switch (sc) {
            case kScInput:
            case kScPrivate:
            case kScFunction:
                break;
            case kScWorkgroup: {
                BLUE_TRY_ASSIGN(uint64_t bytes, r.typeSize(pointee));
                shape->shared_bytes =
                    uint32_t(std::min<uint64_t>(shape->shared_bytes + bytes, 1ull << 31));
                if (shape->shared_bytes > BLUE_KERNEL_MAX_SHARED) {
                    return r.fail(strFormat(
                        "uses %u bytes of workgroup (shared) memory; the contract allows %u",
                        shape->shared_bytes, BLUE_KERNEL_MAX_SHARED));
                }
                break;
            }
            case kScPushConstant: {
                if (shape->push_bytes) return r.fail("declares two push-constant blocks");
                BLUE_TRY_ASSIGN(uint64_t bytes, r.typeSize(pointee));
                if (bytes == 0 || bytes > BLUE_KERNEL_PUSH_WORDS * 4) {
                    return r.fail(strFormat(
                        "push constants of %llu bytes; the contract gives %u (items_base, in_base, "
                        "in_stride, out_base, out_stride, param, out_slot_base, out_slot_stride)",
                        (unsigned long long)bytes, BLUE_KERNEL_PUSH_WORDS * 4));
                }
                shape->push_bytes = uint32_t(bytes);
                break;
            }
            case kScUniform:
            case kScStorageBuffer:
                BLUE_TRY(checkBuffer(r, var, pointee, sc, shape));
                break;
            default:
                return r.fail(strFormat(
                    "variable %%%u is in storage class %s (%u), which the contract does not allow",
                    var, storageClassName(sc), sc));
        }
    }
    return Status::ok();
}

}  // namespace

Result<KernelShape> reflectKernelSpirv(std::span<const uint32_t> words, const std::string& what) {
    if (words.size() > BLUE_KERNEL_MAX_WORDS) {
        return BLUE_ERROR("%s: %zu SPIR-V words, more than %u", what.c_str(), words.size(),
                          BLUE_KERNEL_MAX_WORDS);
    }
    Reader r;
    r.what = what;
    BLUE_TRY(r.read(words));
    KernelShape shape;
    uint32_t entry = 0;
    BLUE_TRY(checkHeaderInstrs(r, &shape, &entry));
    BLUE_TRY(checkVariables(r, &shape));
    return shape;
}

Status validateSpirv(std::span<const uint32_t> words, const std::string& what) {
    spv_context ctx = spvContextCreate(SPV_ENV_VULKAN_1_2);
    spv_diagnostic diag = nullptr;
    spv_result_t res = spvValidateBinary(ctx, words.data(), words.size(), &diag);
    std::string msg;
    if (res != SPV_SUCCESS) {
        msg = diag && diag->error ? diag->error : "invalid SPIR-V";
        for (char& c : msg) {
            if (c == '\n') c = ' ';  // one line
        }
        while (!msg.empty() && msg.back() == ' ') msg.pop_back();
    }
    spvDiagnosticDestroy(diag);
    spvContextDestroy(ctx);
    if (res != SPV_SUCCESS) return BLUE_ERROR("%s: spirv-val: %s", what.c_str(), msg.c_str());
    return Status::ok();
}

Result<KernelShape> checkKernelSpirv(std::span<const uint32_t> words, const std::string& what) {
    // The reflection first: it bounds-checks the header and instruction stream, so malformed
    // input gets a precise message instead of the validator's first complaint.
    BLUE_TRY_ASSIGN(KernelShape shape, reflectKernelSpirv(words, what));
    BLUE_TRY(validateSpirv(words, what));
    return shape;
}

}  // namespace blue
