// .bir serialization and structural parsing (format in module.h). The parser treats its input as
// hostile: every read is bounds-checked, counts are checked against the bytes that remain before
// anything is allocated, and errors name the section and byte offset.
#include "vm/module.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>

#include "vm/abi.h"
#include "vm/kernel_abi.h"

namespace blue {

namespace {

constexpr uint32_t kMagic = 0x52494C42;  // "BLIR"
constexpr size_t kHeaderBytes = 32;
constexpr size_t kSectionEntryBytes = 24;
constexpr uint32_t kLayoutWords = 11;
constexpr uint32_t kMaxStringBytes = 1u << 20;

const char* sectionName(uint32_t id) {
    switch (SectionId(id)) {
        case SectionId::LAYOUT: return "LAYOUT";
        case SectionId::CODE: return "CODE";
        case SectionId::CONST: return "CONST";
        case SectionId::BLOCKS: return "BLOCKS";
        case SectionId::TCODE: return "TCODE";
        case SectionId::TENSORS: return "TENSORS";
        case SectionId::EXTERN: return "EXTERN";
        case SectionId::DATA: return "DATA";
        case SectionId::META: return "META";
        case SectionId::SYMS: return "SYMS";
        case SectionId::KERNELS: return "KERNELS";
    }
    return nullptr;
}

// ---- writing ---------------------------------------------------------------------------------

class Writer {
public:
    void u32(uint32_t v) { raw(&v, 4); }
    void u64(uint64_t v) { raw(&v, 8); }
    void str(std::string_view s) {
        u32(uint32_t(s.size()));
        raw(s.data(), s.size());
        pad(4);
    }
    void words(const std::vector<uint32_t>& w) { raw(w.data(), w.size() * 4); }
    void raw(const void* p, size_t n) {
        auto* b = static_cast<const uint8_t*>(p);
        bytes.insert(bytes.end(), b, b + n);
    }
    void pad(size_t align) {
        while (bytes.size() % align) bytes.push_back(0);
    }
    std::vector<uint8_t> bytes;
};

std::vector<uint8_t> layoutBytes(const Layout& l) {
    Writer w;
    for (uint32_t v : {l.regs, l.local_words, l.heap_words, l.heap_static, l.stack_depth, l.mailbox_cap,
                       l.in_slots, l.in_slot_words, l.max_rows, l.max_steps, l.entry}) {
        w.u32(v);
    }
    return std::move(w.bytes);
}

std::vector<uint8_t> blocksBytes(const Module& m) {
    Writer w;
    w.u32(uint32_t(m.blocks.size()));
    for (const BlockDecl& b : m.blocks) {
        w.str(b.name);
        w.u32(b.tcode_offset);
        w.u32(b.tcode_words);
        w.u32(b.nargs);
    }
    return std::move(w.bytes);
}

std::vector<uint8_t> tensorsBytes(const Module& m) {
    Writer w;
    w.u32(uint32_t(m.tensors.size()));
    for (const TensorDecl& t : m.tensors) {
        w.str(t.name);
        w.u32(uint32_t(t.dtype));
        w.u32(t.cls);
        w.u32(t.ndim);
        for (uint64_t n : t.ne) w.u64(n);
        w.u32(uint32_t(t.source));
        w.u32(t.extern_index);
        w.u64(t.offset);
        w.u64(t.bytes);
    }
    return std::move(w.bytes);
}

std::vector<uint8_t> stringsBytes(const std::vector<std::string>& list) {
    Writer w;
    w.u32(uint32_t(list.size()));
    for (const std::string& s : list) w.str(s);
    return std::move(w.bytes);
}

std::vector<uint8_t> metaBytes(const Module& m) {
    Writer w;
    w.u32(uint32_t(m.meta.size()));
    for (const auto& [k, v] : m.meta) {
        w.str(k);
        w.str(v);
    }
    return std::move(w.bytes);
}

std::vector<uint8_t> symsBytes(const Module& m) {
    Writer w;
    w.u32(uint32_t(m.syms.size()));
    for (const Symbol& s : m.syms) {
        w.u32(uint32_t(s.kind));
        w.u32(s.value);
        w.str(s.name);
    }
    return std::move(w.bytes);
}

std::vector<uint8_t> kernelsBytes(const Module& m) {
    Writer w;
    w.u32(uint32_t(m.kernels.size()));
    for (const KernelDecl& k : m.kernels) {
        w.str(k.name);
        w.u32(uint32_t(k.spirv.size()));
        w.words(k.spirv);
    }
    return std::move(w.bytes);
}

// ---- reading ---------------------------------------------------------------------------------

// A bounds-checked cursor over one section. Failures record the first error and make every later
// read fail too, so callers check once per record.
class Cursor {
public:
    Cursor(std::span<const uint8_t> file, uint64_t base, uint64_t size, std::string where)
        : file_(file), pos_(base), end_(base + size), where_(std::move(where)) {}

