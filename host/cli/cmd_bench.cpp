// `bluevm bench --model M.gguf`: prompt-processing and generation speed, and aggregate generation
// speed with many instances sharing the weights, each read against the ceilings measured in the
// same run: the device's own (host/peak.h: streaming read bandwidth, FP32 FMA) and native code's
// on this host (host/bench.h), with the ceiling that binds named.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <random>
#include <sstream>

#include "host/bench.h"
#include "host/peak.h"
#include "host/cli/commands.h"
#include "host/cli/progress.h"
#include "host/llm/engine.h"

namespace blue::cli {

namespace {

struct BenchArgs {
    std::string model, device, instances = "1";
    uint32_t prompt = 128, gen = 128, reps = 3, ctx = 0, chain_cycles = 64;
    uint32_t kv_page = 0, kv_pool = 0;  // paged KV (EngineOptions::kv_page, kv_pool)
    float temp = 0;  // 0: greedy; else sampled with the default top-k, top-p and min-p
    uint64_t vram_budget = 0;
    bool expert_cache = true;
    GpuOptions::HostWeights host_weights = GpuOptions::HostWeights::AUTO;
    bool json = false, no_bandwidth = false;
};

std::vector<uint32_t> randomPrompt(const Tokenizer& tok, uint32_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint32_t> out;
    if (tok.bos() != kNoToken) out.push_back(uint32_t(tok.bos()));
    while (out.size() < n) {
        int32_t id = int32_t(rng() % uint32_t(tok.vocabSize()));
        if (!tok.isControl(id) && !tok.isEog(id)) out.push_back(uint32_t(id));
    }
    return out;
}

struct Measure {
    double tok_per_s = 0;
    double ms = 0;
    uint64_t submits = 0, tokens = 0;
    double expert_bytes_per_row = 0;  // MoE: expert bytes the GPU read per forward row
    // MoE with an expert cache (GPU-counted): experts found cached of those the rows asked for
    // (read-in-place ones count as not found), and bytes copied into the cache per row.
    double expert_hit_rate = 0, expert_paged_per_row = 0;
};

// Runs `n_req` requests (prompt `p` tokens, `g` generated) `reps` times; best speed wins.
Result<Measure> measure(Engine& e, uint32_t n_req, uint32_t p, uint32_t g, uint32_t reps, bool count_prompt,
                        float temp) {
    Measure best;
    for (uint32_t r = 0; r < reps; ++r) {
        std::vector<GenerationRequest> reqs(n_req);
        for (uint32_t i = 0; i < n_req; ++i) {
            reqs[i].prompt = randomPrompt(e.tokenizer(), p, 17 * i + r);
            reqs[i].max_new = g;
            reqs[i].ignore_eog = true;
            reqs[i].prefix_reuse = false;  // measure every prompt token (random prompts share BOS)
            reqs[i].sampling.temperature = temp;
            reqs[i].sampling.seed = 1234 + i;
        }
        auto res = e.run(reqs);
        if (!res) return res.status();
        const GpuStats& s = e.stats();
        uint64_t tokens = count_prompt ? uint64_t(p) * n_req : 0;
        for (const Completion& c : res.value()) tokens += count_prompt ? 0 : c.tokens.size();
        double tps = s.wall_ms > 0 ? 1000.0 * double(tokens) / s.wall_ms : 0;
        // Rows run: every prompt token and every generated token (each is fed back).
        uint64_t rows = uint64_t(p) * n_req;
        for (const Completion& c : res.value()) rows += c.tokens.size();
        const double per_row = rows ? double(s.expert_bytes) / double(rows) : 0;
        const uint64_t asked = s.expert_hits + s.expert_misses + s.expert_inplace;
        if (tps > best.tok_per_s) {
            best = {tps, s.wall_ms, s.submits, tokens, per_row, asked ? double(s.expert_hits) / double(asked) : 0,
                    rows ? double(s.expert_paged_bytes) / double(rows) : 0};
        }
    }
    return best;
}

}  // namespace

Command addBenchCommand(CLI::App& app) {
    auto a = std::make_shared<BenchArgs>();
    CLI::App* sub = app.add_subcommand("bench", "Measure prompt and generation speed of a model");
    sub->add_option("--model,-m", a->model, "GGUF model")->required();
    sub->add_option("-p,--prompt-tokens", a->prompt, "prompt tokens (pp test)")->check(CLI::Range(2u, 8192u));
    sub->add_option("-n,--gen-tokens", a->gen, "generated tokens (tg test)")->check(CLI::Range(1u, 8192u));
    sub->add_option("--reps", a->reps, "repetitions (best is reported)")->check(CLI::Range(1u, 100u));
    sub->add_option("--temp", a->temp,
                    "sample at this temperature with the default top-k 40, top-p 0.95, min-p 0.05 "
                    "(default 0: greedy, the cheapest draw)")
        ->check(CLI::Range(0.0f, 100.0f));
    sub->add_option("--instances", a->instances, "comma-separated instance counts for the batched test, e.g. 1,4,16,64: aggregate generation "
                    "speed after the prompts (as llama-batched-bench's S_TG), and with them");
    sub->add_option("--ctx", a->ctx, "context per instance (default: prompt + generated + 8)");
    addKvPageOptions(sub, &a->kv_page, &a->kv_pool, "the largest --instances count x ctx");
    sub->add_option("--device", a->device, "Vulkan device: index or part of its name");
    addDeviceLimitsOption(sub);
    addVramBudgetOption(sub, &a->vram_budget, &a->host_weights, &a->expert_cache);
    sub->add_option("--chain-cycles", a->chain_cycles, "cycles per recorded chain")->check(CLI::Range(2u, 4096u));
    sub->add_flag("--json", a->json, "print one JSON object instead of the table");
    sub->add_flag("--no-ceilings,--no-bandwidth", a->no_bandwidth,
                  "skip measuring the device's and this host's ceilings (read bandwidth, FP32 FMA)");
    return [a] {
        std::vector<uint32_t> counts;
        std::stringstream ss(a->instances);
        for (std::string item; std::getline(ss, item, ',');) {
            char* end = nullptr;
            unsigned long v = std::strtoul(item.c_str(), &end, 10);
            if (item.empty() || *end || v == 0 || v > 4096) return fail("--instances: bad count '" + item + "'");
            counts.push_back(uint32_t(v));
        }
        EngineOptions eo;
        eo.device = a->device;
        eo.ctx = a->ctx ? a->ctx : std::max(a->prompt, 1u) + a->gen + 8;
        eo.chain_cycles = a->chain_cycles;
        eo.vram_budget = a->vram_budget;
        eo.expert_cache = a->expert_cache;
        eo.host_weights = a->host_weights;
        eo.kv_page = a->kv_page;
        eo.kv_pool = a->kv_pool;
        eo.kv_pool_contexts = *std::max_element(counts.begin(), counts.end());
        ProgressBar bar("loading weights");
        eo.on_load = loadProgress(bar);
        auto engine = Engine::open(a->model, eo);
        if (!engine) return fail(engine.message());
        Engine& e = *engine.value();
        nlohmann::json j;
        j["model"] = a->model;
        j["device"] = e.device().info().name;
        j["lavapipe_threads"] = std::getenv("LP_NUM_THREADS") ? std::getenv("LP_NUM_THREADS") : "default";
        if (auto shapes = describeKernelShapes(GpuOptions{}, e.device().info())) j["kernel_shapes"] = shapes.value();
        j["temperature"] = a->temp;
        if (e.kvPages()) {
            j["kv_page"] = e.kvPage();
            j["kv_pages"] = e.kvPages();
        }
        auto pp = measure(e, 1, a->prompt, 1, a->reps, true, a->temp);
        if (!pp) return fail(pp.message());
        auto tg = measure(e, 1, 1, a->gen, a->reps, false, a->temp);
        if (!tg) return fail(tg.message());
        uint64_t wbytes = e.matmulWeightBytes();
        // FLOPs per token: two per matrix element (a multiply and an add). Prompt processing is
        // a GEMM over the prompt's rows: the matmul peak batched generation is read against.
        const double flops_per_token = 2.0 * double(e.matmulWeightElements());
        const double peak_gflops = flops_per_token * pp->tok_per_s / 1e9;
        j["flops_per_token"] = flops_per_token;
        j["pp_gflops"] = peak_gflops;
        j["tg_gflops"] = flops_per_token * tg->tok_per_s / 1e9;
        j["pp"] = {{"tokens", a->prompt}, {"tok_per_s", pp->tok_per_s}};
        j["tg"] = {{"tokens", a->gen}, {"tok_per_s", tg->tok_per_s}, {"submits", tg->submits}};
        j["weight_bytes_per_token"] = wbytes;
        double used = double(wbytes) * tg->tok_per_s / 1e9;
        j["weight_read_gb_per_s"] = used;
        const uint64_t all_experts = e.expertWeightBytes();
        if (a->vram_budget > 0) {
            const GpuStats& s = e.stats();
            j["memory"] = {{"vram_budget", a->vram_budget}, {"vram_bytes", s.vram_bytes},
                           {"host_weight_bytes", s.host_weight_bytes}, {"streaming", s.streaming},
                           {"stream_bytes_per_cycle", s.stream_bytes_per_cycle}};
            if (s.expert_cache_slots > 0) {
                j["memory"]["expert_cache"] = {{"slots_per_layer", s.expert_cache_slots}, {"bytes", s.expert_cache_bytes},
                                               {"tg_hit_rate", tg->expert_hit_rate},
                                               {"tg_paged_bytes_per_token", tg->expert_paged_per_row},
                                               {"pp_hit_rate", pp->expert_hit_rate},
                                               {"pp_paged_bytes_per_token", pp->expert_paged_per_row}};
            }
        }
        if (all_experts > 0) {
            // Measured by the GPU (MOEROUTE counts what the chosen experts' matmuls read).
            j["experts"] = {{"all_bytes", all_experts}, {"tg_bytes_per_token", tg->expert_bytes_per_row},
                            {"pp_bytes_per_token", pp->expert_bytes_per_row}};
        }
        double dev_read = 0, dev_fma = 0, nat_read = 0, nat_fma = 0;
        if (!a->no_bandwidth) {
            auto peak = measureDevicePeak(e.device());
            if (!peak) return fail("measuring the device's ceilings: " + peak.message());
            BandwidthResult bw = measureReadBandwidth();
            FmaResult fma = measureNativeFma();
            dev_read = peak->readGBs();
            dev_fma = peak->fmaGFlops();
            nat_read = bw.gb_per_s;
            nat_fma = fma.gflops;
            j["ceilings"] = {{"device_read_gb_per_s", dev_read},
                             {"device_read_shape", peak->bestRead() ? peak->bestRead()->what : ""},
                             {"device_fma_gflops", dev_fma},
                             {"device_fma_shape", peak->bestFma() ? peak->bestFma()->what : ""},
                             {"native_read_gb_per_s", nat_read},
                             {"native_fma_gflops", nat_fma},
                             {"native_threads", fma.threads},
                             {"native_isa", fma.isa}};
            // Kept for scripts that read it: the native read bandwidth.
            j["machine_read_gb_per_s"] = bw.gb_per_s;
            j["machine_read_threads"] = bw.threads;
            j["fraction_of_bandwidth"] = used / bw.gb_per_s;
            auto of = [](double v, double ceiling) { return ceiling > 0 ? v / ceiling : 0.0; };
            j["pp"]["of_device_fma"] = of(peak_gflops, dev_fma);
            j["pp"]["of_native_fma"] = of(peak_gflops, nat_fma);
            j["tg"]["of_device_read"] = of(used, dev_read);
            j["tg"]["of_native_read"] = of(used, nat_read);
            j["tg"]["of_device_fma"] = of(j["tg_gflops"].get<double>(), dev_fma);
            j["tg"]["of_native_fma"] = of(j["tg_gflops"].get<double>(), nat_fma);
            // The ceiling generation is nearer to is the one that binds it, if any does.
            j["tg"]["nearer_ceiling"] = of(used, dev_read) >= of(j["tg_gflops"].get<double>(), dev_fma) ? "read" : "fma";
        }
        // Each count runs twice: prompts and `gen` tokens, then the same prompts and one token.
        // The difference is the time of the other gen - 1 generation cycles, so the generation
        // speed reads as llama-batched-bench's S_TG does (the figure PEERS.md gives); the first
        // run's own speed, prompts included, stays as `with_prompt_tok_per_s`.
        double base = 0, base_with_prompt = 0;
        const uint32_t batch_prompt = std::min(a->prompt, 32u);
        for (uint32_t n : counts) {
            e.setInstances(n);
            auto m = measure(e, n, batch_prompt, a->gen, 1, false, a->temp);
            if (!m) return fail(m.message());
            double gen_tps = 0;
            if (a->gen >= 2) {
                auto first = measure(e, n, batch_prompt, 1, 1, false, a->temp);
                if (!first) return fail(first.message());
                const double ms = m->ms - first->ms;
                if (ms > 0 && m->tokens > first->tokens) gen_tps = 1000.0 * double(m->tokens - first->tokens) / ms;
            }
            if (n == counts.front()) {
                base = gen_tps;
                base_with_prompt = m->tok_per_s;
            }
            const double gflops = flops_per_token * gen_tps / 1e9;
            j["batched"].push_back({{"instances", n}, {"tok_per_s", gen_tps},
                                    {"with_prompt_tok_per_s", m->tok_per_s},
                                    {"gflops", gflops},
                                    {"fraction_of_pp_gflops", peak_gflops > 0 ? gflops / peak_gflops : 0},
                                    {"of_device_fma", dev_fma > 0 ? gflops / dev_fma : 0},
                                    {"of_native_fma", nat_fma > 0 ? gflops / nat_fma : 0},
                                    {"ratio_to_first", base > 0 ? gen_tps / base : 0},
                                    {"with_prompt_ratio_to_first", base_with_prompt > 0 ? m->tok_per_s / base_with_prompt : 0},
                                    {"expert_bytes_per_token", m->expert_bytes_per_row},
                                    {"expert_hit_rate", m->expert_hit_rate},
                                    {"expert_paged_bytes_per_token", m->expert_paged_per_row},
                                    {"submits_per_1000_tokens", m->tokens ? 1000.0 * double(m->submits) / double(m->tokens) : 0}});
        }
        if (a->json) {
            std::printf("%s\n", j.dump().c_str());
            return 0;
        }
        std::printf("model   %s\ndevice  %s", a->model.c_str(), e.device().info().name.c_str());
        if (e.device().info().cpu) std::printf(" (LP_NUM_THREADS=%s)", j["lavapipe_threads"].get<std::string>().c_str());
        std::printf("\n");
        if (j.contains("kernel_shapes")) std::printf("kernels %s\n", j["kernel_shapes"].get<std::string>().c_str());
        if (a->temp > 0) std::printf("sampling: temperature %g, top-k 40, top-p 0.95, min-p 0.05\n", double(a->temp));
        const bool ceilings = j.contains("ceilings");
        if (ceilings) {
            const auto& c = j["ceilings"];
            std::printf("ceilings: device read %.1f GB/s, FMA %.1f GFLOP/s (bluevm devices --peak); native (%u threads, "
                        "%s) read %.1f GB/s, FMA %.1f GFLOP/s\n",
                        dev_read, dev_fma, c["native_threads"].get<unsigned>(), c["native_isa"].get<std::string>().c_str(),
                        nat_read, nat_fma);
        }
        auto fractions = [&](double v, double dev, double nat) {
            return ceilings ? strFormat(" = %.1f%% of the device's, %.1f%% of native", 100.0 * v / dev, 100.0 * v / nat)
                            : std::string();
        };
        std::printf("pp%-5u %10.1f tok/s   %8.2f GFLOP/s%s\n", a->prompt, pp->tok_per_s, peak_gflops,
                    fractions(peak_gflops, dev_fma, nat_fma).c_str());
        std::printf("tg%-5u %10.1f tok/s   %8.2f GFLOP/s%s (%llu submits)\n", a->gen, tg->tok_per_s,
                    j["tg_gflops"].get<double>(), fractions(j["tg_gflops"].get<double>(), dev_fma, nat_fma).c_str(),
                    (unsigned long long)tg->submits);
        std::printf("weights read per token %.2f MiB -> %.2f GB/s%s", double(wbytes) / (1 << 20), used,
                    fractions(used, dev_read, nat_read).c_str());
        if (ceilings) std::printf("; nearer to the %s ceiling", j["tg"]["nearer_ceiling"].get<std::string>() == "read" ? "read" : "FMA");
        std::printf("\n");
        if (a->vram_budget > 0) {
            const GpuStats& s = e.stats();
            std::printf("memory: %.1f MiB device-local (--vram-budget %.1f MiB), %.1f MiB of weights in host memory, ",
                        double(s.vram_bytes) / (1 << 20), double(a->vram_budget) / (1 << 20),
                        double(s.host_weight_bytes) / (1 << 20));
            if (s.streaming) {
                std::printf("streamed into two slots (%.1f MiB copied per cycle)\n",
                            double(s.stream_bytes_per_cycle) / (1 << 20));
            } else {
                std::printf("read by the GPU in place\n");
            }
            if (s.expert_cache_slots > 0) {
                std::printf("expert cache: %u slots per layer (%.1f MiB device-local); hit rate tg %.1f%%, pp %.1f%%; "
                            "paged per token tg %.2f MiB, pp %.2f MiB\n",
                            s.expert_cache_slots, double(s.expert_cache_bytes) / (1 << 20), 100.0 * tg->expert_hit_rate,
                            100.0 * pp->expert_hit_rate, tg->expert_paged_per_row / (1 << 20),
                            pp->expert_paged_per_row / (1 << 20));
            }
        }
        if (all_experts > 0) {
            std::printf("experts read per token (GPU-counted): tg %.2f MiB, pp %.2f MiB, of %.2f MiB in all experts "
                        "(tg %.1f%%)\n",
                        tg->expert_bytes_per_row / (1 << 20), pp->expert_bytes_per_row / (1 << 20),
                        double(all_experts) / (1 << 20), 100.0 * tg->expert_bytes_per_row / double(all_experts));
        }
        if (!j["batched"].empty() && a->gen < 2) {
            std::printf("(-n 1: no generation after the prompts to time; the aggregates below are 0, see \"with prompts\")\n");
        }
        for (const auto& b : j["batched"]) {
            std::printf("instances %-4u aggregate tg %10.1f tok/s  x%.2f  %8.2f GFLOP/s%s  (with prompts %.1f tok/s x%.2f)  "
                        "%.1f submits/1000 tokens",
                        b["instances"].get<uint32_t>(), b["tok_per_s"].get<double>(), b["ratio_to_first"].get<double>(),
                        b["gflops"].get<double>(), fractions(b["gflops"].get<double>(), dev_fma, nat_fma).c_str(),
                        b["with_prompt_tok_per_s"].get<double>(), b["with_prompt_ratio_to_first"].get<double>(),
                        b["submits_per_1000_tokens"].get<double>());
            if (all_experts > 0) std::printf("  experts %.2f MiB/token", b["expert_bytes_per_token"].get<double>() / (1 << 20));
            if (e.stats().expert_cache_slots > 0) {
                std::printf(" (cache hits %.1f%%, %.2f MiB paged/token)", 100.0 * b["expert_hit_rate"].get<double>(),
                            b["expert_paged_bytes_per_token"].get<double>() / (1 << 20));
            }
            std::printf("\n");
        }
        return 0;
    };
}

}  // namespace blue::cli
