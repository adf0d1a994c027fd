// The module loader's defences (vm/module.h parseModule, vm/verify.h verifyModule): hand-made
// malformed files and modules, each rejected with a message naming what is wrong; then a
// mutation test: thousands of seeded mutants of real modules either fail cleanly or verify, and
// every verified mutant runs to a clean end on the reference machine (and a subset on the GPU,
// where it must also match the reference exactly on one instance).
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>

#include <unistd.h>

#include "compiler/asm.h"
#include "tests/gpu_fixture.h"
#include "tests/test_paths.h"
#include "tests/vm_programs.h"
#include "vm/abi.h"
#include "vm/interp.h"
#include "vm/verify.h"

namespace blue::test {
namespace {

constexpr const char* kBaseSource = R"(.layout regs=8 local=4 heap=4 max_rows=4
.const k 1 2
.string s "hi"
.tensor w weight f32 [4, 2] data f32 1 2 3 4 5 6 7 8
.tensor x rows f32 [4]
.tensor y rows f32 [2]
.tensor v instance f32 [4]
.block b args=1
    matmul y, w, x
.end
main:
    li   r1, 1
    run  b, r1
    ldk  r2, r1, k
    tld  r3, r1, v
    outs s
    bnez r0, main
    halt
)";
// Instruction indices in kBaseSource.
constexpr uint32_t kLi = 0, kRun = 1, kLdk = 2, kTld = 3, kOuts = 4, kBnez = 5, kHalt = 6;

Module baseModule() {
    Result<Module> m = assemble(kBaseSource, "base");
    REQUIRE_MESSAGE(m.isOk(), m.message());
    return m.value();
}

// ---- raw file edits ------------------------------------------------------------------------

struct SectionEntry {
    uint32_t id;
    uint64_t offset, size;
    size_t entry_at;  // byte offset of the table entry
};

std::vector<SectionEntry> sectionTable(const std::vector<uint8_t>& bytes) {
    uint32_t count = 0;
    std::memcpy(&count, bytes.data() + 8, 4);
    std::vector<SectionEntry> out;
    for (uint32_t i = 0; i < count; ++i) {
        SectionEntry e{};
        e.entry_at = 32 + size_t(i) * 24;
        std::memcpy(&e.id, bytes.data() + e.entry_at, 4);
        std::memcpy(&e.offset, bytes.data() + e.entry_at + 8, 8);
        std::memcpy(&e.size, bytes.data() + e.entry_at + 16, 8);
        out.push_back(e);
    }
    return out;
}

SectionEntry section(const std::vector<uint8_t>& bytes, SectionId id) {
    for (const SectionEntry& e : sectionTable(bytes)) {
        if (e.id == uint32_t(id)) return e;
    }
    FAIL("section not found");
    return {};
}

void put32(std::vector<uint8_t>& b, size_t at, uint32_t v) {
    std::memcpy(b.data() + at, &v, 4);
}
void put64(std::vector<uint8_t>& b, size_t at, uint64_t v) {
    std::memcpy(b.data() + at, &v, 8);
}
void fixFileSize(std::vector<uint8_t>& b) {
    put64(b, 16, b.size());
}

struct FileCase {
    const char* name;
    std::function<void(std::vector<uint8_t>&)> edit;
    const char* message;
};

TEST_CASE("verify: malformed files are rejected by the parser with a precise message") {
    const std::vector<uint8_t> good = serializeModule(baseModule());
    REQUIRE(parseModule(good, "m.bir").isOk());
    auto entry = [](std::vector<uint8_t>& b, SectionId id) { return section(b, id).entry_at; };
    const FileCase cases[] = {
        {"bad magic", [](auto& b) { b[0] = 'X'; }, "m.bir: bad magic 0x52494c58 at offset 0"},
        {"version 2.0", [](auto& b) { b[4] = 2; }, "m.bir: format version 2.0 is not supported"},
        {"header shorter than 32 bytes", [](auto& b) { b.resize(20); },
         "file is 20 bytes, shorter than the 32-byte header"},
        {"truncated", [](auto& b) { b.erase(b.end() - 8, b.end()); }, "but it is"},
        {"padded",
         [](auto& b) {
             b.insert(b.end(), {0, 0, 0, 0, 0, 0, 0, 0});
         },
         "(truncated or padded)"},
        {"header flags", [](auto& b) { b[12] = 1; }, "flags/reserved fields at offset 12/24"},
        {"header reserved", [](auto& b) { b[31] = 1; }, "flags/reserved fields at offset 12/24"},
        {"section count", [](auto& b) { put32(b, 8, 1000); }, "section count 1000 does not fit"},
        {"unknown section id", [&](auto& b) { put32(b, entry(b, SectionId::CONST), 9); },
         "(offset 0x50): unknown section id 9"},
        {"duplicate section",
         [&](auto& b) { put32(b, entry(b, SectionId::CONST), uint32_t(SectionId::CODE)); },
         "section CODE appears twice"},
        {"section flags", [&](auto& b) { put32(b, entry(b, SectionId::CODE) + 4, 1); },
         "section CODE: flags 0x1 must be 0"},
        {"section past the end",
         [&](auto& b) { put64(b, entry(b, SectionId::CODE) + 8, b.size() + 8); },
         "section CODE: range"},
        {"section size past the end",
         [&](auto& b) { put64(b, entry(b, SectionId::CODE) + 16, ~uint64_t(0)); },
         "is outside the file"},
        {"section inside the header", [&](auto& b) { put64(b, entry(b, SectionId::CODE) + 8, 8); },
         "is outside the file"},
        {"misaligned section",
         [&](auto& b) {
             put64(b, entry(b, SectionId::CODE) + 8, section(b, SectionId::CODE).offset + 4);
             put64(b, entry(b, SectionId::CODE) + 16, 8);
         },
         "section CODE: offset 0x"},
        {"overlapping sections",
         [&](auto& b) {
             put64(b, entry(b, SectionId::CODE) + 8, section(b, SectionId::LAYOUT).offset);
         },
         "section CODE overlaps section LAYOUT"},
        {"missing CODE",
         [&](auto& b) { put32(b, entry(b, SectionId::CODE), uint32_t(SectionId::META)); },
         "required section CODE is missing"},
        {"missing LAYOUT",
         [&](auto& b) { put32(b, entry(b, SectionId::LAYOUT), uint32_t(SectionId::META)); },
         "required section LAYOUT is missing"},
        {"CODE not whole instructions",
         [&](auto& b) {
             put64(b, entry(b, SectionId::CODE) + 16, section(b, SectionId::CODE).size - 4);
         },
         "section CODE: size 52 is not a multiple of 8 bytes"},
        {"LAYOUT short", [&](auto& b) { put64(b, entry(b, SectionId::LAYOUT) + 16, 40); },
         "section LAYOUT: truncated: 4 bytes needed"},
        {"LAYOUT long", [&](auto& b) { put64(b, entry(b, SectionId::LAYOUT) + 16, 48); },
         "section LAYOUT: 4 unused bytes at the end of the section"},
        {"block count", [&](auto& b) { put32(b, section(b, SectionId::BLOCKS).offset, 1000000); },
         "section BLOCKS: block count 1000000 at offset"},
        {"tensor count", [&](auto& b) { put32(b, section(b, SectionId::TENSORS).offset, 5); },
         "section TENSORS: tensor count 5 at offset"},
        {"string past its section",
         [&](auto& b) { put32(b, section(b, SectionId::BLOCKS).offset + 4, 1000); },
         "has length 1000, past the section end"},
        {"symbol count",
         [&](auto& b) { put32(b, section(b, SectionId::SYMS).offset, 0xFFFFFFFFu); },
         "symbol count 4294967295"},
    };
    for (const FileCase& c : cases) {
        INFO("case: " << std::string(c.name));
        std::vector<uint8_t> bytes = good;
        c.edit(bytes);
        Result<Module> m = parseModule(bytes, "m.bir");
        REQUIRE(!m.isOk());
        INFO("message: " << m.message());
        CHECK(m.message().rfind("m.bir: ", 0) == 0);
        CHECK(m.message().find(c.message) != std::string::npos);
    }
    // A newer minor version of the same major is read.
    std::vector<uint8_t> minor = good;
    minor[6] = 7;
    Result<Module> m = parseModule(minor, "m.bir");
    REQUIRE(m.isOk());
    CHECK(m.value().minor == 7);
}

TEST_CASE("verify: files on disk: round trip, a corrupt file names its path") {
    const std::string dir =
        (std::filesystem::temp_directory_path() / ("blue_verify_" + std::to_string(::getpid())))
            .string();
    std::filesystem::create_directories(dir);
    const std::string path = dir + "/base.bir";
    Module base = baseModule();
    REQUIRE(writeModuleFile(base, path).isOk());
    Result<Module> loaded = loadModuleFile(path);
    REQUIRE_MESSAGE(loaded.isOk(), loaded.message());
    CHECK(serializeModule(loaded.value()) == serializeModule(base));

    Module bad = base;
    bad.code[kHalt * 2 + 1] = 5;  // HALT with an immediate
    REQUIRE(writeModuleFile(bad, path).isOk());
    Result<Module> rejected = loadModuleFile(path);
    REQUIRE(!rejected.isOk());
    CHECK(rejected.message().rfind(path + ": code: instruction 6", 0) == 0);

    Result<Module> missing = loadModuleFile(dir + "/nope.bir");
    REQUIRE(!missing.isOk());
    CHECK(missing.message() == dir + "/nope.bir: cannot open file");
    std::filesystem::remove_all(dir);
}

// ---- semantic checks -----------------------------------------------------------------------

struct ModuleCase {
    const char* name;
    std::function<void(Module&)> edit;
    const char* message;
};

void setField(Module& m, uint32_t instr, int field, uint8_t value) {
    Instr in = decodeInstr(m.code[instr * 2], m.code[instr * 2 + 1]);
    uint8_t f[4] = {in.op, in.a, in.b, in.c};
    f[field] = value;
    m.code[instr * 2] = encodeWord0(f[0], f[1], f[2], f[3]);
}
uint32_t& imm(Module& m, uint32_t instr) {
    return m.code[instr * 2 + 1];
}
TensorDecl& tensor(Module& m, const char* name) {
    for (TensorDecl& t : m.tensors) {
        if (t.name == name) return t;
    }
    FAIL("no tensor " << name);
    return m.tensors[0];
}

// Each case edits a valid module; the verifier must refuse the result with the case's message.
template <size_t N>
void expectRejected(const ModuleCase (&cases)[N]) {
    for (const ModuleCase& c : cases) {
        INFO("case: " << std::string(c.name));
        Module m = baseModule();
        c.edit(m);
        Status s = verifyModule(m);
        REQUIRE(!s.isOk());
        INFO("message: " << s.message());
        CHECK(s.message().find(c.message) != std::string::npos);
    }
}

TEST_CASE("verify: control instructions with bad operands are rejected") {
    REQUIRE(verifyModule(baseModule()).isOk());
    const ModuleCase cases[] = {
        {"register out of range", [](Module& m) { setField(m, kLi, 1, 8); },
         "code: instruction 0 (byte offset 0x0) LI: register r8 is out of range (the layout has 8 "
         "registers)"},
        {"register B out of range", [](Module& m) { setField(m, kLdk, 2, 200); },
         "instruction 2 (byte offset 0x10) LDK: register r200 is out of range"},
        {"jump target outside code", [](Module& m) { imm(m, kBnez) = 7; },
         "instruction 5 (byte offset 0x28) BNEZ: jump target 7 is outside the code (7 "
         "instructions)"},
        {"unknown opcode", [](Module& m) { setField(m, kHalt, 0, 0x0F); },
         "instruction 6 (byte offset 0x30): unknown opcode 0x0f"},
        {"unknown opcode 0xff", [](Module& m) { setField(m, kHalt, 0, 0xFF); },
         "unknown opcode 0xff"},
        {"tensor op in control code", [](Module& m) { setField(m, kHalt, 0, uint8_t(Op::MATMUL)); },
         "MATMUL: a tensor instruction cannot appear in control code"},
        {"block index out of range", [](Module& m) { imm(m, kRun) = 1; },
         "RUN: block 1 does not exist (1 blocks)"},
        {"RUN arguments past the register file",
         [](Module& m) {
             m.blocks[0].nargs = 3;
             setField(m, kRun, 1, 6);
         },
         "RUN: block 'b' takes 3 argument registers from r6, past r7"},
        {"unused operand field", [](Module& m) { setField(m, kHalt, 1, 1); },
         "HALT: unused operand field A is 1, must be 0"},
        {"unused operand field C", [](Module& m) { setField(m, kLi, 3, 4); },
         "LI: unused operand field C is 4, must be 0"},
        {"unused immediate", [](Module& m) { imm(m, kHalt) = 1; },
         "HALT: unused immediate must be 0"},
        {"constant outside the pool", [](Module& m) { imm(m, kLdk) = 6; },
         "LDK: constant offset 6 is outside the pool (4 words)"},
        {"no string at the offset", [](Module& m) { imm(m, kOuts) = 3; },
         "OUTS: no string fits at constant offset 3"},
        {"nonexistent tensor", [](Module& m) { imm(m, kTld) = 4; },
         "TLD: tensor 4 does not exist (4 tensors)"},
        {"TLD of a WEIGHT", [](Module& m) { imm(m, kTld) = 0; },
         "TLD: tensor 'w' is not INSTANCE or GLOBAL storage"},
        {"TLD of an F16 tensor", [](Module& m) { tensor(m, "v").dtype = DType::F16; },
         "TLD: tensor 'v' is not F32 or I32"},
        {"no code", [](Module& m) { m.code.clear(); }, "code: the module has no instructions"},
        {"label past the code", [](Module& m) { m.syms[0].value = 7; },
         "symbol 'main' (kind 1) has invalid value 7"},
        {"string symbol without a string",
         [](Module& m) {
             for (Symbol& s : m.syms) {
                 if (s.kind == SymKind::STRING) s.value = 3;
             }
         },
         "symbol 's' (kind 3) has invalid value 3"},
    };
    expectRejected(cases);
}

TEST_CASE("verify: tensors, blocks and tensor instructions with bad declarations are rejected") {
    const ModuleCase cases[] = {
        {"unsupported type", [](Module& m) { tensor(m, "x").dtype = DType::IQ2_XXS; },
         "tensor 1 'x': type IQ2_XXS is not supported by BlueVM"},
        {"unknown type id", [](Module& m) { tensor(m, "x").dtype = DType(99); },
         "tensor 1 'x': unknown type id 99"},
        {"zero dim", [](Module& m) { tensor(m, "x").ne[0] = 0; },
         "tensor 1 'x': dim 0 = 0 makes the tensor empty or too large"},
        {"huge dims",
         [](Module& m) {
             TensorDecl& t = tensor(m, "x");
             t.ndim = 2;
             t.ne[0] = uint64_t(1) << 30;
             t.ne[1] = uint64_t(1) << 20;
         },
         "tensor 1 'x': dim 1 = 1048576 makes the tensor empty or too large"},
        {"activation over 4 GiB",
         [](Module& m) { tensor(m, "v").ne[0] = (uint64_t(1) << 30) + 64; },
         "tensor 3 'v': needs 4294967552 bytes of storage, more than the 4 GiB limit"},
        {"rows activation over 4 GiB in all",
         [](Module& m) {
             m.layout.max_rows = 65535;
             tensor(m, "x").ne[0] = 1 << 15;
         },
         "tensor 1 'x': needs 8589803520 bytes of storage (max_rows rows), more than the 4 GiB "
         "limit"},
        {"dim past ndim", [](Module& m) { tensor(m, "x").ne[2] = 3; },
         "tensor 1 'x': dim 2 = 3 past ndim must be 1"},
        {"ndim 0", [](Module& m) { tensor(m, "x").ndim = 0; }, "ndim 0 is outside [1, 4]"},
        {"ndim 5", [](Module& m) { tensor(m, "x").ndim = 5; }, "ndim 5 is outside [1, 4]"},
        {"unknown class", [](Module& m) { tensor(m, "x").cls = 4; }, "unknown storage class 4"},
        {"data out of range", [](Module& m) { tensor(m, "w").offset = m.data.size() - 16; },
         "tensor 0 'w': data [16, +32) is outside the DATA section (32 bytes)"},
        {"data size mismatch", [](Module& m) { tensor(m, "w").bytes = 28; },
         "tensor 0 'w': stores 28 bytes but its shape and type need 32"},
        {"weight without data", [](Module& m) { tensor(m, "w").source = DataSource::NONE; },
         "tensor 0 'w': a WEIGHT tensor needs data"},
        {"rows with data",
         [](Module& m) {
             TensorDecl& t = tensor(m, "x");
             t.source = DataSource::DATA;
             t.bytes = 16;
         },
         "tensor 1 'x': only WEIGHT and GLOBAL tensors can have initial data"},
        {"extern index", [](Module& m) { tensor(m, "w").source = DataSource::EXTERN; },
         "tensor 0 'w': extern file index 0, but the module names 0 files"},
        {"extern for an instance tensor",
         [](Module& m) {
             m.externs.push_back("f.gguf");
             TensorDecl& t = tensor(m, "v");
             t.source = DataSource::EXTERN;
             t.bytes = 16;
         },
         "tensor 3 'v': only WEIGHT tensors can come from a file"},
        {"unknown data source", [](Module& m) { tensor(m, "w").source = DataSource(9); },
         "tensor 0 'w': unknown data source 9"},
        {"row not whole blocks", [](Module& m) { tensor(m, "w").dtype = DType::Q8_0; },
         "tensor 0 'w': row length 4 is not a whole number of Q8_0 blocks (32)"},
        {"name used twice", [](Module& m) { tensor(m, "x").name = "w"; },
         "tensor 1 'w': name used twice"},
        {"empty name", [](Module& m) { tensor(m, "x").name = ""; }, "tensor 1 '': empty name"},
        {"too many block arguments",
         [](Module& m) {
             m.layout.regs = 32;
             m.blocks[0].nargs = 9;
         },
         "block 0 'b': 9 arguments, at most 8"},
        {"block outside TCODE", [](Module& m) { m.blocks[0].tcode_offset = 2; },
         "block 'b': TCODE range [2, +4) is outside TCODE (4 words)"},
        {"not a tensor opcode", [](Module& m) { m.tcode[0] = encodeTensorHeader(0x13, 3); },
         "block 'b': TCODE word 0: 0x13 is not a tensor opcode"},
        {"wrong operand count", [](Module& m) { m.tcode[0] = encodeTensorHeader(0x83, 2); },
         "block 'b': TCODE word 0: MATMUL has 2 operands, its format needs 3"},
        {"instruction past the block", [](Module& m) { m.blocks[0].tcode_words = 3; },
         "block 'b': TCODE word 0: MATMUL runs past the end of the block"},
        {"nonexistent operand tensor", [](Module& m) { m.tcode[2] = 9; },
         "block 0 'b': MATMUL at TCODE word 0: operand 1 names tensor 9, but there are 4"},
        {"matmul K mismatch", [](Module& m) { tensor(m, "x").ne[0] = 3; },
         "MATMUL at TCODE word 0: operand 2 (tensor 'x'): has 3 elements per item, expected 4"},
        {"matmul N mismatch", [](Module& m) { tensor(m, "y").ne[0] = 3; },
         "operand 0 (tensor 'y'): has 3 elements per item, expected 2"},
        {"matmul into a weight", [](Module& m) { m.tcode[1] = 0; },
         "operand 0 (tensor 'w'): destination must be ROWS or INSTANCE, not WEIGHT"},
        {"matmul of a rows matrix", [](Module& m) { m.tcode[2] = 1; },
         "operand 1 (tensor 'x'): matrix must be WEIGHT or GLOBAL"},
        {"matmul of an f16 vector", [](Module& m) { tensor(m, "x").dtype = DType::F16; },
         "operand 2 (tensor 'x'): type F16, expected F32"},
    };
    expectRejected(cases);
}

// The KV-cache kernels are built per cache type and read the context length of the K cache, so
// KVSTORE and ATTN take only K and V caches that agree in both.
TEST_CASE("verify: KV caches of KVSTORE and ATTN must agree in type and context length") {
    const char* src = R"(.layout regs=4 max_rows=2
.tensor x rows f32 [8]
.tensor kc instance f16 [8, 16]
.tensor vc instance f16 [8, 16]
.block b args=2
    kvstore x, kc, x, vc, 1
    attn x, kc, vc, x, 2, 2, 1, 0.5
.end
halt
)";
    Result<Module> good = assemble(src, "kv");
    REQUIRE_MESSAGE(good.isOk(), good.message());
    REQUIRE(verifyModule(good.value()).isOk());
    struct Case {
        DType type;
        uint64_t ctx;
        const char* message;
    };
    const Case cases[] = {
        {DType::F32, 16, "operand 3 (tensor 'vc'): K and V caches differ in type"},
        {DType::F16, 15, "operand 3 (tensor 'vc'): K and V caches differ in context length"}};
    for (const Case& c : cases) {
        Module m = good.value();
        m.tensors[2].dtype = c.type;
        m.tensors[2].ne[1] = c.ctx;
        Status s = verifyModule(m);
        REQUIRE(!s.isOk());
        CHECK(s.message() == std::string("block 0 'b': KVSTORE at TCODE word 0: ") + c.message);
        // ATTN alone: the V cache is its operand 2.
        m.tcode.erase(m.tcode.begin(), m.tcode.begin() + 6);
        m.blocks[0].tcode_words -= 6;
        s = verifyModule(m);
        REQUIRE(!s.isOk());
        std::string attn = std::string(c.message).replace(8, 1, "2");
        CHECK(s.message() == "block 0 'b': ATTN at TCODE word 0: " + attn);
    }
}

