// The Blue-IR assembler (syntax in asm.h). Two passes: the first collects labels, the second
// encodes. Symbols (labels, constants, strings) are kept in the module's SYMS section, sorted, so
// that disassembly and reassembly give identical bytes.
#include "compiler/asm.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "compiler/asm_lexer.h"
#include "vm/abi.h"
#include "vm/isa.h"
#include "vm/verify.h"

namespace blue {

namespace {

struct Assembler {
    std::string name;
    Module m;
    std::map<std::string, uint32_t> labels, consts, strings, blocks, tensors;
    std::vector<std::pair<Line, const OpInfo*>> code_lines;  // pass 2 input
    bool entry_set = false;
    Line entry_line;
    std::string entry_name;

    Status err(const Line& line, size_t col, const std::string& msg) const {
        return BLUE_ERROR("%s:%u:%zu: %s", name.c_str(), line.number, col + 1, msg.c_str());
    }
    Status err(const Line& line, const Token& tok, const std::string& msg) const {
        return err(line, tok.col, msg);
    }

    Status directive(Line& line, std::vector<Line>& lines, size_t& i);
    Status layoutDirective(const Line& line);
    Status constDirective(const Line& line, bool named);
    Status stringDirective(const Line& line);
    Status tensorDirective(const Line& line);
    Status tensorData(const Line& line, size_t at, TensorDecl* t);
    Status blockDirective(const Line& line, std::vector<Line>& lines, size_t& i);
    Status tensorInstr(const Line& line, std::vector<uint32_t>* out);
    Status controlInstr(const Line& line, const OpInfo* info);
    Result<uint32_t> immediate(const Line& line, const Token& tok, char letter);
    Result<uint32_t> word(const Line& line, const Token& tok);
    Status finish();
};

bool parseInt(std::string_view s, int64_t* out) {
    bool neg = !s.empty() && s[0] == '-';
    if (neg || (!s.empty() && s[0] == '+')) s.remove_prefix(1);
    int base = 10;
    if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        base = 16;
        s.remove_prefix(2);
    }
    uint64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
    if (ec != std::errc() || p != s.data() + s.size() || s.empty() || v > 0xFFFFFFFFull) {
        return false;
    }
    *out = neg ? -int64_t(v) : int64_t(v);
    return *out >= INT32_MIN && *out <= int64_t(UINT32_MAX);
}

bool parseFloatBits(std::string_view s, uint32_t* bits) {
    if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        int64_t v = 0;
        if (!parseInt(s, &v) || v < 0) return false;
        *bits = uint32_t(v);
        return true;
    }
    std::string str(s);
    char* end = nullptr;
    float f = std::strtof(str.c_str(), &end);
    if (end != str.c_str() + str.size() || str.empty()) return false;
    *bits = std::bit_cast<uint32_t>(f);
    return true;
}

bool looksFloat(std::string_view s) {
    if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) return false;
    return s.find_first_of(".eEn") != std::string_view::npos;  // n: nan, inf
}

Result<uint32_t> Assembler::word(const Line& line, const Token& tok) {
    if (tok.kind == Token::CHAR) return uint32_t(uint8_t(tok.text[0]));
    if (tok.kind != Token::WORD) return err(line, tok, "expected a number");
    uint32_t bits = 0;
    int64_t v = 0;
    if (looksFloat(tok.text) && parseFloatBits(tok.text, &bits)) return bits;
    if (parseInt(tok.text, &v)) return uint32_t(v);
    return err(line, tok, "'" + tok.text + "' is not a number");
}

// Looks a name up in a symbol map, with an optional "+offset" suffix for constants.
bool lookup(const std::map<std::string, uint32_t>& map, const std::string& text, uint32_t* out,
            bool allow_offset) {
    std::string key = text;
    int64_t offset = 0;
    size_t plus = text.find('+');
    if (allow_offset && plus != std::string::npos) {
        key = text.substr(0, plus);
        if (!parseInt(std::string_view(text).substr(plus + 1), &offset) || offset < 0) return false;
    }
    auto it = map.find(key);
    if (it == map.end()) return false;
    *out = it->second + uint32_t(offset);
    return true;
}

