// blue-quant-eval: how close a quantized model stays to its F32 original. Both models read the
// same token sequence (teacher forcing: BOS followed by the F32 model's own greedy output), one
// position per step on the reference machine, and the logits at every position are compared:
// top-1 agreement, and the logit error relative to the spread of the F32 logits.
//
//   blue-quant-eval REFERENCE.gguf QUANTIZED.gguf [-n TOKENS]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "compiler/gguf.h"
#include "compiler/lower_model.h"
#include "compiler/model_config.h"
#include "vm/abi.h"
#include "vm/interp.h"
#include "vm/llm_request.h"

namespace {

struct Run {
    std::vector<std::vector<float>> logits;  // per position
    std::vector<uint32_t> tokens;            // generated
};

blue::Result<Run> run(const std::string& path, const std::vector<uint32_t>& prompt, uint32_t max_new) {
    auto g = blue::ggufOpen(path);
    if (!g) return g.status();
    auto cfg = blue::modelConfigFromGguf(g.value());
    if (!cfg) return cfg.status();
    blue::LowerOptions lo;
    lo.ctx = uint32_t(prompt.size() + max_new + 2);
    lo.chunk = 1;  // one position per step, so every position's logits are seen
    lo.model_path = path;
    auto m = blue::lowerModel(g.value(), cfg.value(), lo);
    if (!m) return m.status();
    auto w = blue::WeightSource::open(m.value(), "");
    if (!w) return w.status();
    uint32_t logits_id = 0;
    for (uint32_t i = 0; i < m->tensors.size(); ++i) {
        if (m->tensors[i].name == "logits") logits_id = i;
    }
    blue::RefMachine machine(m.value(), w.value(), blue::MachineOptions{1, 1000000});
    Run out;
    machine.setAfterCycle([&](uint64_t) {
        const auto& data = machine.tensors().data[logits_id];
        const float* f = reinterpret_cast<const float*>(data.data());
        out.logits.emplace_back(f, f + data.size() / 4);
    });
    blue::GenerationRequest req;
    req.prompt = prompt;
    req.max_new = max_new;
    req.sampling.temperature = 0;
    req.ignore_eog = true;
    machine.pushInput(blue::encodeRequest(req));
    machine.closeInput();
    blue::RunReport r = machine.run();
    if (!r.status) return r.status;
    for (const blue::OutputRecord& rec : r.output) {
        if (rec.kind == BLUE_OUT_TOKEN) out.tokens.push_back(rec.value);
    }
    return out;
}

size_t argmax(const std::vector<float>& v) {
    size_t best = 0;
    for (size_t i = 1; i < v.size(); ++i) {
        if (v[i] > v[best]) best = i;
    }
    return best;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: blue-quant-eval REFERENCE.gguf QUANTIZED.gguf [-n TOKENS]\n");
        return 2;
    }
    uint32_t n = 256;
    if (argc >= 5 && std::strcmp(argv[3], "-n") == 0) n = uint32_t(std::atoi(argv[4]));
    auto g = blue::ggufOpen(argv[1]);
    if (!g) return std::fprintf(stderr, "blue-quant-eval: %s\n", g.message().c_str()), 1;
    uint32_t bos = g->getU32Or("tokenizer.ggml.bos_token_id", 1).value();
    auto ref = run(argv[1], {bos}, n);
    if (!ref) return std::fprintf(stderr, "blue-quant-eval: %s\n", ref.message().c_str()), 1;
    std::vector<uint32_t> seq = {bos};
    seq.insert(seq.end(), ref->tokens.begin(), ref->tokens.end() - 1);
    auto a = run(argv[1], seq, 1);
    auto b = run(argv[2], seq, 1);
    if (!a || !b) return std::fprintf(stderr, "blue-quant-eval: %s\n", (!a ? a : b).message().c_str()), 1;
    size_t positions = std::min(a->logits.size(), b->logits.size()), agree = 0;
    double sq = 0, spread = 0, max_err = 0, count = 0;
    for (size_t p = 0; p < positions; ++p) {
        const auto& x = a->logits[p];
        const auto& y = b->logits[p];
        agree += argmax(x) == argmax(y);
        double mean = 0;
        for (float v : x) mean += v;
        mean /= double(x.size());
        for (size_t i = 0; i < x.size(); ++i) {
            double e = double(y[i]) - x[i];
            sq += e * e;
            spread += (x[i] - mean) * (x[i] - mean);
            max_err = std::max(max_err, std::fabs(e));
            count += 1;
        }
    }
    std::printf("positions %zu  top-1 agreement %.1f%%  logit RMS error %.4f (%.2f%% of the F32 logits' "
                "std %.3f)  max |error| %.3f\n",
                positions, 100.0 * double(agree) / double(positions), std::sqrt(sq / count),
                100.0 * std::sqrt(sq / spread), std::sqrt(spread / count), max_err);
    return 0;
}