TEST_CASE("verify: layout limits (vm/abi.h) are accepted at the limit and rejected past it") {
    struct Limit {
        const char* field;
        std::function<void(Layout&, uint32_t)> set;
        uint32_t low, high;  // the accepted range, as the message states it
    };
    const Limit limits[] = {
        {"regs", [](Layout& l, uint32_t v) { l.regs = v; }, 8, BLUE_MAX_REGS},
        {"local_words", [](Layout& l, uint32_t v) { l.local_words = v; }, 0, BLUE_MAX_LOCAL_WORDS},
        {"heap_words",
         [](Layout& l, uint32_t v) {
             l.heap_words = v;
             l.heap_static = 0;
         },
         0, BLUE_MAX_HEAP_WORDS},
        {"heap_static",
         [](Layout& l, uint32_t v) {
             l.heap_words = 1000;
             l.heap_static = v;
         },
         0, 1000},
        {"stack_depth", [](Layout& l, uint32_t v) { l.stack_depth = v; }, 0, BLUE_MAX_STACK_DEPTH},
        {"mailbox_cap", [](Layout& l, uint32_t v) { l.mailbox_cap = v; }, 1, BLUE_MAX_MAILBOX},
        {"in_slots",
         [](Layout& l, uint32_t v) {
             l.in_slots = v;
             l.in_slot_words = v ? 4 : 0;
         },
         0, BLUE_MAX_IN_SLOTS},
        {"in_slot_words",
         [](Layout& l, uint32_t v) {
             l.in_slots = 2;
             l.in_slot_words = v;
         },
         1, BLUE_MAX_IN_SLOT_WORDS},
        {"max_rows", [](Layout& l, uint32_t v) { l.max_rows = v; }, 1, BLUE_MAX_ROWS},
        {"max_steps", [](Layout& l, uint32_t v) { l.max_steps = v; }, 1, BLUE_MAX_STEPS},
    };
    for (const Limit& lim : limits) {
        CAPTURE(lim.field);
        for (uint32_t v : {lim.low, lim.high}) {
            Module m = baseModule();
            lim.set(m.layout, v);
            CAPTURE(v);
            Status s = verifyModule(m);
            CHECK_MESSAGE(s.isOk(), s.message());
        }
        std::vector<uint32_t> bad = {lim.high + 1, 0xFFFFFFFFu};
        if (lim.low > 0 && std::string(lim.field) != "regs") bad.push_back(lim.low - 1);
        for (uint32_t v : bad) {
            Module m = baseModule();
            lim.set(m.layout, v);
            CAPTURE(v);
            Status s = verifyModule(m);
            REQUIRE(!s.isOk());
            std::string want = strFormat("layout: %s = %u is outside [%u, %u]", lim.field, v,
                                         std::string(lim.field) == "regs" ? 1 : lim.low, lim.high);
            CHECK(s.message() == want);
        }
    }
    // Words per input slot must be 0 when the program reads no input.
    Module m = baseModule();
    m.layout.in_slot_words = 1;
    CHECK(verifyModule(m).message() == "layout: in_slot_words = 1 is outside [0, 0]");
    // Entry inside the code.
    m = baseModule();
    m.layout.entry = m.instrCount();
    CHECK(verifyModule(m).message() == "layout: entry 7 is outside the code (7 instructions)");
    m.layout.entry = m.instrCount() - 1;
    CHECK(verifyModule(m).isOk());
    // A module without blocks may have max_rows 0.
    Result<Module> plain = assemble(".layout max_rows=0\nhalt\n", "plain");
    CHECK(plain.isOk());
}

