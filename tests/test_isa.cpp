// The opcode table (vm/opcodes.def, vm/isa.h): codes and names unique, control and tensor ranges
// respected, operand formats well formed, lookups consistent, and the instruction encodings
// round-trip for random fields.
#include <doctest/doctest.h>

#include <cctype>
#include <random>
#include <set>
#include <string>

#include "vm/isa.h"

namespace blue::test {
namespace {

std::string upper(std::string_view s) {
    std::string r(s);
    for (char& c : r) c = char(std::toupper(static_cast<unsigned char>(c)));
    return r;
}

TEST_CASE("isa: codes and names are unique and lookups agree with the table") {
    std::set<uint32_t> codes;
    std::set<std::string> names;
    size_t count = 0;
    for (const OpInfo* op = opTableBegin(); op != opTableEnd(); ++op, ++count) {
        CAPTURE(op->name);
        CHECK(codes.insert(uint32_t(op->op)).second);
        CHECK(names.insert(upper(op->name)).second);
        CHECK(op->name == upper(op->name));
        CHECK(!op->doc.empty());
        CHECK(opInfo(uint32_t(op->op)) == op);
        CHECK(&opInfo(op->op) == op);
        CHECK(opByName(op->name) == op);
        std::string lower(op->name);
        for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
        CHECK(opByName(lower) == op);
    }
    CHECK(count >= 90);
    // Every byte that no entry claims has no info.
    for (uint32_t code = 0; code < 256; ++code) {
        CAPTURE(code);
        CHECK((opInfo(code) != nullptr) == (codes.count(code) == 1));
    }
    CHECK(opInfo(256u) == nullptr);
    CHECK(opInfo(0xFFFFFFFFu) == nullptr);
    CHECK(opByName("") == nullptr);
    CHECK(opByName("ADDX") == nullptr);
    CHECK(opByName("AD") == nullptr);
}

TEST_CASE("isa: control ops are below 0x80 with well-formed formats; tensor ops have a grid") {
    for (const OpInfo* op = opTableBegin(); op != opTableEnd(); ++op) {
        CAPTURE(op->name);
        CAPTURE(op->format);
        const uint32_t code = uint32_t(op->op);
        CHECK(op->tensor == (code >= 0x80));
        if (!op->tensor) {
            CHECK(op->grid == Grid::NONE);
            int regs = 0, imms = 0;
            for (char c : op->format) {
                CHECK(std::string("riuflbkst").find(c) != std::string::npos);
                if (c == 'r') {
                    ++regs;
                } else {
                    ++imms;
                }
            }
            CHECK(regs <= 3);
            CHECK(imms <= 1);
            FormatShape shape = formatShape(op->format);
            CHECK(shape.regs == regs);
            CHECK((shape.imm != 0) == (imms == 1));
            if (imms == 1) CHECK(op->format.find(shape.imm) != std::string_view::npos);
        } else {
            CHECK(op->grid != Grid::NONE);
            REQUIRE(!op->format.empty());
            CHECK(op->format[0] == 't');  // the destination (or the item source); never optional
            for (char c : op->format) CHECK(std::string("tuifo").find(c) != std::string::npos);
            // The host sizes a HEADS grid by the first uint operand, so there must be one.
            if (op->grid == Grid::HEADS) CHECK(op->format.find('u') != std::string_view::npos);
        }
    }
    // Optional tensors and head grids where the kernels expect them: ROPE's frequency factors
    // may be `none`; ATTN runs one workgroup per query head, its first uint operand.
    CHECK(opInfo(Op::ROPE).format == "ttouuuuff");
    CHECK(opInfo(Op::ATTN).grid == Grid::HEADS);
    CHECK(opInfo(Op::ATTN).format.find('u') == 4);
    // The flow ops whose semantics the machines special-case keep their formats.
    CHECK(opInfo(Op::RUN).format == "br");
    CHECK(opInfo(Op::CALL).format == "l");
    CHECK(opInfo(Op::RET).format == "");
    CHECK(opInfo(Op::HALT).format == "");
}

TEST_CASE("isa: formatShape counts registers and finds the immediate") {
    struct Case {
        const char* fmt;
        int regs;
        char imm;
    };
    const Case cases[] = {{"", 0, 0},    {"r", 1, 0},     {"rrr", 3, 0},  {"rri", 2, 'i'},
                          {"l", 0, 'l'}, {"rrl", 2, 'l'}, {"br", 1, 'b'}, {"rrk", 2, 'k'},
                          {"s", 0, 's'}, {"rrt", 2, 't'}, {"rf", 1, 'f'}, {"rru", 2, 'u'}};
    for (const Case& c : cases) {
        CAPTURE(c.fmt);
        FormatShape s = formatShape(c.fmt);
        CHECK(s.regs == c.regs);
        CHECK(s.imm == c.imm);
    }
}

TEST_CASE("isa: control and tensor encodings round-trip for random fields") {
    std::mt19937 rng(20240611);
    for (int i = 0; i < 20000; ++i) {
        uint32_t r = rng();
        uint8_t op = uint8_t(r), a = uint8_t(r >> 8), b = uint8_t(r >> 16), c = uint8_t(r >> 24);
        uint32_t imm = rng();
        uint32_t w0 = encodeWord0(op, a, b, c);
        // The diagram in opcodes.def: opcode in bits 0-7, A 8-15, B 16-23, C 24-31.
        CHECK(w0 == r);
        Instr in = decodeInstr(w0, imm);
        CHECK(in.op == op);
        CHECK(in.a == a);
        CHECK(in.b == b);
        CHECK(in.c == c);
        CHECK(in.imm == imm);
        CHECK(encodeWord0(in.op, in.a, in.b, in.c) == w0);

        uint32_t nops = rng() & 0xFFFFFF;
        uint32_t h = encodeTensorHeader(op, nops);
        CHECK(tensorHeaderOp(h) == op);
        CHECK(tensorHeaderOperands(h) == nops);
    }
    // Concrete words, worked out by hand from the diagram.
    CHECK(encodeWord0(0x13, 1, 2, 3) == 0x03020113u);
    CHECK(encodeTensorHeader(0x83, 3) == 0x383u);
}

}  // namespace
}  // namespace blue::test
