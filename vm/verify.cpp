// The module verifier (see verify.h). Error messages name the section, the record and the field.
#include "vm/verify.h"

#include <set>

#include "vm/abi.h"
#include "vm/kernel_abi.h"
#include "vm/tensor_ops.h"

namespace blue {

namespace {

constexpr uint64_t kMaxTensorElements = uint64_t(1) << 40;
// A tensor without data is allocated from its declaration alone, so a corrupt dimension must not
// make a machine allocate terabytes: its storage (a ROWS tensor: max_rows slices; otherwise one
// slice) is bounded by what one storage binding can address with 32-bit offsets.
constexpr uint64_t kMaxActivationBytes = uint64_t(1) << 32;

Status checkRange(const char* field, uint32_t v, uint32_t lo, uint32_t hi) {
    if (v < lo || v > hi) {
        return BLUE_ERROR("layout: %s = %u is outside [%u, %u]", field, v, lo, hi);
    }
    return Status::ok();
}

Status verifyLayout(const Module& m) {
    const Layout& l = m.layout;
    BLUE_TRY(checkRange("regs", l.regs, 1, BLUE_MAX_REGS));
    BLUE_TRY(checkRange("local_words", l.local_words, 0, BLUE_MAX_LOCAL_WORDS));
    BLUE_TRY(checkRange("heap_words", l.heap_words, 0, BLUE_MAX_HEAP_WORDS));
    BLUE_TRY(checkRange("heap_static", l.heap_static, 0, l.heap_words));
    BLUE_TRY(checkRange("stack_depth", l.stack_depth, 0, BLUE_MAX_STACK_DEPTH));
    BLUE_TRY(checkRange("mailbox_cap", l.mailbox_cap, 1, BLUE_MAX_MAILBOX));
    BLUE_TRY(checkRange("in_slots", l.in_slots, 0, BLUE_MAX_IN_SLOTS));
    BLUE_TRY(checkRange("in_slot_words", l.in_slot_words, l.in_slots ? 1 : 0,
                        l.in_slots ? BLUE_MAX_IN_SLOT_WORDS : 0));
    BLUE_TRY(checkRange("max_rows", l.max_rows, m.blocks.empty() ? 0 : 1, BLUE_MAX_ROWS));
    BLUE_TRY(checkRange("max_steps", l.max_steps, 1, BLUE_MAX_STEPS));
    if (m.code.empty()) return BLUE_ERROR("code: the module has no instructions");
    if (l.entry >= m.instrCount()) {
        return BLUE_ERROR("layout: entry %u is outside the code (%u instructions)", l.entry,
                          m.instrCount());
    }
    return Status::ok();
}

Status verifyTensor(const Module& m, uint32_t index, std::set<std::string>* names) {
    const TensorDecl& t = m.tensors[index];
    auto fail = [&](const std::string& msg) {
        return BLUE_ERROR("tensor %u '%s': %s", index, t.name.c_str(), msg.c_str());
    };
    if (t.name.empty()) return fail("empty name");
    if (!names->insert(t.name).second) return fail("name used twice");
    auto info = dtypeInfo(uint32_t(t.dtype));
    if (!info) return fail(strFormat("unknown type id %u", uint32_t(t.dtype)));
    if (!info->supported) {
        return fail(strFormat("type %s is not supported by BlueVM", std::string(info->name).c_str()));
    }
    if (t.cls > BLUE_TC_GLOBAL) return fail(strFormat("unknown storage class %u", t.cls));
    if (t.ndim < 1 || t.ndim > 4) return fail(strFormat("ndim %u is outside [1, 4]", t.ndim));
    uint64_t elements = 1;
    for (uint32_t d = 0; d < 4; ++d) {
        uint64_t ne = t.ne[d];
        if (d >= t.ndim && ne != 1) return fail(strFormat("dim %u = %llu past ndim must be 1", d, (unsigned long long)ne));
        if (ne == 0 || ne > kMaxTensorElements || elements > kMaxTensorElements / ne) {
            return fail(strFormat("dim %u = %llu makes the tensor empty or too large", d,
                                  (unsigned long long)ne));
        }
        elements *= ne;
    }
    auto row_bytes = dtypeRowBytes(t.dtype, t.ne[0]);
    if (!row_bytes) {
        return fail(strFormat("row length %llu is not a whole number of %s blocks (%u)",
                              (unsigned long long)t.ne[0], std::string(info->name).c_str(),
                              info->block_elems));
    }
    uint64_t bytes = *row_bytes * (elements / t.ne[0]);
    uint64_t storage = bytes * (t.cls == BLUE_TC_ROWS ? m.layout.max_rows : 1);
    if (t.source == DataSource::NONE && storage > kMaxActivationBytes) {
        return fail(strFormat("needs %llu bytes of storage%s, more than the %llu GiB limit",
                              (unsigned long long)storage,
                              t.cls == BLUE_TC_ROWS ? " (max_rows rows)" : "",
                              (unsigned long long)(kMaxActivationBytes >> 30)));
    }
    switch (t.source) {
        case DataSource::NONE:
            if (t.cls == BLUE_TC_WEIGHT) return fail("a WEIGHT tensor needs data");
            break;
        case DataSource::DATA:
            if (t.cls != BLUE_TC_WEIGHT && t.cls != BLUE_TC_GLOBAL) {
                return fail("only WEIGHT and GLOBAL tensors can have initial data");
            }
            if (t.offset > m.data.size() || t.bytes > m.data.size() - t.offset) {
                return fail(strFormat("data [%llu, +%llu) is outside the DATA section (%zu bytes)",
                                      (unsigned long long)t.offset, (unsigned long long)t.bytes,
                                      m.data.size()));
            }
            break;
        case DataSource::EXTERN:
            if (t.cls != BLUE_TC_WEIGHT) return fail("only WEIGHT tensors can come from a file");
            if (t.extern_index >= m.externs.size()) {
                return fail(strFormat("extern file index %u, but the module names %zu files",
                                      t.extern_index, m.externs.size()));
            }
            break;
        default: return fail(strFormat("unknown data source %u", uint32_t(t.source)));
    }
    if (t.source != DataSource::NONE && t.bytes != bytes) {
        return fail(strFormat("stores %llu bytes but its shape and type need %llu",
                              (unsigned long long)t.bytes, (unsigned long long)bytes));
    }
    return Status::ok();
}

// Checks the immediate of a control instruction against what its letter refers to.
Status verifyImmediate(const Module& m, const Instr& in, char letter, uint32_t nargs_reg_base) {
    switch (letter) {
        case 'l':
            if (in.imm >= m.instrCount()) {
                return BLUE_ERROR("jump target %u is outside the code (%u instructions)", in.imm,
                                  m.instrCount());
            }
            break;
        case 'b': {
            if (in.imm >= m.blocks.size()) {
                return BLUE_ERROR("block %u does not exist (%zu blocks)", in.imm, m.blocks.size());
            }
            uint32_t nargs = m.blocks[in.imm].nargs;
            if (nargs_reg_base + nargs > m.layout.regs) {
                return BLUE_ERROR("block '%s' takes %u argument registers from r%u, past r%u",
                                  m.blocks[in.imm].name.c_str(), nargs, nargs_reg_base,
                                  m.layout.regs - 1);
            }
            break;
        }
        case 'k':
            if (in.imm >= m.consts.size()) {
                return BLUE_ERROR("constant offset %u is outside the pool (%zu words)", in.imm,
                                  m.consts.size());
            }
            break;
        case 's': {
            std::string s;
            if (!m.constString(in.imm, &s)) {
                return BLUE_ERROR("no string fits at constant offset %u", in.imm);
            }
            break;
        }
        case 't': {
            if (in.imm >= m.tensors.size()) {
                return BLUE_ERROR("tensor %u does not exist (%zu tensors)", in.imm,
                                  m.tensors.size());
            }
            const TensorDecl& t = m.tensors[in.imm];
            if (t.cls != BLUE_TC_INSTANCE && t.cls != BLUE_TC_GLOBAL) {
                return BLUE_ERROR("tensor '%s' is not INSTANCE or GLOBAL storage", t.name.c_str());
            }
            if (t.dtype != DType::F32 && t.dtype != DType::I32) {
                return BLUE_ERROR("tensor '%s' is not F32 or I32", t.name.c_str());
            }
            break;
        }
        default: break;  // i, u, f: any value
    }
    return Status::ok();
}

Status verifyInstr(const Module& m, uint32_t index) {
    Instr in = decodeInstr(m.code[index * 2], m.code[index * 2 + 1]);
    const OpInfo* info = opInfo(in.op);
    auto fail = [&](const std::string& msg) {
        return BLUE_ERROR("code: instruction %u (byte offset 0x%x)%s%s: %s", index, index * 8,
                          info ? " " : "", info ? std::string(info->name).c_str() : "",
                          msg.c_str());
    };
    if (!info) return fail(strFormat("unknown opcode 0x%02x", in.op));
    if (info->tensor) return fail("a tensor instruction cannot appear in control code");
    FormatShape shape = formatShape(info->format);
    const uint8_t fields[3] = {in.a, in.b, in.c};
    for (int f = 0; f < 3; ++f) {
        if (f < shape.regs && fields[f] >= m.layout.regs) {
            return fail(strFormat("register r%u is out of range (the layout has %u registers)",
                                  fields[f], m.layout.regs));
        }
        if (f >= shape.regs && fields[f] != 0) {
            return fail(strFormat("unused operand field %c is %u, must be 0", 'A' + f, fields[f]));
        }
    }
    if (shape.imm == 0 && in.imm != 0) return fail("unused immediate must be 0");
    Status s = verifyImmediate(m, in, shape.imm, in.a);
    if (!s) return fail(s.message());
    return Status::ok();
}

Status verifyBlocks(const Module& m) {
    for (uint32_t b = 0; b < m.blocks.size(); ++b) {
        const BlockDecl& blk = m.blocks[b];
        auto fail = [&](const std::string& msg) {
            return BLUE_ERROR("block %u '%s': %s", b, blk.name.c_str(), msg.c_str());
        };
        if (blk.nargs > BLUE_MAX_BLOCK_ARGS) {
            return fail(strFormat("%u arguments, at most %u", blk.nargs, BLUE_MAX_BLOCK_ARGS));
        }
        std::vector<TensorInstr> instrs;
        BLUE_TRY(decodeBlock(m, blk, &instrs));
        for (const TensorInstr& ti : instrs) {
            const OpInfo& info = opInfo(ti.op);
            for (size_t i = 0; i < ti.args.size(); ++i) {
                bool optional_none = info.format[i] == 'o' && ti.args[i] == 0xFFFFFFFFu;
                if ((info.format[i] == 't' || info.format[i] == 'o') && !optional_none &&
                    ti.args[i] >= m.tensors.size()) {
                    return fail(strFormat("%s at TCODE word %u: operand %zu names tensor %u, but "
                                          "there are %zu",
                                          std::string(info.name).c_str(), ti.word, i, ti.args[i],
                                          m.tensors.size()));
                }
            }
            Status s = checkTensorOp(m, ti);
            if (!s) {
                return fail(strFormat("%s at TCODE word %u: %s", std::string(info.name).c_str(),
                                      ti.word, s.message().c_str()));
            }
        }
    }
    return Status::ok();
}

// Every custom kernel: a name, and SPIR-V that passes spirv-val and the contract (vm/kernel.h).
// The module is untrusted, so this runs on every load, not only when bluec embedded the kernel.
Status verifyKernels(const Module& m) {
    if (m.kernels.size() > BLUE_KERNEL_MAX_COUNT) {
        return BLUE_ERROR("kernels: %zu custom kernels, at most %u", m.kernels.size(), BLUE_KERNEL_MAX_COUNT);
    }
    std::set<std::string> names;
    for (uint32_t k = 0; k < m.kernels.size(); ++k) {
        const KernelDecl& kd = m.kernels[k];
        if (kd.name.empty() || kd.name.size() > 64) {
            return BLUE_ERROR("kernel %u: a name of 1 to 64 characters is needed", k);
        }
        if (!names.insert(kd.name).second) return BLUE_ERROR("kernel %u '%s': name used twice", k, kd.name.c_str());
        auto shape = checkKernelSpirv(kd.spirv, strFormat("kernel %u '%s'", k, kd.name.c_str()));
        if (!shape) return shape.status();
    }
    return Status::ok();
}

Status verifySyms(const Module& m) {
    for (const Symbol& s : m.syms) {
        bool ok = false;
        std::string str;
        switch (s.kind) {
            case SymKind::LABEL: ok = s.value < m.instrCount(); break;
            case SymKind::CONST: ok = s.value < m.consts.size(); break;
            case SymKind::STRING: ok = m.constString(s.value, &str); break;
        }
        if (!ok) {
            return BLUE_ERROR("symbol '%s' (kind %u) has invalid value %u", s.name.c_str(),
                              uint32_t(s.kind), s.value);
        }
    }
    return Status::ok();
}

}  // namespace

Status decodeBlock(const Module& m, const BlockDecl& b, std::vector<TensorInstr>* out) {
    if (b.tcode_offset > m.tcode.size() || b.tcode_words > m.tcode.size() - b.tcode_offset) {
        return BLUE_ERROR("block '%s': TCODE range [%u, +%u) is outside TCODE (%zu words)",
                          b.name.c_str(), b.tcode_offset, b.tcode_words, m.tcode.size());
    }
    uint32_t at = b.tcode_offset, end = b.tcode_offset + b.tcode_words;
    while (at < end) {
        uint32_t header = m.tcode[at];
        const OpInfo* info = opInfo(tensorHeaderOp(header));
        uint32_t nops = tensorHeaderOperands(header);
        if (!info || !info->tensor) {
            return BLUE_ERROR("block '%s': TCODE word %u: 0x%02x is not a tensor opcode",
                              b.name.c_str(), at, tensorHeaderOp(header));
        }
        if (nops != info->format.size()) {
            return BLUE_ERROR("block '%s': TCODE word %u: %s has %u operands, its format needs %zu",
                              b.name.c_str(), at, std::string(info->name).c_str(), nops,
                              info->format.size());
        }
        if (nops > end - at - 1) {
            return BLUE_ERROR("block '%s': TCODE word %u: %s runs past the end of the block",
                              b.name.c_str(), at, std::string(info->name).c_str());
        }
        out->push_back({info->op, at, {m.tcode.begin() + at + 1, m.tcode.begin() + at + 1 + nops}});
        at += 1 + nops;
    }
    return Status::ok();
}

Status verifyModule(const Module& m) {
    BLUE_TRY(verifyLayout(m));
    std::set<std::string> names;
    for (uint32_t i = 0; i < m.tensors.size(); ++i) BLUE_TRY(verifyTensor(m, i, &names));
    for (uint32_t i = 0; i < m.instrCount(); ++i) BLUE_TRY(verifyInstr(m, i));
    BLUE_TRY(verifyKernels(m));
    BLUE_TRY(verifyBlocks(m));
    BLUE_TRY(verifySyms(m));
    return Status::ok();
}

Result<Module> loadModuleFile(const std::string& path) {
    Result<Module> m = readModuleFile(path);
    if (!m) return m;
    Status s = verifyModule(*m);
    if (!s) return s.prefix(path);
    return m;
}

}  // namespace blue