// ---- mutation test -------------------------------------------------------------------------

constexpr uint32_t kMutantsPerBase = 3000;  // half byte-level, half structured
constexpr uint32_t kRefInstances = 3;
constexpr uint64_t kMutantCycles = 200;
constexpr uint32_t kMutantSteps = 256;        // max_steps is clamped to this for the runs
constexpr uint64_t kRefBudget = 64ull << 20;  // bytes of machine state a run may allocate
constexpr uint64_t kGpuBudget = 4ull << 20;
constexpr uint32_t kGpuMutants = 300;

struct Base {
    std::string name;
    Module module;
    std::vector<std::vector<uint32_t>> input;
};

std::vector<std::vector<uint32_t>> readInputFile(const std::string& path) {
    std::vector<std::vector<uint32_t>> out;
    FILE* f = std::fopen(path.c_str(), "r");
    if (!f) return out;
    char line[4096];
    while (std::fgets(line, sizeof line, f)) {
        std::vector<uint32_t> msg;
        char* p = line;
        for (;;) {
            char* end = nullptr;
            long long v = std::strtoll(p, &end, 10);
            if (end == p) break;
            msg.push_back(uint32_t(v));
            p = end;
        }
        if (!msg.empty()) out.push_back(msg);
    }
    std::fclose(f);
    return out;
}