    bool u32(uint32_t* v) { return raw(v, 4); }
    bool u64(uint64_t* v) { return raw(v, 8); }
    bool str(std::string* s) {
        uint32_t n = 0;
        uint64_t at = pos_;
        if (!u32(&n)) return false;
        if (n > kMaxStringBytes || n > end_ - pos_) {
            return fail(strFormat("string at offset 0x%llx has length %u, past the section end",
                                  (unsigned long long)at, n));
        }
        s->assign(reinterpret_cast<const char*>(file_.data() + pos_), n);
        pos_ += n;
        pos_ = (pos_ + 3) & ~uint64_t(3);
        if (pos_ > end_) return fail("string padding runs past the section end");
        return true;
    }
    // Reads a count whose records take at least `min_record` bytes each, so a corrupt count cannot
    // make the caller allocate more than the section could hold.
    bool count(uint32_t* n, uint64_t min_record, const char* what) {
        uint64_t at = pos_;
        if (!u32(n)) return false;
        if (uint64_t(*n) * min_record > end_ - pos_) {
            return fail(strFormat("%s count %u at offset 0x%llx does not fit in the section", what,
                                  *n, (unsigned long long)at));
        }
        return true;
    }
    bool done() {
        if (ok_ && pos_ != end_) {
            return fail(strFormat("%llu unused bytes at the end of the section",
                                  (unsigned long long)(end_ - pos_)));
        }
        return ok_;
    }
    bool fail(const std::string& msg) {
        if (ok_) error_ = where_ + ": " + msg;
        ok_ = false;
        return false;
    }
    uint64_t pos() const { return pos_; }
    const std::string& error() const { return error_; }

private:
    bool raw(void* v, size_t n) {
        if (!ok_) return false;
        if (n > end_ - pos_) {
            return fail(strFormat("truncated: %zu bytes needed at offset 0x%llx", n,
                                  (unsigned long long)pos_));
        }
        std::memcpy(v, file_.data() + pos_, n);
        pos_ += n;
        return true;
    }