Result<uint32_t> Assembler::immediate(const Line& line, const Token& tok, char letter) {
    uint32_t v = 0;
    switch (letter) {
        case 'i':
        case 'u': return word(line, tok);
        case 'f': {
            if (tok.kind == Token::WORD && parseFloatBits(tok.text, &v)) return v;
            return err(line, tok, "expected a float, found '" + tok.text + "'");
        }
        case 'l':
            if (tok.text.size() > 1 && tok.text[0] == '@') {
                int64_t n = 0;
                if (parseInt(tok.text.substr(1), &n) && n >= 0) {
                    if (uint64_t(n) < code_lines.size()) return uint32_t(n);
                    return err(line, tok, strFormat("%s is outside the code (%zu instructions)",
                                                    tok.text.c_str(), code_lines.size()));
                }
            }
            if (lookup(labels, tok.text, &v, false)) return v;
            return err(line, tok, "unknown label '" + tok.text + "'");
        case 'b':
            if (lookup(blocks, tok.text, &v, false)) return v;
            return err(line, tok, "unknown block '" + tok.text + "'");
        case 't':
            if (lookup(tensors, tok.text, &v, false)) return v;
            return err(line, tok, "unknown tensor '" + tok.text + "'");
        case 'o':
            if (tok.text == "none") return 0xFFFFFFFFu;
            if (lookup(tensors, tok.text, &v, false)) return v;
            return err(line, tok, "unknown tensor '" + tok.text + "' (or 'none')");
        case 'k':
            if (lookup(consts, tok.text, &v, true)) return v;
            return word(line, tok);
        case 's': {
            // A name, or a constant-pool offset as the disassembler prints unnamed strings.
            if (lookup(strings, tok.text, &v, false)) return v;
            int64_t offset = 0;
            if (tok.kind == Token::WORD && parseInt(tok.text, &offset) && offset >= 0) {
                return uint32_t(offset);
            }
            return err(line, tok, "unknown string '" + tok.text + "'");
        }
    }
    return err(line, tok, "bad operand");
}

Status Assembler::controlInstr(const Line& line, const OpInfo* info) {
    std::vector<Token> ops;
    BLUE_TRY(splitOperands(line, 1, &ops, name));
    if (ops.size() != info->format.size()) {
        return err(line, line.toks[0],
                   strFormat("%s takes %zu operands (%s), found %zu", std::string(info->name).c_str(),
                             info->format.size(), std::string(info->format).c_str(), ops.size()));
    }
    uint8_t regs[3] = {0, 0, 0};
    int nreg = 0;
    uint32_t imm = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
        char letter = info->format[i];
        if (letter == 'r') {
            Result<uint32_t> r = parseRegister(ops[i]);
            if (!r) return err(line, ops[i], r.message());
            if (r.value() >= m.layout.regs) {
                return err(line, ops[i], strFormat("register r%u is past the layout's %u registers",
                                                   r.value(), m.layout.regs));
            }
            regs[nreg++] = uint8_t(r.value());
        } else {
            Result<uint32_t> v = immediate(line, ops[i], letter);
            if (!v) return v.status();
            imm = v.value();
        }
    }
    m.code.push_back(encodeWord0(uint8_t(info->op), regs[0], regs[1], regs[2]));
    m.code.push_back(imm);
    return Status::ok();
}

Status Assembler::tensorInstr(const Line& line, std::vector<uint32_t>* out) {
    const OpInfo* info = opByName(line.toks[0].text);
    if (!info || !info->tensor) {
        return err(line, line.toks[0], "unknown tensor instruction '" + line.toks[0].text + "'");
    }
    std::vector<Token> ops;
    BLUE_TRY(splitOperands(line, 1, &ops, name));
    if (ops.size() != info->format.size()) {
        return err(line, line.toks[0],
                   strFormat("%s takes %zu operands (%s), found %zu", std::string(info->name).c_str(),
                             info->format.size(), std::string(info->format).c_str(), ops.size()));
    }
    out->push_back(encodeTensorHeader(uint8_t(info->op), uint32_t(ops.size())));
    for (size_t i = 0; i < ops.size(); ++i) {
        Result<uint32_t> v = immediate(line, ops[i], info->format[i]);
        if (!v) return v.status();
        out->push_back(v.value());
    }
    return Status::ok();
}