std::vector<Base> mutationBases() {
    std::vector<Base> bases;
    for (const std::string& path : goldenProgramPaths()) {
        Result<Module> m = assembleFile(path);
        REQUIRE_MESSAGE(m.isOk(), m.message());
        std::string input = path.substr(0, path.size() - 5) + ".input";
        bases.push_back(
            {std::filesystem::path(path).filename().string(), m.value(), readInputFile(input)});
    }
    Result<std::string> src = everyOpSource();
    REQUIRE(src.isOk());
    Result<Module> every = assemble(src.value(), "every_op");
    REQUIRE_MESSAGE(every.isOk(), every.message());
    bases.push_back({"every_op", every.value(), everyOpInput()});
    return bases;
}

uint32_t extremeWord(std::mt19937& rng, uint64_t file_size) {
    static const uint32_t kValues[] = {
        0,    1,    2,    3,     4,      7,       8,          16,         31,         32,
        0x7F, 0x80, 0xFF, 0x100, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF};
    uint32_t pick = rng() % 24;
    if (pick < 20) return kValues[pick];
    if (pick == 20) return uint32_t(file_size);
    if (pick == 21) return uint32_t(file_size) + 8;
    return rng();
}

std::vector<uint8_t> mutateBytes(const std::vector<uint8_t>& in, std::mt19937& rng) {
    std::vector<uint8_t> b = in;
    const size_t n = b.size();
    switch (rng() % 8) {
        case 0:  // bit flips
            for (uint32_t k = 1 + rng() % 3; k > 0; --k) b[rng() % n] ^= uint8_t(1u << (rng() % 8));
            break;
        case 1:
            b[rng() % n] = uint8_t(rng());
            break;
        case 2:
            put32(b, (rng() % (n / 4)) * 4, extremeWord(rng, n));
            break;
        case 3: {
            const uint64_t v[] = {0, ~uint64_t(0), uint64_t(1) << 63, n, n + 8, uint64_t(rng())};
            put64(b, (rng() % (n / 8)) * 8, v[rng() % 6]);
            break;
        }
        case 4:  // header and section table words, where one word decides the most
            put32(b, (rng() % std::min<size_t>(n / 4, 64)) * 4, extremeWord(rng, n));
            break;
        case 5:
            b.resize(rng() % n);
            if (b.size() >= 32 && rng() % 2) fixFileSize(b);
            break;
        case 6: {
            size_t at = rng() % n;
            std::vector<uint8_t> extra(1 + rng() % 16);
            for (uint8_t& e : extra) e = uint8_t(rng());
            b.insert(b.begin() + long(at), extra.begin(), extra.end());
            if (rng() % 2) fixFileSize(b);
            break;
        }
        default: {  // swap two words
            size_t i = (rng() % (n / 4)) * 4, j = (rng() % (n / 4)) * 4;
            for (int k = 0; k < 4; ++k) std::swap(b[i + k], b[j + k]);
            break;
        }
    }
    return b;
}