    std::span<const uint8_t> file_;
    uint64_t pos_, end_;
    std::string where_;
    std::string error_;
    bool ok_ = true;
};

struct SectionRef {
    uint32_t id;
    uint64_t offset, size;
};

Status readWords(std::span<const uint8_t> file, const SectionRef& s, const std::string& where,
                 uint32_t unit_bytes, std::vector<uint32_t>* out) {
    if (s.size % unit_bytes) {
        return BLUE_ERROR("%s: size %llu is not a multiple of %u bytes", where.c_str(),
                          (unsigned long long)s.size, unit_bytes);
    }
    out->resize(s.size / 4);
    if (s.size > 0) std::memcpy(out->data(), file.data() + s.offset, s.size);  // data() may be null
    return Status::ok();
}

Status readLayout(Cursor& c, Layout* l) {
    uint32_t* fields[kLayoutWords] = {&l->regs,        &l->local_words,   &l->heap_words,
                                      &l->heap_static, &l->stack_depth,   &l->mailbox_cap,
                                      &l->in_slots,    &l->in_slot_words, &l->max_rows,
                                      &l->max_steps,   &l->entry};
    for (uint32_t* f : fields) c.u32(f);
    if (!c.done()) return Status::error(c.error());
    return Status::ok();
}

Status readBlocks(Cursor& c, Module* m) {
    uint32_t n = 0;
    if (c.count(&n, 16, "block")) {
        m->blocks.resize(n);
        for (BlockDecl& b : m->blocks) {
            c.str(&b.name);
            c.u32(&b.tcode_offset);
            c.u32(&b.tcode_words);
            c.u32(&b.nargs);
        }
    }
    if (!c.done()) return Status::error(c.error());
    return Status::ok();
}

Status readTensors(Cursor& c, Module* m) {
    uint32_t n = 0;
    if (c.count(&n, 72, "tensor")) {  // an empty name: 4 + 68 bytes of fields
        m->tensors.resize(n);
        for (TensorDecl& t : m->tensors) {
            uint32_t dtype = 0, source = 0;
            c.str(&t.name);
            c.u32(&dtype);
            c.u32(&t.cls);
            c.u32(&t.ndim);
            for (uint64_t& ne : t.ne) c.u64(&ne);
            c.u32(&source);
            c.u32(&t.extern_index);
            c.u64(&t.offset);
            c.u64(&t.bytes);
            t.dtype = DType(dtype);
            t.source = DataSource(source);
        }
    }
    if (!c.done()) return Status::error(c.error());
    return Status::ok();
}

Status readStrings(Cursor& c, std::vector<std::string>* out, const char* what) {
    uint32_t n = 0;
    if (c.count(&n, 4, what)) {
        out->resize(n);
        for (std::string& s : *out) c.str(&s);
    }
    if (!c.done()) return Status::error(c.error());
    return Status::ok();
}

Status readMeta(Cursor& c, Module* m) {
    uint32_t n = 0;
    if (c.count(&n, 8, "meta entry")) {
        m->meta.resize(n);
        for (auto& [k, v] : m->meta) {
            c.str(&k);
            c.str(&v);
        }
    }
    if (!c.done()) return Status::error(c.error());
    return Status::ok();
}

Status readSyms(Cursor& c, Module* m) {
    uint32_t n = 0;
    if (c.count(&n, 12, "symbol")) {
        m->syms.resize(n);
        for (Symbol& s : m->syms) {
            uint32_t kind = 0;
            c.u32(&kind);
            c.u32(&s.value);
            c.str(&s.name);
            s.kind = SymKind(kind);
        }
    }
    if (!c.done()) return Status::error(c.error());
    return Status::ok();
}

// Kernel SPIR-V is only read here; checkKernelSpirv (run by the verifier) judges it.
Status readKernels(Cursor& c, Module* m) {
    uint32_t n = 0;
    if (c.count(&n, 8, "kernel")) {
        m->kernels.resize(n);
        for (KernelDecl& k : m->kernels) {
            uint32_t words = 0;
            c.str(&k.name);
            uint64_t at = c.pos();
            if (!c.u32(&words)) break;
            if (words > BLUE_KERNEL_MAX_WORDS) {
                c.fail(strFormat("kernel '%s': %u SPIR-V words at offset 0x%llx, more than %u", k.name.c_str(), words,
                                 (unsigned long long)at, BLUE_KERNEL_MAX_WORDS));
                break;
            }
            k.spirv.resize(words);
            for (uint32_t& w : k.spirv) c.u32(&w);
        }
    }
    if (!c.done()) return Status::error(c.error());
    return Status::ok();
}

Status readSectionTable(std::span<const uint8_t> bytes, const std::string& name,
                        std::vector<SectionRef>* out) {
    uint32_t count = 0;
    std::memcpy(&count, bytes.data() + 8, 4);
    uint64_t table_end = kHeaderBytes + uint64_t(count) * kSectionEntryBytes;
    if (count > 64 || table_end > bytes.size()) {
        return BLUE_ERROR("%s: header: section count %u does not fit in the file", name.c_str(),
                          count);
    }
    uint32_t seen = 0;
    for (uint32_t i = 0; i < count; ++i) {
        const uint8_t* e = bytes.data() + kHeaderBytes + i * kSectionEntryBytes;
        SectionRef s{};
        uint32_t flags = 0;
        std::memcpy(&s.id, e, 4);
        std::memcpy(&flags, e + 4, 4);
        std::memcpy(&s.offset, e + 8, 8);
        std::memcpy(&s.size, e + 16, 8);
        const char* sname = sectionName(s.id);
        uint64_t entry_at = kHeaderBytes + uint64_t(i) * kSectionEntryBytes;
        if (!sname) {
            return BLUE_ERROR("%s: section table entry %u (offset 0x%llx): unknown section id %u",
                              name.c_str(), i, (unsigned long long)entry_at, s.id);
        }
        if (seen & (1u << s.id)) {
            return BLUE_ERROR("%s: section %s appears twice", name.c_str(), sname);
        }
        seen |= 1u << s.id;
        if (flags != 0) {
            return BLUE_ERROR("%s: section %s: flags 0x%x must be 0", name.c_str(), sname, flags);
        }
        if (s.offset < table_end || s.offset > bytes.size() || s.size > bytes.size() - s.offset) {
            return BLUE_ERROR("%s: section %s: range [0x%llx, +0x%llx) is outside the file "
                              "(size 0x%zx, section data starts at 0x%llx)",
                              name.c_str(), sname, (unsigned long long)s.offset,
                              (unsigned long long)s.size, bytes.size(),
                              (unsigned long long)table_end);
        }
        if (s.offset % 8) {
            return BLUE_ERROR("%s: section %s: offset 0x%llx is not 8-byte aligned", name.c_str(),
                              sname, (unsigned long long)s.offset);
        }
        for (const SectionRef& o : *out) {
            if (s.offset < o.offset + o.size && o.offset < s.offset + s.size) {
                return BLUE_ERROR("%s: section %s overlaps section %s", name.c_str(), sname,
                                  sectionName(o.id));
            }
        }
        out->push_back(s);
    }
    for (SectionId required : {SectionId::LAYOUT, SectionId::CODE}) {
        if (!(seen & (1u << uint32_t(required)))) {
            return BLUE_ERROR("%s: required section %s is missing", name.c_str(),
                              sectionName(uint32_t(required)));
        }
    }
    return Status::ok();
}

Status readSection(std::span<const uint8_t> bytes, const SectionRef& s, const std::string& name,
                   Module* m) {
    std::string where = name + ": section " + sectionName(s.id);
    Cursor c(bytes, s.offset, s.size, where);
    switch (SectionId(s.id)) {
        case SectionId::LAYOUT: return readLayout(c, &m->layout);
        case SectionId::CODE: return readWords(bytes, s, where, 8, &m->code);
        case SectionId::CONST: return readWords(bytes, s, where, 4, &m->consts);
        case SectionId::TCODE: return readWords(bytes, s, where, 4, &m->tcode);
        case SectionId::BLOCKS: return readBlocks(c, m);
        case SectionId::TENSORS: return readTensors(c, m);
        case SectionId::EXTERN: return readStrings(c, &m->externs, "extern file");
        case SectionId::META: return readMeta(c, m);
        case SectionId::SYMS: return readSyms(c, m);
        case SectionId::KERNELS: return readKernels(c, m);
        case SectionId::DATA:
            m->data.assign(bytes.begin() + s.offset, bytes.begin() + s.offset + s.size);
            return Status::ok();
    }
    return BLUE_ERROR("%s: unhandled section", where.c_str());
}

}  // namespace

bool Module::constString(uint32_t offset, std::string* out) const {
    if (offset >= consts.size()) return false;
    uint32_t len = consts[offset];
    uint64_t words = (uint64_t(len) + 3) / 4;
    if (words > consts.size() - offset - 1) return false;
    out->assign(reinterpret_cast<const char*>(consts.data() + offset + 1), len);
    return true;
}

uint32_t Module::addConstString(std::string_view s) {
    uint32_t at = uint32_t(consts.size());
    consts.push_back(uint32_t(s.size()));
    size_t words = (s.size() + 3) / 4;
    size_t base = consts.size();
    consts.resize(base + words, 0);
    std::memcpy(consts.data() + base, s.data(), s.size());
    return at;
}

const std::string* Module::metaValue(std::string_view key) const {
    for (const auto& [k, v] : meta) {
        if (k == key) return &v;
    }
    return nullptr;
}

std::vector<uint8_t> serializeModule(const Module& m) {
    std::vector<std::pair<SectionId, std::vector<uint8_t>>> sections;
    sections.emplace_back(SectionId::LAYOUT, layoutBytes(m.layout));
    auto words = [](const std::vector<uint32_t>& w) {
        std::vector<uint8_t> b(w.size() * 4);
        std::memcpy(b.data(), w.data(), b.size());
        return b;
    };
    sections.emplace_back(SectionId::CODE, words(m.code));
    if (!m.consts.empty()) sections.emplace_back(SectionId::CONST, words(m.consts));
    if (!m.blocks.empty()) sections.emplace_back(SectionId::BLOCKS, blocksBytes(m));
    if (!m.tcode.empty()) sections.emplace_back(SectionId::TCODE, words(m.tcode));
    if (!m.tensors.empty()) sections.emplace_back(SectionId::TENSORS, tensorsBytes(m));
    if (!m.externs.empty()) sections.emplace_back(SectionId::EXTERN, stringsBytes(m.externs));
    if (!m.meta.empty()) sections.emplace_back(SectionId::META, metaBytes(m));
    if (!m.syms.empty()) sections.emplace_back(SectionId::SYMS, symsBytes(m));
    if (!m.kernels.empty()) sections.emplace_back(SectionId::KERNELS, kernelsBytes(m));
    if (!m.data.empty()) sections.emplace_back(SectionId::DATA, m.data);

    Writer w;
    w.u32(kMagic);
    uint16_t minor = m.kernels.empty() ? m.minor : std::max(m.minor, kModuleMinorKernels);
    w.raw(&m.major, 2);
    w.raw(&minor, 2);
    w.u32(uint32_t(sections.size()));
    w.u32(0);
    w.u64(0);  // file size, patched below
    w.u64(0);
    size_t table_at = w.bytes.size();
    w.bytes.resize(table_at + sections.size() * kSectionEntryBytes);
    for (size_t i = 0; i < sections.size(); ++i) {
        auto& [id, payload] = sections[i];
        w.pad(id == SectionId::DATA ? 64 : 8);
        uint64_t offset = w.bytes.size(), size = payload.size();
        uint8_t* e = w.bytes.data() + table_at + i * kSectionEntryBytes;
        uint32_t id32 = uint32_t(id), zero = 0;
        std::memcpy(e, &id32, 4);
        std::memcpy(e + 4, &zero, 4);
        std::memcpy(e + 8, &offset, 8);
        std::memcpy(e + 16, &size, 8);
        w.raw(payload.data(), payload.size());
    }
    uint64_t total = w.bytes.size();
    std::memcpy(w.bytes.data() + 16, &total, 8);
    return std::move(w.bytes);
}

Result<Module> parseModule(std::span<const uint8_t> bytes, const std::string& name) {
    if (bytes.size() < kHeaderBytes) {
        return BLUE_ERROR("%s: file is %zu bytes, shorter than the %zu-byte header", name.c_str(),
                          bytes.size(), kHeaderBytes);
    }
    uint32_t magic = 0, flags = 0;
    uint64_t file_size = 0, reserved = 0;
    Module m;
    std::memcpy(&magic, bytes.data(), 4);
    std::memcpy(&m.major, bytes.data() + 4, 2);
    std::memcpy(&m.minor, bytes.data() + 6, 2);
    std::memcpy(&flags, bytes.data() + 12, 4);
    std::memcpy(&file_size, bytes.data() + 16, 8);
    std::memcpy(&reserved, bytes.data() + 24, 8);
    if (magic != kMagic) {
        return BLUE_ERROR("%s: bad magic 0x%08x at offset 0 (expected \"BLIR\"): not a .bir module",
                          name.c_str(), magic);
    }
    if (m.major != kModuleMajor) {
        return BLUE_ERROR("%s: format version %u.%u is not supported (this BlueVM reads %u.x)",
                          name.c_str(), m.major, m.minor, kModuleMajor);
    }
    if (flags != 0 || reserved != 0) {
        return BLUE_ERROR("%s: header: flags/reserved fields at offset 12/24 must be 0",
                          name.c_str());
    }
    if (file_size != bytes.size()) {
        return BLUE_ERROR("%s: header says the file is %llu bytes but it is %zu (truncated or "
                          "padded)",
                          name.c_str(), (unsigned long long)file_size, bytes.size());
    }
    std::vector<SectionRef> sections;
    BLUE_TRY(readSectionTable(bytes, name, &sections));
    for (const SectionRef& s : sections) BLUE_TRY(readSection(bytes, s, name, &m));
    return m;
}

Result<Module> readModuleFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return BLUE_ERROR("%s: cannot open file", path.c_str());
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                               std::istreambuf_iterator<char>());
    if (in.bad()) return BLUE_ERROR("%s: read error", path.c_str());
    return parseModule(bytes, path);
}

Status writeModuleFile(const Module& m, const std::string& path) {
    std::vector<uint8_t> bytes = serializeModule(m);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) return BLUE_ERROR("%s: cannot create file", path.c_str());
    out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    if (!out) return BLUE_ERROR("%s: write error", path.c_str());
    return Status::ok();
}

}  // namespace blue
