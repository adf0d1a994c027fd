// The assembler and disassembler (compiler/asm.h): assemble -> disassemble -> assemble gives the
// same bytes for every golden program and for a program generated from the opcode table that
// uses every opcode; assembler errors name file:line:col and the problem.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <string>
#include <vector>

#include "compiler/asm.h"
#include "tests/vm_programs.h"
#include "vm/isa.h"

namespace blue::test {
namespace {

// Assembles, disassembles and reassembles; checks bytes and text are stable.
void checkRoundTrip(const Module& m, const std::string& what) {
    CAPTURE(what);
    std::vector<uint8_t> bytes = serializeModule(m);
    std::string text = disassemble(m);
    Result<Module> again = assemble(text, what + " (disassembled)");
    REQUIRE_MESSAGE(again.isOk(), (again.message() + "\n" + text));
    CHECK(serializeModule(again.value()) == bytes);
    CHECK(disassemble(again.value()) == text);
    // And through the file format: parse the bytes back and disassemble the same text.
    Result<Module> parsed = parseModule(bytes, what);
    REQUIRE_MESSAGE(parsed.isOk(), parsed.message());
    CHECK(disassemble(parsed.value()) == text);
}

TEST_CASE("asm: every golden program round-trips through the disassembler byte for byte") {
    std::vector<std::string> paths = goldenProgramPaths();
    REQUIRE(paths.size() >= 5);
    for (const std::string& path : paths) {
        Result<Module> m = assembleFile(path);
        REQUIRE_MESSAGE(m.isOk(), m.message());
        checkRoundTrip(m.value(), path);
    }
}

TEST_CASE("asm: the generated program uses every opcode of the table and round-trips") {
    Result<std::string> source = everyOpSource();
    REQUIRE_MESSAGE(source.isOk(), source.message());
    Result<Module> m = assemble(source.value(), "every_op");
    REQUIRE_MESSAGE(m.isOk(), (m.message() + "\n" + source.value()));
    std::vector<uint8_t> used = opcodesUsed(m.value());
    for (const OpInfo* op = opTableBegin(); op != opTableEnd(); ++op) {
        CAPTURE(op->name);
        // KERNEL needs a module's custom kernel (tests/test_kernel.cpp; see everyOpSource).
        CHECK(std::binary_search(used.begin(), used.end(), uint8_t(op->op)) == (op->op != Op::KERNEL));
    }
    CHECK(used.size() == size_t(opTableEnd() - opTableBegin()) - 1);
    checkRoundTrip(m.value(), "every_op");
}

TEST_CASE("asm: a module without symbols disassembles to numeric forms that reassemble") {
    Result<std::string> source = everyOpSource();
    REQUIRE(source.isOk());
    Result<Module> m = assemble(source.value(), "every_op");
    REQUIRE(m.isOk());
    Module bare = m.value();
    bare.syms.clear();
    std::string text = disassemble(bare);
    CHECK(text.find("@") != std::string::npos);  // labels by instruction index
    Result<Module> again = assemble(text, "bare");
    REQUIRE_MESSAGE(again.isOk(), (again.message() + "\n" + text));
    CHECK(again.value().code == bare.code);
    CHECK(again.value().consts == bare.consts);
    CHECK(again.value().tcode == bare.tcode);
    CHECK(again.value().data == bare.data);
    CHECK(again.value().layout.entry == bare.layout.entry);
}

TEST_CASE("asm: operands in every accepted spelling encode to the same words") {
    const char* src = R"(.layout regs=8
.const k 7 8 9
.string s "a\tb\x41\n"
main:
    li r1, 0x10
    li r1, 16
    li r1, -1
    li r1, 0xFFFFFFFF
    li r1, 'A'
    li r1, '\n'
    lf r1, 1.5
    lf r1, 0x3fc00000
    lf r1, -2e3
    ldk r1, r2, k+2
    ldk r1, r2, 2
    jmp @0
    jmp main
    LI R1, 3
    outs s
    halt
)";
    Result<Module> m = assemble(src, "spell");
    REQUIRE_MESSAGE(m.isOk(), m.message());
    const std::vector<uint32_t>& c = m.value().code;
    auto imm = [&](int i) { return c[size_t(i) * 2 + 1]; };
    CHECK(imm(0) == 16);
    CHECK(imm(1) == 16);
    CHECK(imm(2) == 0xFFFFFFFFu);
    CHECK(imm(3) == 0xFFFFFFFFu);
    CHECK(imm(4) == 65);
    CHECK(imm(5) == 10);
    CHECK(imm(6) == 0x3FC00000u);
    CHECK(imm(7) == 0x3FC00000u);
    CHECK(imm(8) == std::bit_cast<uint32_t>(-2000.0f));
    CHECK(imm(9) == 2);
    CHECK(imm(10) == 2);
    CHECK(imm(11) == 0);
    CHECK(imm(12) == 0);
    CHECK(c[13 * 2] == encodeWord0(uint8_t(Op::LI), 1, 0, 0));
    std::string str;
    REQUIRE(m.value().constString(imm(14), &str));
    CHECK(str == "a\tbA\n");
}

struct ErrorCase {
    const char* source;
    const char* where;    // "t.blue:LINE:COL: "
    const char* problem;  // a part of the message after it
};

TEST_CASE("asm: errors name file:line:col and the problem") {
    const ErrorCase cases[] = {
        {"halt\nfoo r1\n", "t.blue:2:1: ", "unknown instruction 'foo'"},
        {"nop\n  add r1, r2\n", "t.blue:2:3: ", "ADD takes 3 operands (rrr), found 2"},
        {"halt r1\n", "t.blue:1:1: ", "HALT takes 0 operands"},
        {"li r256, 1\n", "t.blue:1:4: ", "expected a register r0..r255, found 'r256'"},
        {"li r01, 1\n", "t.blue:1:4: ", "expected a register"},
        {"li x1, 1\n", "t.blue:1:4: ", "expected a register"},
        {"jmp nowhere\n", "t.blue:1:5: ", "unknown label 'nowhere'"},
        {"a: nop\n\na: halt\n", "t.blue:3:1: ", "label 'a' defined twice"},
        {".string s \"abc\nhalt\n", "t.blue:1:11: ", "unterminated quote"},
        {"li r1, 'ab'\n", "t.blue:1:8: ", "a character literal holds one character"},
        {".string s \"a\\qb\"\n", "t.blue:1:11: ", "unknown escape \\q"},
        {".string s \"a\\xZZ\"\n", "t.blue:1:11: ", "bad \\x escape"},
        {"li r1, $\n", "t.blue:1:8: ", "unexpected character '$'"},
        {".tensor x rows f32 [4]\ntadd x, x, x\n",
         "t.blue:2:1: ", "'tadd' is a tensor instruction; put it in a .block"},
        {".layout regs=4 bogus=3\n", "t.blue:1:16: ", "unknown layout field 'bogus'"},
        {".layout regs=x\n", "t.blue:1:9: ", "layout field needs a non-negative integer"},
        {".layout regs=-1\n", "t.blue:1:9: ", "layout field needs a non-negative integer"},
        {".layout regs\n", "t.blue:1:9: ", "unknown layout field"},
        {".bogus 1\n", "t.blue:1:1: ", "unknown directive '.bogus'"},
        {"halt\n.end\n", "t.blue:2:1: ", ".end without .block"},
        {".block b args=0\n", "t.blue:1:1: ", "block 'b' has no .end"},
        {".block b nargs=1\n.end\n", "t.blue:1:10: ", "expected args=N"},
        {".tensor x rows f32 [4]\n.block b\n  halt\n.end\n",
         "t.blue:3:3: ", "unknown tensor instruction 'halt'"},
        {".block b\nfoo:\n.end\n", "t.blue:2:1: ", "only tensor instructions may appear"},
        {".block b\n  tadd nope, nope, nope\n.end\n", "t.blue:2:8: ", "unknown tensor 'nope'"},
        {".tensor x rows f32 [4]\n.block b\n  tadd x, x\n.end\n",
         "t.blue:3:3: ", "TADD takes 3 operands"},
        {"li r1 2\n", "t.blue:1:7: ", "missing ',' between operands"},
        {"li r1,, 2\n", "t.blue:1:7: ", "missing operand before ','"},
        {"li r1, 2,\n", "t.blue:1:9: ", "trailing ','"},
        {"li r1, abc\n", "t.blue:1:8: ", "'abc' is not a number"},
        {"li r1, 0x1FFFFFFFF\n", "t.blue:1:8: ", "is not a number"},
        {"lf r1, abc\n", "t.blue:1:8: ", "expected a float, found 'abc'"},
        {"outs nostr\n", "t.blue:1:6: ", "unknown string 'nostr'"},
        {"run nob, r0\n", "t.blue:1:5: ", "unknown block 'nob'"},
        {"tld r1, r2, nope\n", "t.blue:1:13: ", "unknown tensor 'nope'"},
        {".entry nowhere\nhalt\n", "t.blue:1:8: ", "unknown label 'nowhere'"},
        {".tensor x rows f99 [4]\n", "t.blue:1:16: ", "unknown type 'f99'"},
        {".tensor x cache f32 [4]\n", "t.blue:1:11: ", "unknown tensor class 'cache'"},
        {".tensor x rows f32 [0]\n", "t.blue:1:21: ", "bad dimension '0'"},
        {".tensor x rows f32 [1, 2, 3, 4, 5]\n", "t.blue:1:33: ", "at most 4 dimensions"},
        {".tensor x weight f32 [4] data f32 1 2 3\n",
         "t.blue:1:26: ", "data has 12 bytes, the tensor needs 16"},
        {".tensor x weight f32 [1] data hex 0a0b0\n", "t.blue:1:35: ", "odd number of hex digits"},
        {".tensor x rows f32 [4]\n.tensor x rows f32 [4]\n",
         "t.blue:2:9: ", "tensor 'x' defined twice"},
        {".const k 1\n.const k 2\n", "t.blue:2:8: ", "constant 'k' defined twice"},
        {".string s \"a\"\n.string s \"b\"\n", "t.blue:2:9: ", "string 's' defined twice"},
        {".block b\n.end\n.block b\n.end\n", "t.blue:3:8: ", "block 'b' defined twice"},
        {".extern model.gguf\n", "t.blue:1:1: ", ".extern needs a quoted path"},
        {".layout regs=4\nli r5, 1\n",
         "t.blue:2:4: ", "register r5 is past the layout's 4 registers"},
        {"nop\njmp @2\n", "t.blue:2:5: ", "@2 is outside the code (2 instructions)"},
    };
    for (const ErrorCase& c : cases) {
        INFO("source: " << c.source);
        Result<Module> m = assemble(c.source, "t.blue");
        REQUIRE(!m.isOk());
        const std::string& msg = m.message();
        INFO("message: " << msg);
        CHECK(msg.rfind(c.where, 0) == 0);
        CHECK(msg.find(c.problem) != std::string::npos);
    }
}

// Errors the verifier finds after assembly still name the file and what is wrong.
TEST_CASE("asm: verifier errors after assembly name the file, the instruction and the problem") {
    const ErrorCase cases[] = {
        {".layout max_steps=0\nhalt\n", "t.blue: ", "max_steps = 0"},
        {".tensor w weight f32 [3, 2] data f32 1 2 3 4 5 6\n.tensor x rows f32 [4]\n"
         ".tensor y rows f32 [2]\n.layout max_rows=1\n.block b\n matmul y, w, x\n.end\nhalt\n",
         "t.blue: ", "operand 2 (tensor 'x'): has 4 elements per item, expected 3"},
    };
    for (const ErrorCase& c : cases) {
        INFO("source: " << c.source);
        Result<Module> m = assemble(c.source, "t.blue");
        REQUIRE(!m.isOk());
        INFO("message: " << m.message());
        CHECK(m.message().rfind(c.where, 0) == 0);
        CHECK(m.message().find(c.problem) != std::string::npos);
    }
}

}  // namespace
}  // namespace blue::test