// A structured mutant: one word of the code, the tensor code, the layout or a tensor changed,
// then serialized, so that most mutants pass the parser and exercise the verifier and machine.
Module mutateModule(Module m, std::mt19937& rng) {
    auto change = [&](uint32_t& w) {
        switch (rng() % 4) {
            case 0:
                w ^= 1u << (rng() % 32);
                break;
            case 1:
                w = extremeWord(rng, 0);
                break;
            case 2:
                w = rng() % 16;
                break;
            default:
                w ^= uint32_t(uint8_t(rng())) << (8 * (rng() % 4));
                break;
        }
    };
    uint32_t target = rng() % 10;
    if (target < 6 || (target < 8 && m.tcode.empty()) || (target == 9 && m.tensors.empty())) {
        change(m.code[rng() % m.code.size()]);
    } else if (target < 8) {
        change(m.tcode[rng() % m.tcode.size()]);
    } else if (target == 8) {
        uint32_t* fields[] = {&m.layout.regs,        &m.layout.local_words,   &m.layout.heap_words,
                              &m.layout.heap_static, &m.layout.stack_depth,   &m.layout.mailbox_cap,
                              &m.layout.in_slots,    &m.layout.in_slot_words, &m.layout.max_rows,
                              &m.layout.max_steps,   &m.layout.entry};
        change(*fields[rng() % 11]);
    } else {
        TensorDecl& t = m.tensors[rng() % m.tensors.size()];
        uint32_t field = rng() % 5;
        uint32_t v = 0;
        if (field == 0) t.cls = rng() % 5;
        if (field == 1) t.dtype = DType(rng() % 32);
        if (field == 2) t.ndim = rng() % 6;
        if (field == 3) {
            change(v);
            t.ne[rng() % 4] = rng() % 4 ? v % 64 : v;
        }
        if (field == 4) t.source = DataSource(rng() % 4);
    }
    return m;
}

// Bytes of machine state a run needs (registers, memory, tensors), saturating at 2^62.
uint64_t machineBytes(const Module& m, uint32_t instances) {
    const Layout& l = m.layout;
    uint64_t total = uint64_t(l.heap_words) * 4 +
                     uint64_t(instances) *
                         (uint64_t(l.local_words) + l.regs + l.stack_depth + 2 * l.mailbox_cap +
                          BLUE_MAX_BLOCK_ARGS) *
                         4 +
                     uint64_t(l.in_slots) * l.in_slot_words * 4;
    for (const TensorDecl& t : m.tensors) {
        uint64_t slice = tensorSliceBytes(t);
        uint64_t count = t.cls == BLUE_TC_ROWS       ? l.max_rows
                         : t.cls == BLUE_TC_INSTANCE ? instances
                                                     : 1;
        if (slice > (uint64_t(1) << 40) || count > (uint64_t(1) << 20)) return uint64_t(1) << 62;
        total += slice * count;
    }
    return std::min(total, uint64_t(1) << 62);
}

// Messages of the base's input that a mutant can take; `max_messages` bounds how many.
std::vector<std::vector<uint32_t>> inputFor(const Module& m, const Base& base,
                                            size_t max_messages) {
    std::vector<std::vector<uint32_t>> out;
    if (m.layout.in_slots == 0) return out;
    for (const auto& msg : base.input) {
        if (out.size() == max_messages) break;
        if (msg.size() + 1 <= m.layout.in_slot_words) out.push_back(msg);
    }
    return out;
}

// Checks that a run ended cleanly: every instance halted or faulted with a known code, or the
// watchdog stopped the run and named the instances still live.
void checkCleanEnd(const RunReport& r, uint32_t instances, uint64_t max_cycles) {
    REQUIRE(r.instances.size() == instances);
    bool live = false;
    for (const InstanceReport& ir : r.instances) {
        CHECK(ir.status <= BLUE_ST_FAULT);
        live |= ir.status == BLUE_ST_RUNNING || ir.status == BLUE_ST_PARKED;
        if (ir.status == BLUE_ST_FAULT) {
            CHECK(ir.fault > BLUE_FAULT_NONE);
            CHECK(ir.fault < BLUE_FAULT_COUNT);
        }
    }
    CHECK(r.cycles <= max_cycles);
    CHECK(r.status.isOk() == !live);
    if (live) CHECK(r.status.message().rfind("watchdog: ", 0) == 0);
    for (const OutputRecord& rec : r.output) {
        CHECK(rec.inst < instances);
        CHECK(rec.kind >= BLUE_OUT_INT);
        CHECK(rec.kind <= BLUE_OUT_BEGIN);
    }
}

RunReport runReference(const Module& m, const WeightSource& w, uint32_t instances,
                       const std::vector<std::vector<uint32_t>>& input) {
    RefMachine ref(m, w, MachineOptions{instances, kMutantCycles});
    for (const auto& msg : input) ref.pushInput(msg);
    ref.closeInput();
    return ref.run();
}

struct GpuCandidate {
    std::string what;
    Module module;
    std::vector<std::vector<uint32_t>> input;
};

struct MutationCounts {
    uint64_t mutants = 0, parse_rejected = 0, verify_rejected = 0, weights_rejected = 0;
    uint64_t ran = 0, too_big = 0, halted = 0, faulted = 0, watchdog = 0;
};

