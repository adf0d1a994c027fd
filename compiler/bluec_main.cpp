// bluec: the Blue-IR compiler's command line.
//   bluec asm prog.blue -o prog.bir     assemble text to bytecode
//   bluec dis prog.bir                  print bytecode as text
//   bluec check prog.bir                parse and verify only
//   bluec lower --model M.gguf -o M.bir [--ctx N] [--max-rows N] [--chunk N] [--kv f16|f32]
//               [--grammar-words N] [--pooling mean|cls|last|none] [--sessions N]
//               [--kv-page 8|16|32] [--kv-pool N]
//                                       compile a GGUF model into a generation program
//   bluec cascade FILE.cas -o OUT.bir [--model NAME=PATH ...]
//                                       compile a cascade (compiler/cascade/cascade.h)
#include <cstdio>
#include <cstring>
#include <string>

#include <filesystem>

#include "compiler/asm.h"
#include "compiler/cascade/cascade.h"
#include "compiler/gguf.h"
#include "compiler/lower_model.h"
#include "compiler/model_config.h"
#include "vm/verify.h"

namespace {

constexpr const char* kUsage =
    "usage: bluec asm FILE.blue -o OUT.bir   assemble Blue-IR text\n"
    "       bluec dis FILE.bir [-o OUT.blue] disassemble\n"
    "       bluec check FILE.bir             parse and verify a module\n"
    "       bluec lower --model M.gguf -o OUT.bir [--ctx N] [--max-rows N] [--chunk N]\n"
    "                   [--kv f16|f32] [--grammar-words N (structured output: automaton words per\n"
    "                   instance, default 58368; 0: none)] [--pooling mean|cls|last|none (embeddings;\n"
    "                   default: the file's pooling type)] [--sessions N (conversation slots kept on the GPU)]\n"
    "                   [--kv-page 8|16|32 (paged KV: positions per page; default 0, per-instance caches)]\n"
    "                   [--kv-pool N (paged KV: positions in each layer's pool, shared by all instances;\n"
    "                   default 8 x ctx)]\n"
    "                                        compile a GGUF model into a generation program\n"
    "       bluec cascade FILE.cas -o OUT.bir [--model NAME=PATH ...] [--max-rows N] [--chunk N]\n"
    "                   [--kv f16|f32] [--forks N (fork stages in flight at once, default 16)]\n"
    "                                        compile a cascade of models\n";

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

bool parseU32(const std::string& s, uint32_t* out) {
    char* end = nullptr;
    unsigned long v = std::strtoul(s.c_str(), &end, 10);
    if (s.empty() || *end || v > 0xFFFFFFFFul) return false;
    *out = uint32_t(v);
    return true;
}

// Records the model path relative to the output's folder, so the pair can move together.
std::string modelPathForModule(const std::string& model, const std::string& out) {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::path m = fs::absolute(model, ec);
    fs::path dir = fs::absolute(out, ec).parent_path();
    fs::path rel = fs::relative(m, dir, ec);
    return ec || rel.empty() ? m.string() : rel.string();
}

int lower(int argc, char** argv) {
    std::string model, output;
    blue::LowerOptions opt;
    for (int i = 2; i < argc; ++i) {
        std::string a = argv[i];
        std::string v = i + 1 < argc ? argv[i + 1] : "";
        bool ok = true;
        if (a == "--model") model = v;
        else if (a == "-o") output = v;
        else if (a == "--ctx") ok = parseU32(v, &opt.ctx);
        else if (a == "--max-rows") ok = parseU32(v, &opt.max_rows);
        else if (a == "--chunk") ok = parseU32(v, &opt.chunk);
        else if (a == "--grammar-words") ok = parseU32(v, &opt.grammar_words);
        else if (a == "--pooling" && blue::parsePooling(v)) opt.pooling = blue::parsePooling(v);
        else if (a == "--sessions") ok = parseU32(v, &opt.sessions);
        else if (a == "--kv-page") ok = parseU32(v, &opt.kv_page);
        else if (a == "--kv-pool") ok = parseU32(v, &opt.kv_pool);
        else if (a == "--kv" && (v == "f16" || v == "f32")) opt.kv_type = v == "f16" ? blue::DType::F16 : blue::DType::F32;
        else return fail("lower: unknown or incomplete option '" + a + "'\n" + kUsage);
        if (!ok) return fail("lower: " + a + " needs a number, got '" + v + "'");
        ++i;
    }
    if (model.empty() || output.empty()) return fail(std::string("lower needs --model and -o\n") + kUsage);
    auto g = blue::ggufOpen(model);
    if (!g) return fail(g.message());
    auto cfg = blue::modelConfigFromGguf(g.value());
    if (!cfg) return fail(cfg.message());
    opt.model_path = modelPathForModule(model, output);
    auto m = blue::lowerModel(g.value(), cfg.value(), opt);
    if (!m) return fail(m.message());
    if (const std::string* page = m.value().metaValue(blue::kMetaKvPage)) {
        const std::string* pages = m.value().metaValue(blue::kMetaKvPages);
        std::printf("bluec: paged KV: %s pages of %s positions in each layer's pool%s\n", pages ? pages->c_str() : "?",
                    page->c_str(), opt.kv_pool ? "" : " (default: 8 x the context)");
    }
    blue::Status s = blue::writeModuleFile(m.value(), output);
    return s ? 0 : fail(s.message());
}

int cascade(int argc, char** argv) {
    std::string source, output;
    blue::CascadeOptions opt;
    for (int i = 2; i < argc; ++i) {
        std::string a = argv[i];
        std::string v = i + 1 < argc ? argv[i + 1] : "";
        bool ok = true;
        if (a == "-o" && i + 1 < argc) {
            output = v;
        } else if (a == "--model" && i + 1 < argc) {
            if (blue::Status s = blue::parseModelOverride(v, &opt.models); !s) return fail("cascade: " + s.message());
        } else if (a == "--max-rows" && i + 1 < argc) {
            ok = parseU32(v, &opt.max_rows) && opt.max_rows > 0;
        } else if (a == "--chunk" && i + 1 < argc) {
            ok = parseU32(v, &opt.chunk) && opt.chunk > 0;
        } else if (a == "--forks" && i + 1 < argc) {
            ok = parseU32(v, &opt.fork_records) && opt.fork_records > 0 && opt.fork_records <= 4096;
        } else if (a == "--kv" && (v == "f16" || v == "f32")) {
            opt.kv_type = v == "f16" ? blue::DType::F16 : blue::DType::F32;
        } else if (!a.empty() && a[0] == '-') {
            return fail("cascade: unknown or incomplete option '" + a + "'\n" + kUsage);
        } else if (source.empty()) {
            source = a;
            continue;
        } else {
            return fail("cascade: unexpected argument '" + a + "'");
        }
        if (!ok) return fail("cascade: " + a + " needs a positive number, got '" + v + "'");
        ++i;
    }
    if (source.empty() || output.empty()) return fail(std::string("cascade needs FILE.cas and -o OUT.bir\n") + kUsage);
    opt.chunk = std::min(opt.chunk, opt.max_rows);
    opt.module_dir = std::filesystem::absolute(output).parent_path().string();
    auto m = blue::compileCascadeFile(source, opt);
    if (!m) return fail(m.message());
    blue::Status s = blue::writeModuleFile(m.value(), output);
    return s ? 0 : fail(s.message());
}

int main(int argc, char** argv) {
    if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")) {
        std::fputs(kUsage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    std::string cmd = argv[1], input, output;
    if (cmd == "lower") return lower(argc, argv);
    if (cmd == "cascade") return cascade(argc, argv);
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
