// The Blue-IR disassembler: prints a module in the assembler's syntax (asm.h), using the SYMS
// section for names where present and numeric forms where not.
#include <bit>
#include <cmath>
#include <cstring>
#include <map>

#include "compiler/asm.h"
#include "compiler/asm_lexer.h"
#include "vm/abi.h"
#include "vm/isa.h"
#include "vm/verify.h"

namespace blue {

namespace {

// A float written so that it parses back to the same bits (raw bits when that fails).
std::string floatText(uint32_t bits) {
    float f = std::bit_cast<float>(bits);
    if (std::isfinite(f)) {
        std::string s = strFormat("%.9g", double(f));
        if (s.find_first_of(".en") == std::string::npos) s += ".0";
        if (std::bit_cast<uint32_t>(std::strtof(s.c_str(), nullptr)) == bits) return s;
    }
    return strFormat("0x%08x", bits);
}

struct Printer {
    const Module& m;
    std::string out;
    std::multimap<uint32_t, std::string> labels;
    std::map<uint32_t, std::string> consts, strings;

    explicit Printer(const Module& mod) : m(mod) {
        for (const Symbol& s : m.syms) {
            if (s.kind == SymKind::LABEL) labels.emplace(s.value, s.name);
            if (s.kind == SymKind::CONST) consts.emplace(s.value, s.name);
            if (s.kind == SymKind::STRING) strings.emplace(s.value, s.name);
        }
    }

    void line(const std::string& s) { out += s + "\n"; }

    void layout() {
        const Layout& l = m.layout;
        line(strFormat(".layout regs=%u local=%u heap=%u heap_static=%u stack=%u mailbox=%u",
                       l.regs, l.local_words, l.heap_words, l.heap_static, l.stack_depth,
                       l.mailbox_cap));
        line(strFormat(".layout in_slots=%u in_slot_words=%u max_rows=%u max_steps=%u", l.in_slots,
                       l.in_slot_words, l.max_rows, l.max_steps));
    }

    // The constant pool, walked in order: named strings, named constants, raw words elsewhere.
    void pool() {
        uint32_t at = 0;
        std::vector<uint32_t> raw;
        auto flush = [&] {
            if (raw.empty()) return;
            std::string s = ".words";
            for (uint32_t w : raw) s += strFormat(" 0x%x", w);
            line(s);
            raw.clear();
        };
        while (at < m.consts.size()) {
            std::string text;
            auto str = strings.find(at);
            if (str != strings.end() && m.constString(at, &text) && stringPadZero(at, text)) {
                flush();
                line(".string " + str->second + " " + quoteString(text));
                at += 1 + uint32_t((text.size() + 3) / 4);
                continue;
            }
            auto k = consts.find(at);
            if (k == consts.end()) {
                raw.push_back(m.consts[at++]);
                continue;
            }
            flush();
            uint32_t end = at + 1;
            while (end < m.consts.size() && !consts.count(end) && !strings.count(end)) ++end;
            std::string s = ".const " + k->second;
            for (uint32_t i = at; i < end; ++i) s += strFormat(" 0x%x", m.consts[i]);
            line(s);
            at = end;
        }
        flush();
    }

    bool stringPadZero(uint32_t at, const std::string& text) const {
        size_t words = (text.size() + 3) / 4;
        std::vector<uint8_t> bytes(words * 4, 0);
        std::memcpy(bytes.data(), m.consts.data() + at + 1, words * 4);
        for (size_t i = text.size(); i < bytes.size(); ++i) {
            if (bytes[i] != 0) return false;
        }
        return true;
    }

    void tensors() {
        static const char* kClasses[] = {"weight", "rows", "instance", "global"};
        for (const std::string& e : m.externs) line(".extern " + quoteString(e));
        // Custom kernels' SPIR-V has no assembly syntax: named so a reader knows KERNEL's index.
        for (size_t k = 0; k < m.kernels.size(); ++k) {
            line(strFormat("; kernel %zu '%s': %zu SPIR-V words (not reassembled)", k,
                           m.kernels[k].name.c_str(), m.kernels[k].spirv.size()));
        }
        for (const TensorDecl& t : m.tensors) {
            std::string s = ".tensor " + t.name + " " + kClasses[t.cls & 3] + " " +
                            std::string(dtypeName(t.dtype)) + " [";
            for (uint32_t d = 0; d < t.ndim; ++d) {
                s += strFormat("%s%llu", d ? ", " : "", (unsigned long long)t.ne[d]);
            }
            s += "]";
            if (t.source == DataSource::EXTERN) {
                s += strFormat(" file %u offset %llu", t.extern_index, (unsigned long long)t.offset);
            } else if (t.source == DataSource::DATA) {
                s += dataText(t);
            }
            line(s);
        }
    }