// Parses, verifies and (when it verifies) runs one mutant on the reference machine.
void tryMutant(const Base& base, const std::vector<uint8_t>& bytes, const std::string& what,
               MutationCounts* n, std::vector<GpuCandidate>* gpu_candidates) {
    ++n->mutants;
    Result<Module> parsed = parseModule(bytes, "mutant.bir");
    if (!parsed) {
        CHECK(parsed.message().size() > std::string("mutant.bir: ").size());
        ++n->parse_rejected;
        return;
    }
    Module m = std::move(parsed.value());
    if (Status s = verifyModule(m); !s) {
        CHECK(!s.message().empty());
        ++n->verify_rejected;
        return;
    }
    Result<WeightSource> w = WeightSource::open(m, sourceDir() + "/programs");
    if (!w) {
        ++n->weights_rejected;
        return;
    }
    m.layout.max_steps = std::min(m.layout.max_steps, kMutantSteps);
    uint64_t bytes_needed = machineBytes(m, kRefInstances);
    if (bytes_needed > kRefBudget) {
        ++n->too_big;
        return;
    }
    INFO(what);
    RunReport r = runReference(m, w.value(), kRefInstances, inputFor(m, base, 64));
    checkCleanEnd(r, kRefInstances, kMutantCycles);
    ++n->ran;
    if (!r.status) ++n->watchdog;
    for (const InstanceReport& ir : r.instances) {
        n->halted += ir.status == BLUE_ST_HALTED;
        n->faulted += ir.status == BLUE_ST_FAULT;
    }
    if (bytes_needed <= kGpuBudget) {
        auto input = inputFor(m, base, m.layout.in_slots);
        gpu_candidates->push_back({what, std::move(m), std::move(input)});
    }
}

namespace {

// Output records equal but for NaNs: a float record that is NaN on both machines matches.
bool sameOutputUpToNaN(const std::vector<OutputRecord>& a, const std::vector<OutputRecord>& b) {
    auto nan = [](const OutputRecord& r) {
        return r.kind == BLUE_OUT_FLOAT && std::isnan(std::bit_cast<float>(r.value));
    };
    return std::equal(a.begin(), a.end(), b.begin(), b.end(), [&](const OutputRecord& x, const OutputRecord& y) {
        return x == y || (x.inst == y.inst && nan(x) && nan(y));
    });
}

}  // namespace

TEST_CASE("verify: mutants of real modules are rejected cleanly or run to a clean end") {
    std::vector<Base> bases = mutationBases();
    REQUIRE(bases.size() >= 6);
    MutationCounts n;
    std::vector<std::vector<GpuCandidate>> candidates(bases.size());
    for (size_t bi = 0; bi < bases.size(); ++bi) {
        const Base& base = bases[bi];
        CAPTURE(base.name);
        std::mt19937 rng(uint32_t(0xB1E0 + bi));
        const std::vector<uint8_t> original = serializeModule(base.module);
        for (uint32_t i = 0; i < kMutantsPerBase; ++i) {
            bool structured = i % 2 == 1;
            std::vector<uint8_t> bytes = structured
                                             ? serializeModule(mutateModule(base.module, rng))
                                             : mutateBytes(original, rng);
            tryMutant(base, bytes, base.name + strFormat(" mutant %u", i), &n, &candidates[bi]);
        }
    }
    MESSAGE(
        strFormat("%llu mutants: %llu rejected by the parser, %llu by the verifier, %llu by "
                  "the weight loader; %llu ran (%llu halted, %llu faulted instances, %llu "
                  "watchdog stops); %llu verified but need more than %llu MiB to run",
                  (unsigned long long)n.mutants, (unsigned long long)n.parse_rejected,
                  (unsigned long long)n.verify_rejected, (unsigned long long)n.weights_rejected,
                  (unsigned long long)n.ran, (unsigned long long)n.halted,
                  (unsigned long long)n.faulted, (unsigned long long)n.watchdog,
                  (unsigned long long)n.too_big, (unsigned long long)(kRefBudget >> 20)));
    CHECK(n.mutants == bases.size() * kMutantsPerBase);
    CHECK(n.parse_rejected > n.mutants / 10);
    CHECK(n.verify_rejected > n.mutants / 10);
    CHECK(n.ran > n.mutants / 10);
    CHECK(n.faulted > 0);
    CHECK(n.watchdog > 0);

    // The GPU subset: the same mutants on one instance must end as on the reference machine.
    if (std::getenv("BLUE_SKIP_GPU_MUTANTS")) return;
    std::vector<GpuCandidate*> picked;
    for (size_t k = 0; picked.size() < kGpuMutants; ++k) {
        bool any = false;
        for (auto& list : candidates) {
            size_t at = k * 3;  // spread over each base's mutants
            if (at < list.size() && picked.size() < kGpuMutants) picked.push_back(&list[at]);
            any |= at < list.size();
        }
        if (!any) break;
    }
    CHECK(picked.size() == kGpuMutants);
    uint32_t created = 0, rejected = 0;
    for (const GpuCandidate* c : picked) {
        INFO(c->what);
        Result<WeightSource> w = WeightSource::open(c->module, sourceDir() + "/programs");
        REQUIRE(w.isOk());
        GpuOptions opt;
        opt.instances = 1;
        opt.max_cycles = kMutantCycles;
        opt.chain_cycles = 16;
        auto machine =
            GpuMachine::create(*gpu().device, *gpu().pipelines, c->module, w.value(), opt);
        if (!machine) {
            CHECK(!machine.message().empty());
            ++rejected;
            continue;
        }
        ++created;
        for (const auto& msg : c->input) REQUIRE(machine.value()->pushInput(msg).isOk());
        machine.value()->closeInput();
        Result<RunReport> got = machine.value()->run();
        REQUIRE_MESSAGE(got.isOk(), got.message());
        checkCleanEnd(got.value(), 1, kMutantCycles);
        RunReport want = runReference(c->module, w.value(), 1, c->input);
        CHECK(got.value().cycles == want.cycles);
        CHECK(got.value().status.message() == want.status.message());
        CHECK(got.value().instances[0].status == want.instances[0].status);
        CHECK(got.value().instances[0].fault == want.instances[0].fault);
        CHECK(got.value().instances[0].pc == want.instances[0].pc);
        CHECK(machine.value()->stats().steps == want.steps);
        // Vulkan leaves a NaN's sign and payload to the device (an NVIDIA GPU gives its own NaN
        // for a NaN operand where the reference keeps the operand's bits): NaNs match any NaN.
        bool same_output = sameOutputUpToNaN(got.value().output, want.output);
        INFO((same_output ? std::string() : disassemble(c->module)));
        CHECK(same_output);
    }
    MESSAGE(strFormat("GPU: %u mutants ran, %u rejected at load", created, rejected));
    CHECK(created > kGpuMutants / 2);
    CHECK_NO_VALIDATION_ERRORS();
}

}  // namespace
}  // namespace blue::test