Status Assembler::layoutDirective(const Line& line) {
    struct Field {
        const char* key;
        uint32_t* value;
    };
    Layout& l = m.layout;
    const Field fields[] = {{"regs", &l.regs},           {"local", &l.local_words},
                            {"heap", &l.heap_words},     {"heap_static", &l.heap_static},
                            {"stack", &l.stack_depth},   {"mailbox", &l.mailbox_cap},
                            {"in_slots", &l.in_slots},   {"in_slot_words", &l.in_slot_words},
                            {"max_rows", &l.max_rows},   {"max_steps", &l.max_steps}};
    for (size_t i = 1; i < line.toks.size(); ++i) {
        const Token& t = line.toks[i];
        size_t eq = t.text.find('=');
        const Field* f = nullptr;
        for (const Field& cand : fields) {
            if (eq != std::string::npos && t.text.compare(0, eq, cand.key) == 0 &&
                std::strlen(cand.key) == eq) {
                f = &cand;
            }
        }
        int64_t v = 0;
        if (!f) return err(line, t, "unknown layout field '" + t.text.substr(0, eq) + "'");
        if (!parseInt(std::string_view(t.text).substr(eq + 1), &v) || v < 0) {
            return err(line, t, "layout field needs a non-negative integer: '" + t.text + "'");
        }
        *f->value = uint32_t(v);
    }
    return Status::ok();
}

Status Assembler::constDirective(const Line& line, bool named) {
    size_t first = named ? 2 : 1;
    if (named) {
        if (line.toks.size() < 2) return err(line, 0, ".const needs a name");
        if (!consts.emplace(line.toks[1].text, uint32_t(m.consts.size())).second) {
            return err(line, line.toks[1], "constant '" + line.toks[1].text + "' defined twice");
        }
        m.syms.push_back({SymKind::CONST, uint32_t(m.consts.size()), line.toks[1].text});
    }
    for (size_t i = first; i < line.toks.size(); ++i) {
        if (line.toks[i].kind == Token::COMMA) continue;
        Result<uint32_t> v = word(line, line.toks[i]);
        if (!v) return v.status();
        m.consts.push_back(v.value());
    }
    return Status::ok();
}

Status Assembler::stringDirective(const Line& line) {
    if (line.toks.size() != 3 || line.toks[2].kind != Token::STRING) {
        return err(line, 0, ".string needs a name and a quoted string");
    }
    const std::string& key = line.toks[1].text;
    uint32_t at = m.addConstString(line.toks[2].text);
    if (!strings.emplace(key, at).second) return err(line, line.toks[1], "string '" + key + "' defined twice");
    m.syms.push_back({SymKind::STRING, at, key});
    return Status::ok();
}

Status Assembler::tensorDirective(const Line& line) {
    const auto& tk = line.toks;
    if (tk.size() < 6) return err(line, 0, ".tensor needs NAME CLASS DTYPE [dims]");
    TensorDecl t;
    t.name = tk[1].text;
    static const char* kClasses[] = {"weight", "rows", "instance", "global"};
    t.cls = 4;
    for (uint32_t c = 0; c < 4; ++c) {
        if (tk[2].text == kClasses[c]) t.cls = c;
    }
    if (t.cls == 4) return err(line, tk[2], "unknown tensor class '" + tk[2].text + "' (weight, rows, instance, global)");
    auto dtype = dtypeFromName(tk[3].text);
    if (!dtype) return err(line, tk[3], "unknown type '" + tk[3].text + "'");
    t.dtype = *dtype;
    if (tk[4].kind != Token::LBRACK) return err(line, tk[4], "expected '[' before the dimensions");
    size_t i = 5;
    t.ndim = 0;
    for (; i < tk.size() && tk[i].kind != Token::RBRACK; ++i) {
        if (tk[i].kind == Token::COMMA) continue;
        int64_t v = 0;
        if (!parseInt(tk[i].text, &v) || v <= 0) return err(line, tk[i], "bad dimension '" + tk[i].text + "'");
        if (t.ndim == 4) return err(line, tk[i], "at most 4 dimensions");
        t.ne[t.ndim++] = uint64_t(v);
    }
    if (i == tk.size() || t.ndim == 0) return err(line, 0, "missing ']' or dimensions");
    if (tensors.count(t.name)) return err(line, tk[1], "tensor '" + t.name + "' defined twice");
    BLUE_TRY(tensorData(line, i + 1, &t));
    tensors[t.name] = uint32_t(m.tensors.size());
    m.tensors.push_back(t);
    return Status::ok();
}

