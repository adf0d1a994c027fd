// Build-time generator: writes opcodes.glsl, the GLSL view of the opcode table (vm/opcodes.def),
// so the sequencer's switch uses the same codes as the C++ side.
#include <cstdio>

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: gen_opcodes_glsl OUT.glsl\n");
        return 2;
    }
    FILE* f = std::fopen(argv[1], "w");
    if (!f) return 1;
    std::fprintf(f, "// Generated from vm/opcodes.def by gen_opcodes_glsl. Do not edit.\n");
#define BLUE_OP(name, code, fmt, grid, doc) std::fprintf(f, "#define OP_%s %uu\n", #name, code);
#include "vm/opcodes.def"
#undef BLUE_OP
    return std::fclose(f) == 0 ? 0 : 1;
}