namespace blue::test {

// The Gemma ops' own rules: ATTNX's soft cap is 0 or positive, SOFTCAP's positive, GEGLU writes
// ROWS. The assembler takes all three; the disassembly assembles back to the same module; a
// negative cap patched into the module is refused by the verifier too.
// A module of `tensors` whose one block runs `instr`, assembled as "res".
static Result<Module> oneInstr(const std::string& tensors, const std::string& instr) {
    return assemble(".layout regs=4 max_rows=2\n" + tensors + ".block b args=2\n    " + instr + "\n.end\nhalt\n", "res");
}

TEST_CASE("verify: MATMULADD and MATMULGLU write into a destination that is not their input") {
    auto withInstr = [](const std::string& instr) {
        return oneInstr(R"(.tensor x rows f32 [8]
.tensor h rows f32 [8]
.tensor w weight f32 [8, 8] data f32 0 1 2 3 4 0 1 2 3 4 0 1 2 3 4 0 1 2 3 4 0 1 2 3 4 0 1 2 3 4 0 1 2 3 4 0 1 2 3 4 0 1 2 3 4 0 1 2 3 4 0 1 2 3 4 0 1 2 3 4 0 1 2 3
)",
                        instr);
    };
    for (const char* good : {"matmuladd x, w, h", "matmulglu x, w, h, 0", "matmulglu x, w, h, 1"}) {
        CAPTURE(good);
        Result<Module> m = withInstr(good);
        REQUIRE_MESSAGE(m.isOk(), m.message());
        CHECK(verifyModule(m.value()).isOk());
    }
    Result<Module> add = withInstr("matmuladd x, w, x");
    REQUIRE(!add.isOk());
    CHECK(add.message() == "res: block 0 'b': MATMULADD at TCODE word 0: operand 2 (tensor 'x'): x must not be the "
                           "destination it is added into");
    Result<Module> glu = withInstr("matmulglu x, w, x, 1");
    REQUIRE(!glu.isOk());
    CHECK(glu.message() == "res: block 0 'b': MATMULGLU at TCODE word 0: operand 2 (tensor 'x'): x must not be the "
                           "destination it gates");
    Result<Module> act = withInstr("matmulglu x, w, h, 2");
    REQUIRE(!act.isOk());
    CHECK(act.message() == "res: block 0 'b': MATMULGLU at TCODE word 0: activation 2: 0 (silu) or 1 (gelu)");
}

TEST_CASE("verify: ROPEQK rotates two distinct rows that its head size divides") {
    auto withInstr = [](const std::string& instr) {
        return oneInstr(".tensor q rows f32 [16]\n.tensor k rows f32 [8]\n.tensor k6 rows f32 [6]\n", instr);
    };
    Result<Module> good = withInstr("ropeqk q, k, none, 1, 4, 4, 2, 10000, 1.0");
    REQUIRE_MESSAGE(good.isOk(), good.message());
    CHECK(verifyModule(good.value()).isOk());
    Result<Module> same = withInstr("ropeqk q, q, none, 1, 4, 4, 2, 10000, 1.0");
    REQUIRE(!same.isOk());
    CHECK(same.message() == "res: block 0 'b': ROPEQK at TCODE word 0: operand 1 (tensor 'q'): k must not be q");
    Result<Module> odd = withInstr("ropeqk q, k6, none, 1, 4, 4, 2, 10000, 1.0");
    REQUIRE(!odd.isOk());
    CHECK(odd.message() == "res: block 0 'b': ROPEQK at TCODE word 0: head size 4 does not divide k's row");
}

TEST_CASE("verify: ATTNX, SOFTCAP and GEGLU operand rules") {
    const char* src = R"(.layout regs=4 max_rows=2
.tensor x rows f32 [8]
.tensor kc instance f16 [8, 16]
.tensor vc instance f16 [8, 16]
.tensor l instance f32 [8]
.block b args=2
    attnx x, kc, vc, x, 2, 2, 1, 0.5, 4, 50.0
    softcap l, l, 30.0
    geglu x, x, x
.end
halt
)";
    Result<Module> good = assemble(src, "gemma");
    REQUIRE_MESSAGE(good.isOk(), good.message());
    REQUIRE(verifyModule(good.value()).isOk());
    Result<Module> again = assemble(disassemble(good.value()), "gemma");
    REQUIRE_MESSAGE(again.isOk(), again.message());
    CHECK(again.value().tcode == good.value().tcode);
    Module patched = good.value();
    patched.tcode[10] = std::bit_cast<uint32_t>(-2.0f);  // ATTNX's cap: word 0 is the header
    Status st = verifyModule(patched);
    REQUIRE(!st.isOk());
    CHECK(st.message() == "block 0 'b': ATTNX at TCODE word 0: soft cap -2 must be 0 (none) or positive");
    struct Case {
        std::string from, to, message;
    };
    const Case cases[] = {
        {"0.5, 4, 50.0", "0.5, 4, -1.0", "ATTNX at TCODE word 0: soft cap -1 must be 0 (none) or positive"},
        {"l, l, 30.0", "l, l, 0.0", "SOFTCAP at TCODE word 11: soft cap 0 must be positive"},
        {"geglu x, x, x", "geglu l, x, x", "GEGLU at TCODE word 15: operand 0 (tensor 'l'): must be a ROWS tensor (one row per token)"},
    };
    for (const Case& c : cases) {
        std::string bad = src;
        bad.replace(bad.find(c.from), c.from.size(), c.to);
        // The assembler verifies what it assembles; the verifier alone says the same of the
        // module patched in place.
        Result<Module> m = assemble(bad, "gemma");
        REQUIRE(!m.isOk());
        CHECK(m.message() == "gemma: block 0 'b': " + c.message);
    }
}

// POOL: an INSTANCE F32 destination as long as the ROWS F32 rows it pools, a mode of 0..2 and a
// block argument that exists.
TEST_CASE("verify: POOL operand rules") {
    const char* src = R"(.layout regs=4 max_rows=2
.tensor x rows f32 [8]
.tensor p instance f32 [8]
.tensor q instance f32 [4]
.block b args=2
    pool p, x, 0, 1
.end
halt
)";
    Result<Module> good = assemble(src, "pool");
    REQUIRE_MESSAGE(good.isOk(), good.message());
    REQUIRE(verifyModule(good.value()).isOk());
    Result<Module> again = assemble(disassemble(good.value()), "pool");
    REQUIRE_MESSAGE(again.isOk(), again.message());
    CHECK(again.value().tcode == good.value().tcode);
    struct Case {
        std::string to, message;
    };
    const Case cases[] = {
        {"pool p, x, 3, 1", "POOL at TCODE word 0: pooling mode 3 is not 0 (mean), 1 (first) or 2 (last)"},
        {"pool p, x, 2, 40", "POOL at TCODE word 0: block argument 40 does not exist"},
        {"pool x, x, 0, 1", "POOL at TCODE word 0: operand 0 (tensor 'x'): the pooled vector must be an INSTANCE tensor"},
        {"pool q, x, 0, 1", "POOL at TCODE word 0: operand 1 (tensor 'x'): has 8 elements per item, expected 4"},
        {"pool p, p, 0, 1", "POOL at TCODE word 0: operand 1 (tensor 'p'): must be a ROWS tensor (one row per token)"},
    };
    for (const Case& c : cases) {
        std::string bad = src;
        bad.replace(bad.find("pool p, x, 0, 1"), 15, c.to);
        Result<Module> m = assemble(bad, "pool");
        REQUIRE(!m.isOk());
        CHECK(m.message() == "pool: block 0 'b': " + c.message);
    }
}

}  // namespace blue::test