Status Assembler::tensorData(const Line& line, size_t at, TensorDecl* t) {
    const auto& tk = line.toks;
    if (at == tk.size()) return Status::ok();
    auto row_bytes = dtypeRowBytes(t->dtype, t->ne[0]);
    if (!row_bytes) return err(line, 0, "row length is not a whole number of blocks");
    uint64_t bytes = *row_bytes * (t->elements() / t->ne[0]);
    if (tk[at].text == "file") {
        int64_t idx = 0, off = 0;
        if (at + 4 != tk.size() || !parseInt(tk[at + 1].text, &idx) || tk[at + 2].text != "offset") {
            return err(line, tk[at], "expected: file N offset BYTES");
        }
        std::string_view off_text = tk[at + 3].text;
        uint64_t off64 = 0;
        auto [p, ec] = std::from_chars(off_text.data(), off_text.data() + off_text.size(), off64);
        (void)off;
        if (ec != std::errc() || p != off_text.data() + off_text.size()) {
            return err(line, tk[at + 3], "bad offset");
        }
        t->source = DataSource::EXTERN;
        t->extern_index = uint32_t(idx);
        t->offset = off64;
        t->bytes = bytes;
        return Status::ok();
    }
    if (tk[at].text != "data" || at + 1 >= tk.size()) return err(line, tk[at], "expected 'data f32 ...', 'data hex ...' or 'file N offset X'");
    std::vector<uint8_t> out;
    if (tk[at + 1].text == "hex") {
        for (size_t i = at + 2; i < tk.size(); ++i) {
            const std::string& h = tk[i].text;
            for (size_t k = 0; k + 1 < h.size() + 1; k += 2) {
                if (k + 1 >= h.size()) return err(line, tk[i], "odd number of hex digits");
                unsigned v = 0;
                auto [p, ec] = std::from_chars(h.data() + k, h.data() + k + 2, v, 16);
                if (ec != std::errc() || p != h.data() + k + 2) return err(line, tk[i], "bad hex digits");
                out.push_back(uint8_t(v));
            }
        }
    } else if (tk[at + 1].text == "f32" || tk[at + 1].text == "i32") {
        bool is_float = tk[at + 1].text == "f32";
        for (size_t i = at + 2; i < tk.size(); ++i) {
            if (tk[i].kind == Token::COMMA) continue;
            uint32_t bits = 0;
            int64_t v = 0;
            if (is_float ? !parseFloatBits(tk[i].text, &bits) : !parseInt(tk[i].text, &v)) {
                return err(line, tk[i], "bad value '" + tk[i].text + "'");
            }
            if (!is_float) bits = uint32_t(v);
            out.insert(out.end(), reinterpret_cast<uint8_t*>(&bits), reinterpret_cast<uint8_t*>(&bits) + 4);
        }
    } else {
        return err(line, tk[at + 1], "data format must be f32, i32 or hex");
    }
    if (out.size() != bytes) {
        return err(line, tk[at], strFormat("data has %zu bytes, the tensor needs %llu", out.size(), (unsigned long long)bytes));
    }
    appendTensorData(&m, t, out.data(), out.size());
    return Status::ok();
}

Status Assembler::blockDirective(const Line& line, std::vector<Line>& lines, size_t& i) {
    if (line.toks.size() < 2) return err(line, 0, ".block needs a name");
    BlockDecl b;
    b.name = line.toks[1].text;
    for (size_t k = 2; k < line.toks.size(); ++k) {
        const std::string& t = line.toks[k].text;
        int64_t v = 0;
        if (t.rfind("args=", 0) != 0 || !parseInt(std::string_view(t).substr(5), &v) || v < 0) {
            return err(line, line.toks[k], "expected args=N, found '" + t + "'");
        }
        b.nargs = uint32_t(v);
    }
    if (blocks.count(b.name)) return err(line, line.toks[1], "block '" + b.name + "' defined twice");
    blocks[b.name] = uint32_t(m.blocks.size());
    b.tcode_offset = uint32_t(m.tcode.size());
    for (++i; i < lines.size(); ++i) {
        const Line& body = lines[i];
        if (body.toks[0].text == ".end") break;
        if (body.toks[0].text[0] == '.' || body.toks.back().kind == Token::COLON) {
            return err(body, 0, "only tensor instructions may appear inside a block (missing .end?)");
        }
        BLUE_TRY(tensorInstr(body, &m.tcode));
    }
    if (i == lines.size()) return err(line, 0, "block '" + b.name + "' has no .end");
    b.tcode_words = uint32_t(m.tcode.size()) - b.tcode_offset;
    m.blocks.push_back(b);
    return Status::ok();
}