    std::string dataText(const TensorDecl& t) const {
        const uint8_t* p = m.data.data() + t.offset;
        std::string s;
        if (t.dtype == DType::F32 || t.dtype == DType::I32) {
            s = t.dtype == DType::F32 ? " data f32" : " data i32";
            for (uint64_t i = 0; i < t.bytes / 4; ++i) {
                uint32_t w;
                std::memcpy(&w, p + i * 4, 4);
                s += " " + (t.dtype == DType::F32 ? floatText(w) : strFormat("%d", int32_t(w)));
            }
            return s;
        }
        s = " data hex ";
        for (uint64_t i = 0; i < t.bytes; ++i) s += strFormat("%02x", p[i]);
        return s;
    }

    std::string operand(char letter, uint32_t v) const {
        switch (letter) {
            case 'i': return strFormat("%d", int32_t(v));
            case 'u': return strFormat("0x%x", v);
            case 'f': return floatText(v);
            case 'l': {
                auto it = labels.find(v);
                return it != labels.end() ? it->second : strFormat("@%u", v);
            }
            case 'b': return v < m.blocks.size() ? m.blocks[v].name : strFormat("%u", v);
            case 't': return v < m.tensors.size() ? m.tensors[v].name : strFormat("%u", v);
            case 'o':
                if (v == 0xFFFFFFFFu) return "none";
                return v < m.tensors.size() ? m.tensors[v].name : strFormat("%u", v);
            case 'k': {
                auto it = consts.find(v);
                return it != consts.end() ? it->second : strFormat("%u", v);
            }
            case 's': {
                auto it = strings.find(v);
                return it != strings.end() ? it->second : strFormat("%u", v);
            }
        }
        return "?";
    }

    void blocks() {
        for (const BlockDecl& b : m.blocks) {
            line(strFormat(".block %s args=%u", b.name.c_str(), b.nargs));
            std::vector<TensorInstr> instrs;
            if (decodeBlock(m, b, &instrs)) {
                for (const TensorInstr& ti : instrs) {
                    const OpInfo& info = opInfo(ti.op);
                    std::string s = "    " + lower(info.name);
                    for (size_t i = 0; i < ti.args.size(); ++i) {
                        s += (i ? ", " : " ") + operand(info.format[i], ti.args[i]);
                    }
                    line(s);
                }
            }
            line(".end");
        }
    }

    static std::string lower(std::string_view s) {
        std::string r(s);
        for (char& c : r) c = char(std::tolower(static_cast<unsigned char>(c)));
        return r;
    }

    void code() {
        for (uint32_t pc = 0; pc < m.instrCount(); ++pc) {
            auto [lo, hi] = labels.equal_range(pc);
            for (auto it = lo; it != hi; ++it) line(it->second + ":");
            Instr in = decodeInstr(m.code[pc * 2], m.code[pc * 2 + 1]);
            const OpInfo* info = opInfo(in.op);
            if (!info) {
                line(strFormat("    ; invalid opcode 0x%02x", in.op));
                continue;
            }
            std::string s = "    " + lower(info->name);
            const uint8_t regs[3] = {in.a, in.b, in.c};
            int r = 0;
            for (size_t i = 0; i < info->format.size(); ++i) {
                char letter = info->format[i];
                s += i ? ", " : " ";
                s += letter == 'r' ? strFormat("r%u", regs[r++]) : operand(letter, in.imm);
            }
            line(s);
        }
    }
};

}  // namespace

std::string disassemble(const Module& m) {
    Printer p(m);
    p.line(strFormat("; Blue-IR module, format %u.%u", m.major, m.minor));
    p.layout();
    for (const auto& [k, v] : m.meta) p.line(".meta " + quoteString(k) + " " + quoteString(v));
    p.pool();
    p.tensors();
    p.blocks();
    p.line(".entry " + p.operand('l', m.layout.entry));
    p.code();
    return p.out;
}

}  // namespace blue