namespace blue::test {

// The paged-KV ops' rules (vm/tensor_ops_kvpages.cpp): pools GLOBAL F32/F16 [D, PS, NP] with PS
// a power of two in [8, 32] and whole words per F16 row, K and V pools alike, a page table of
// at least one entry within an instance's local words, a copy store that is not the pool.
TEST_CASE("verify: KVSTOREP, ATTNP, PGCOPY and KVCOPYP operand rules") {
    const char* src = R"(.layout regs=4 max_rows=2 local=40
.tensor x rows f32 [8]
.tensor y rows f32 [7]
.tensor kp global f16 [8, 16, 8]
.tensor vp global f16 [8, 16, 8]
.tensor st global f16 [8, 20, 2]
.tensor ki instance f16 [8, 16, 8]
.tensor k12 global f16 [8, 12, 8]
.tensor k64 global f16 [8, 64, 8]
.tensor v8 global f16 [8, 16, 16]
.tensor vf global f32 [8, 16, 8]
.tensor ko global f16 [7, 16, 8]
.block b args=2
    kvstorep x, kp, x, vp, 1, 32, 8
    attnp x, kp, vp, x, 2, 2, 1, 0.5, 0, 0.0, 32, 8
    pgcopy kp, 0, 1, 1
    kvcopyp kp, st, 1, 0, 0, 1, 32, 8
.end
halt
)";
    Result<Module> good = assemble(src, "kvp");
    REQUIRE_MESSAGE(good.isOk(), good.message());
    REQUIRE(verifyModule(good.value()).isOk());
    Result<Module> again = assemble(disassemble(good.value()), "kvp");
    REQUIRE_MESSAGE(again.isOk(), again.message());
    CHECK(again.value().tcode == good.value().tcode);
    struct Case {
        std::string from, to, message;
    };
    const std::string store = "kvstorep x, kp, x, vp, 1, 32, 8", attn = "attnp x, kp, vp, x, 2, 2, 1, 0.5, 0, 0.0, 32, 8";
    const std::string copy = "kvcopyp kp, st, 1, 0, 0, 1, 32, 8";
    const Case cases[] = {
        {store, "kvstorep x, ki, x, vp, 1, 32, 8", "KVSTOREP at TCODE word 0: operand 1 (tensor 'ki'): a KV pool must be a GLOBAL tensor"},
        {store, "kvstorep y, ko, y, ko, 1, 32, 8", "KVSTOREP at TCODE word 0: operand 1 (tensor 'ko'): an F16 pool needs an even row length, not 7"},
        {store, "kvstorep x, kp, x, vp, 1, 33, 8", "KVSTOREP at TCODE word 0: the page table local[33 .. 41) passes the 40 local words of an instance"},
        {store, "kvstorep x, kp, x, vp, 1, 32, 0", "KVSTOREP at TCODE word 0: the page table has no entries (U_n is 0)"},
        {store, "kvstorep x, kp, x, vp, 1, 31, 9", "KVSTOREP at TCODE word 0: the page table has 9 entries, more than the pool's 8 pages"},
        {store, "kvstorep x, kp, x, vp, 9, 32, 8", "KVSTOREP at TCODE word 0: block argument 9 does not exist"},
        {attn, "attnp x, k12, k12, x, 2, 2, 1, 0.5, 0, 0.0, 32, 8", "ATTNP at TCODE word 8: operand 1 (tensor 'k12'): a page of 12 positions; pages hold 8, 16 or 32"},
        {attn, "attnp x, k64, k64, x, 2, 2, 1, 0.5, 0, 0.0, 32, 8", "ATTNP at TCODE word 8: operand 1 (tensor 'k64'): a page of 64 positions; pages hold 8, 16 or 32"},
        {attn, "attnp x, kp, v8, x, 2, 2, 1, 0.5, 0, 0.0, 32, 8", "ATTNP at TCODE word 8: operand 2 (tensor 'v8'): K and V pools differ in shape"},
        {attn, "attnp x, kp, vf, x, 2, 2, 1, 0.5, 0, 0.0, 32, 8", "ATTNP at TCODE word 8: operand 2 (tensor 'vf'): K and V pools differ in type"},
        {attn, "attnp x, kp, vp, x, 4, 2, 1, 0.5, 0, 0.0, 32, 8", "ATTNP at TCODE word 8: operand 1 (tensor 'kp'): a KV pool must be [4, PS, NP]"},
        {attn, "attnp x, kp, vp, x, 2, 2, 1, 0.5, 0, -1.0, 32, 8", "ATTNP at TCODE word 8: soft cap -1 must be 0 (none) or positive"},
        {attn, "attnp x, kp, vp, x, 2, 2, 1, 0.5, 0, 0.0, 40, 1", "ATTNP at TCODE word 8: the page table local[40 .. 41) passes the 40 local words of an instance"},
        {"pgcopy kp, 0, 1, 1", "pgcopy x, 0, 1, 1", "PGCOPY at TCODE word 21: operand 0 (tensor 'x'): a KV pool must be a GLOBAL tensor"},
        {"pgcopy kp, 0, 1, 1", "pgcopy kp, 0, 1, 8", "PGCOPY at TCODE word 21: block argument 8 does not exist"},
        {copy, "kvcopyp kp, kp, 1, 0, 0, 1, 32, 8", "KVCOPYP at TCODE word 26: operand 1 (tensor 'kp'): the store must not be the pool"},
        {copy, "kvcopyp kp, st, 2, 0, 0, 1, 32, 8", "KVCOPYP at TCODE word 26: copy direction 2 is not 0 (store to pool) or 1 (pool to store)"},
        {copy, "kvcopyp kp, vf, 1, 0, 0, 1, 32, 8", "KVCOPYP at TCODE word 26: operand 1 (tensor 'vf'): type F32, expected F16"},
        {copy, "kvcopyp kp, st, 1, 0, 0, 1, 39, 2", "KVCOPYP at TCODE word 26: the page table local[39 .. 41) passes the 40 local words of an instance"},
        {attn, "attnp x, kp, vp, x, 2, 2, 1, 0.5, 0, 0.0, 0, 16", "ATTNP at TCODE word 8: the page table has 16 entries, more than the pool's 8 pages"},
    };
    for (const Case& c : cases) {
        std::string bad = src;
        bad.replace(bad.find(c.from), c.from.size(), c.to);
        Result<Module> m = assemble(bad, "kvp");
        REQUIRE(!m.isOk());
        CHECK(m.message() == "kvp: block 0 'b': " + c.message);
    }
}

}  // namespace blue::test