Status Assembler::directive(Line& line, std::vector<Line>& lines, size_t& i) {
    const std::string& d = line.toks[0].text;
    if (d == ".layout") return layoutDirective(line);
    if (d == ".const") return constDirective(line, true);
    if (d == ".words") return constDirective(line, false);
    if (d == ".string") return stringDirective(line);
    if (d == ".tensor") return tensorDirective(line);
    if (d == ".block") return blockDirective(line, lines, i);
    if (d == ".extern") {
        if (line.toks.size() != 2 || line.toks[1].kind != Token::STRING) {
            return err(line, 0, ".extern needs a quoted path");
        }
        m.externs.push_back(line.toks[1].text);
        return Status::ok();
    }
    if (d == ".meta") {
        if (line.toks.size() != 3 || line.toks[1].kind != Token::STRING ||
            line.toks[2].kind != Token::STRING) {
            return err(line, 0, ".meta needs a quoted key and a quoted value");
        }
        m.meta.emplace_back(line.toks[1].text, line.toks[2].text);
        return Status::ok();
    }
    if (d == ".entry") {
        if (line.toks.size() != 2) return err(line, 0, ".entry needs a label");
        entry_set = true;
        entry_line = line;
        entry_name = line.toks[1].text;
        return Status::ok();
    }
    if (d == ".end") return err(line, 0, ".end without .block");
    return err(line, 0, "unknown directive '" + d + "'");
}

Status Assembler::finish() {
    for (auto& [line, info] : code_lines) BLUE_TRY(controlInstr(line, info));
    if (entry_set) {
        Result<uint32_t> e = immediate(entry_line, entry_line.toks[1], 'l');
        if (!e) return e.status();
        m.layout.entry = e.value();
    }
    std::sort(m.syms.begin(), m.syms.end(), [](const Symbol& a, const Symbol& b) {
        return std::tie(a.kind, a.value, a.name) < std::tie(b.kind, b.value, b.name);
    });
    Status s = verifyModule(m);
    if (!s) return s.prefix(name);
    return Status::ok();
}

}  // namespace

Result<Module> assemble(std::string_view source, const std::string& name) {
    Assembler as;
    as.name = name;
    std::vector<Line> lines;
    BLUE_TRY(tokenizeSource(source, name, &lines));
    uint32_t pc = 0;
    for (size_t i = 0; i < lines.size(); ++i) {
        Line& line = lines[i];
        // Labels: "name:" possibly followed by an instruction on the same line.
        while (line.toks.size() >= 2 && line.toks[1].kind == Token::COLON) {
            const std::string& label = line.toks[0].text;
            if (!as.labels.emplace(label, pc).second) {
                return as.err(line, line.toks[0], "label '" + label + "' defined twice");
            }
            as.m.syms.push_back({SymKind::LABEL, pc, label});
            line.toks.erase(line.toks.begin(), line.toks.begin() + 2);
        }
        if (line.toks.empty()) continue;
        if (line.toks[0].text[0] == '.') {
            BLUE_TRY(as.directive(line, lines, i));
            continue;
        }
        const OpInfo* info = opByName(line.toks[0].text);
        if (!info) return as.err(line, line.toks[0], "unknown instruction '" + line.toks[0].text + "'");
        if (info->tensor) {
            return as.err(line, line.toks[0],
                          "'" + line.toks[0].text + "' is a tensor instruction; put it in a .block");
        }
        as.code_lines.emplace_back(line, info);
        ++pc;
    }
    BLUE_TRY(as.finish());
    return std::move(as.m);
}

Result<Module> assembleFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return BLUE_ERROR("%s: cannot open file", path.c_str());
    std::stringstream ss;
    ss << in.rdbuf();
    return assemble(ss.str(), path);
}

void appendTensorData(Module* m, TensorDecl* t, const void* bytes, uint64_t size) {
    while (m->data.size() % 64) m->data.push_back(0);
    t->source = DataSource::DATA;
    t->offset = m->data.size();
    t->bytes = size;
    auto* b = static_cast<const uint8_t*>(bytes);
    m->data.insert(m->data.end(), b, b + size);
}

}  // namespace blue
