// blue-upcycle: a bigger model computing (nearly) the same function as a small one, for
// speculative-decoding tests and benchmarks (compiler/upcycle.h).
//   blue-upcycle IN.gguf OUT.gguf [--layers N] [--heads-x F] [--ffn W] [--noise S] [--seed S]
//                [--experts E [--experts-used K]]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "compiler/upcycle.h"

namespace {

constexpr const char* kUsage =
    "usage: blue-upcycle IN.gguf OUT.gguf [--layers N] [--heads-x F] [--ffn W] [--noise S] [--seed "
    "S]\n"
    "                    [--experts E [--experts-used K]]\n"
    "  --layers N   append N layers (default 0)\n"
    "  --heads-x F  F times the query heads (default 1)\n"
    "  --ffn W      FFN width W (default: unchanged)\n"
    "  --noise S    std of the new weights that write to the residual stream (default 0: same "
    "function)\n"
    "  --seed S     seed of the random weights (default 1)\n"
    "  --experts E  Mixtral-style MoE: E copies of the FFN per layer behind a random router "
    "(default 0: dense)\n"
    "  --experts-used K  experts per token (default 2)\n";

bool number(const char* s, double* out) {
    char* end = nullptr;
    *out = std::strtod(s, &end);
    return end && !*end && end != s;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fputs(kUsage, stderr);
        return 2;
    }
    blue::UpcycleOptions opt;
    for (int i = 3; i < argc; i += 2) {
        std::string a = argv[i];
        double v = 0;
        if (i + 1 >= argc || !number(argv[i + 1], &v) || v < 0) {
            std::fprintf(stderr, "blue-upcycle: %s needs a non-negative number\n%s", a.c_str(),
                         kUsage);
            return 1;
        }
        if (a == "--layers")
            opt.extra_layers = uint32_t(v);
        else if (a == "--heads-x")
            opt.head_factor = uint32_t(v);
        else if (a == "--ffn")
            opt.ffn = uint32_t(v);
        else if (a == "--noise")
            opt.noise = float(v);
        else if (a == "--seed")
            opt.seed = uint32_t(v);
        else if (a == "--experts")
            opt.experts = uint32_t(v);
        else if (a == "--experts-used")
            opt.experts_used = uint32_t(v);
        else {
            std::fprintf(stderr, "blue-upcycle: unknown option '%s'\n%s", a.c_str(), kUsage);
            return 1;
        }
    }
    auto r = blue::upcycleGguf(argv[1], argv[2], opt);
    if (!r) {
        std::fprintf(stderr, "blue-upcycle: %s\n", r.message().c_str());
        return 1;
    }
    std::string moe = r->experts ? " x " + std::to_string(r->experts) + " experts (top-" +
                                       std::to_string(r->experts_used) + ")"
                                 : "";
    std::printf(
        "%s: %u layers, %u query heads, FFN %u%s; %.2fx the matrix elements per token (%llu -> "
        "%llu)\n",
        argv[2], r->layers, r->heads, r->ffn, moe.c_str(),
        double(r->params_after) / double(r->params_before), (unsigned long long)r->params_before,
        (unsigned long long)r->params_after);
    return 0;
}
