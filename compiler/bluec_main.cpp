// bluec: the Blue-IR compiler's command line.
//   bluec asm prog.blue -o prog.bir     assemble text to bytecode
//   bluec dis prog.bir                  print bytecode as text
//   bluec check prog.bir                parse and verify only
#include <cstdio>
#include <cstring>
#include <string>

#include "compiler/asm.h"
#include "vm/verify.h"

namespace {

constexpr const char* kUsage =
    "usage: bluec asm FILE.blue -o OUT.bir   assemble Blue-IR text\n"
    "       bluec dis FILE.bir [-o OUT.blue] disassemble\n"
    "       bluec check FILE.bir             parse and verify a module\n";

int fail(const std::string& msg) {
    std::fprintf(stderr, "bluec: %s\n", msg.c_str());
    return 1;
}

bool writeText(const std::string& path, const std::string& text) {
    FILE* f = path.empty() ? stdout : std::fopen(path.c_str(), "wb");
    if (!f) return false;
    bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (f != stdout) ok = std::fclose(f) == 0 && ok;
    return ok;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")) {
        std::fputs(kUsage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    std::string cmd = argv[1], input, output;
    for (int i = 2; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "-o" && i + 1 < argc) {
            output = argv[++i];
        } else if (!a.empty() && a[0] == '-') {
            return fail("unknown option '" + a + "'\n" + kUsage);
        } else if (input.empty()) {
            input = a;
        } else {
            return fail("unexpected argument '" + a + "'");
        }
    }
    if (input.empty()) return fail("missing input file\n" + std::string(kUsage));
    if (cmd == "asm") {
        if (output.empty()) return fail("asm needs -o OUT.bir");
        auto m = blue::assembleFile(input);
        if (!m) return fail(m.message());
        blue::Status s = blue::writeModuleFile(m.value(), output);
        return s ? 0 : fail(s.message());
    }
    if (cmd == "dis" || cmd == "check") {
        auto m = blue::loadModuleFile(input);
        if (!m) return fail(m.message());
        if (cmd == "check") return 0;
        if (!writeText(output, blue::disassemble(m.value()))) return fail("cannot write " + output);
        return 0;
    }
    return fail("unknown command '" + cmd + "'\n" + kUsage);
}
