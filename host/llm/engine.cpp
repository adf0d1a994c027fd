// Engine (see engine.h).
#include "host/llm/engine.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "compiler/lower_model.h"
#include "host/machine_plan.h"
#include "vm/abi.h"
#include "vm/kv_pages_abi.h"
#include "vm/llm_abi.h"
#include "vm/verify.h"

namespace blue {

namespace {

bool endsWith(const std::string& s, const char* suffix) {
    size_t n = std::strlen(suffix);
    return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

std::string dirOf(const std::string& path) {
    std::filesystem::path p(path);
    return p.has_parent_path() ? p.parent_path().string() : ".";
}

}  // namespace

// lavapipe (Mesa's CPU Vulkan driver) hands every non-empty dispatch to worker threads, which
// costs 10-70 us each; with LP_NUM_THREADS=0 it runs them on its queue thread for ~0.2 us. Small
// models issue ~80 small dispatches per token and run several times faster single-threaded;
// large ones (from 16 MiB of weights) are dominated by matmuls that gain from both cores.
void chooseLavapipeThreads(uint64_t weight_bytes) {
    if (std::getenv("LP_NUM_THREADS")) return;
    if (weight_bytes < (16ull << 20)) setenv("LP_NUM_THREADS", "0", 0);
}

Engine::~Engine() = default;

Result<std::unique_ptr<Engine>> Engine::open(const std::string& path, const EngineOptions& options,
                                             bool* device_failed) {
    if (device_failed) *device_failed = false;
    std::unique_ptr<Engine> e(new Engine());
    e->options_ = options;
    std::string gguf_path = path, module_dir;
    if (endsWith(path, ".bir")) {
        auto m = loadModuleFile(path);
        if (!m) return m.status();
        auto ctx = checkGenerationModule(m.value(), path);
        if (!ctx) return ctx.status();
        e->ctx_ = ctx.value();
        module_dir = dirOf(path);
        gguf_path = resolveModulePath(module_dir, m->externs[0]);
        e->module_ = std::move(m.value());
    }
    auto g = ggufOpen(gguf_path);
    if (!g) return g.status();
    e->gguf_ = std::move(g.value());
    e->model_hash_ = kvModelHash(e->gguf_);
    auto cfg = modelConfigFromGguf(e->gguf_);
    if (!cfg) return cfg.status();
    e->config_ = cfg.value();
    auto tok = Tokenizer::fromGguf(e->gguf_);
    if (!tok) return tok.status();
    e->tokenizer_ = std::move(tok.value());
    uint64_t weights = 0;
    for (const GgufTensor& t : e->gguf_.tensors()) weights += t.n_bytes;
    chooseLavapipeThreads(weights);
    if (Status s = e->resetDevice(); !s) {
        if (device_failed) *device_failed = true;
        return s;
    }
    if (e->module_.code.empty()) {
        LowerOptions lo;
        lo.ctx = options.ctx;
        lo.max_rows = options.max_rows;
        lo.kv_type = options.kv_type;
        lo.grammar_words = options.grammar_words;
        lo.pooling = options.pooling;
        lo.sessions = options.sessions;
        lo.kv_page = options.kv_page;
        lo.kv_pool = options.kv_pool;
        lo.kv_pool_contexts = options.kv_pool_contexts ? options.kv_pool_contexts : std::max(options.instances, 1u);
        if (lo.grammar_words == kGrammarWordsAuto) {
            // 16 instances' automata in one page of the device (1 MiB pages: 16384 words each);
            // none on a device whose pages cannot hold 4096 words for each.
            lo.grammar_words = uint32_t(std::min<uint64_t>(kDefaultGrammarWords, e->device_->maxPageBytes() / 4 / 16) & ~3u);
            lo.grammar_words = std::min(lo.grammar_words, maxGrammarWords(deviceLoopLimit(e->device_->info().cpu)));
            if (lo.grammar_words < 4096) lo.grammar_words = 0;
        }
        lo.model_path = std::filesystem::absolute(gguf_path).string();
        auto m = lowerModel(e->gguf_, e->config_, lo);
        if (!m) return m.status();
        auto ctx = checkGenerationModule(m.value(), gguf_path);
        if (!ctx) return ctx.status();
        e->ctx_ = ctx.value();
        e->module_ = std::move(m.value());
    }
    if (const std::string* words = e->module_.metaValue(kMetaGrammarWords)) {
        e->grammar_words_ = uint32_t(std::strtoul(words->c_str(), nullptr, 10));
    }
    if (e->device_) {
        const uint32_t limit = deviceLoopLimit(e->device_->info().cpu);
        const uint32_t most = maxGrammarWords(limit);
        if (e->grammar_words_ > most) {
            return BLUE_ERROR("%s: grammar words %u: an instance copies a request's automaton in one cycle, and "
                              "this device copies at most %u words there (%s); use --grammar-words %u or less",
                              path.c_str(), e->grammar_words_, most, loopLimitReason(limit).c_str(), most);
        }
    }
    if (const std::string* p = e->module_.metaValue(kMetaPooling)) {
        std::optional<Pooling> pooling = parsePooling(*p);
        if (!pooling) return BLUE_ERROR("%s: %s '%s' is not a pooling type", path.c_str(), kMetaPooling, p->c_str());
        e->pooling_ = *pooling;
    }
    if (const std::string* n = e->module_.metaValue(kMetaSessions)) {
        e->sessions_ = uint32_t(std::strtoul(n->c_str(), nullptr, 10));
        if (e->sessions_ > kMaxSessions) return BLUE_ERROR("%s: %s '%s' is not a session count", path.c_str(), kMetaSessions, n->c_str());
    }
    if (Status s = e->readKvPaging(path); !s) return s;
    auto w = WeightSource::open(e->module_, module_dir);
    if (!w) return w.status();
    e->weights_ = std::make_unique<WeightSource>(std::move(w.value()));
    return e;
}

namespace {

// "MESSAGE while WHAT": what was running when a failure happened.
Status during(const Status& s, const std::string& what) {
    return Status::error(s.message() + " while " + what);
}

}  // namespace

Status Engine::readKvPaging(const std::string& path) {
    const std::string* page = module_.metaValue(kMetaKvPage);
    if (!page) return Status::ok();
    const std::string* pages = module_.metaValue(kMetaKvPages);
    kv_page_ = uint32_t(std::strtoul(page->c_str(), nullptr, 10));
    kv_pages_ = pages ? uint32_t(std::strtoul(pages->c_str(), nullptr, 10)) : 0;
    if (kv_page_ < BLUE_KVP_MIN_PAGE || kv_page_ > BLUE_KVP_MAX_PAGE || kv_pages_ == 0) {
        return BLUE_ERROR("%s: %s '%s' with %s '%s' is not a paged KV layout", path.c_str(), kMetaKvPage,
                          page->c_str(), kMetaKvPages, pages ? pages->c_str() : "(missing)");
    }
    // Each pool is one tensor, so it must fit one binding; say so with the pool's size in
    // positions rather than as a tensor the planner cannot place.
    auto it = std::find_if(module_.tensors.begin(), module_.tensors.end(),
                           [](const TensorDecl& t) { return t.name == "kpool.0"; });
    if (!device_ || it == module_.tensors.end()) return Status::ok();
    const uint64_t page_bytes = dtypeRowBytes(it->dtype, it->ne[0]).value_or(0) * kv_page_;
    const uint64_t limit = device_->maxPlanPageBytes();
    if (page_bytes * kv_pages_ > limit) {
        return BLUE_ERROR("%s: a KV pool of %llu positions (%u pages of %u) needs %.1f MiB per layer for K and as much "
                          "for V, more than the device's largest storage binding (%.1f MiB); at most %llu positions "
                          "fit (--kv-pool)",
                          path.c_str(), (unsigned long long)kv_pages_ * kv_page_, kv_pages_, kv_page_,
                          double(page_bytes * kv_pages_) / (1 << 20), double(limit) / (1 << 20),
                          (unsigned long long)(limit / page_bytes * kv_page_));
    }
    return Status::ok();
}

Status Engine::resetDevice() {
    {
        std::lock_guard<std::mutex> lock(device_mutex_);
        if (device_) retired_validation_errors_ += device_->validationErrors();
        pipelines_.reset();
        device_.reset();
    }
    clearVkFailure();
    DeviceOptions dopt;
    dopt.select = options_.device;
    dopt.validation = options_.validation;
    auto dev = Device::create(dopt);
    if (!dev) return during(dev.status(), "creating the Vulkan device");
    auto p = Pipelines::create(*dev.value());
    std::lock_guard<std::mutex> lock(device_mutex_);
    device_ = std::move(dev.value());
    if (!p) {
        VkFailure f = lastVkFailure();
        if (f.result == VK_ERROR_DEVICE_LOST) device_->markLost(f.message);
        return during(p.status(), "creating the pipelines");
    }
    pipelines_ = std::move(p.value());
    return Status::ok();
}

VkFailure Engine::noteDeviceFailure() {
    VkFailure f = lastVkFailure();
    if (f.result == VK_ERROR_DEVICE_LOST && device_) device_->markLost(f.message);
    return f;
}

uint32_t Engine::validationErrors() const {
    std::lock_guard<std::mutex> lock(device_mutex_);
    return retired_validation_errors_ + (device_ ? device_->validationErrors() : 0);
}

Status Engine::deviceUsable() const {
    if (!device_) {
        return Status::error(
            "there is no Vulkan device (creating it failed; resetDevice() tries again)");
    }
    if (device_->lost()) {
        return Status::error("the device was lost earlier (" + device_->lostReason() +
                             "); resetDevice() builds a new one");
    }
    if (!pipelines_) {
        return Status::error(
            "the device has no pipelines (creating them failed; resetDevice() tries again)");
    }
    return Status::ok();
}

std::vector<uint32_t> Engine::promptTokens(const std::string& text) const {
    return tokenizer_.promptIds(text);
}

std::vector<uint32_t> Engine::specialTokens(const std::string& text) const {
    std::vector<uint32_t> out;
    for (int32_t id : tokenizer_.encode(text, true, true)) out.push_back(uint32_t(id));
    if (out.empty() && tokenizer_.bos() != kNoToken) out.push_back(uint32_t(tokenizer_.bos()));
    return out;
}

Result<std::string> Engine::formatChat(const std::vector<ChatMessage>& messages) const {
    if (messages.empty()) return Status::error("the conversation has no messages");
    return applyChatTemplate(gguf_, messages, true);
}

std::string Engine::chatTemplateName() const {
    Result<ChatTemplate> t = chatTemplateOf(gguf_);
    return t ? std::string(blue::chatTemplateName(t.value())) : std::string();
}

std::string Engine::modelName() const {
    Result<std::string_view> name = gguf_.getStringOr("general.name", "");
    if (name && !name.value().empty()) return std::string(name.value());
    return config_.arch_name;
}

Status Engine::validate(const GenerationRequest& r) const {
    if (r.prompt.empty()) return Status::error("the prompt is empty (and the model has no BOS token)");
    if (r.start > 0 && uint64_t(r.start) + r.prompt.size() >= ctx_) {
        return BLUE_ERROR("the prompt has %zu tokens after %u restored ones; the context holds %u (use a larger --ctx)",
                          r.prompt.size(), r.start, ctx_);
    }
    if (r.prompt.size() >= ctx_) {
        return BLUE_ERROR("the prompt has %zu tokens; the context holds %u (use a larger --ctx)",
                          r.prompt.size(), ctx_);
    }
    for (uint32_t t : r.prompt) {
        if (t >= config_.n_vocab) return BLUE_ERROR("prompt token %u is outside the vocabulary (%u)", t, config_.n_vocab);
    }
    if (r.embed && pooling_ == Pooling::None) {
        return BLUE_ERROR("this model has no pooling type for embeddings (the file has no '%s.pooling_type'): "
                          "choose one with --pooling mean|cls|last",
                          config_.arch_name.c_str());
    }
    if (r.session > sessions_) {
        return sessions_ ? BLUE_ERROR("session slot %u does not exist (the program has %u)", r.session - 1, sessions_)
                         : Status::error("this program keeps no sessions (serve with --sessions N)");
    }
    if (r.session && (r.start > 0 || r.embed)) {
        return Status::error("a session request takes no restored conversation and is not an embedding");
    }
    if (r.embed && (r.start > 0 || r.logprobs || r.top_logprobs || (r.grammar && !r.grammar->empty()))) {
        return Status::error("an embedding takes no restored conversation, log-probabilities or grammar");
    }
    if (r.stop_tokens.size() > BLUE_REQ_MAX_STOP) {
        return BLUE_ERROR("at most %u stop tokens per request", BLUE_REQ_MAX_STOP);
    }
    if (r.top_logprobs > BLUE_MAX_TOP_LOGPROBS) {
        return BLUE_ERROR("top_logprobs %u is above %u", r.top_logprobs, BLUE_MAX_TOP_LOGPROBS);
    }
    if (r.grammar && !r.grammar->empty()) {
        if (grammar_words_ == 0) {
            return Status::error("this program was lowered without grammar support (lower the model again, "
                                 "without --grammar-words 0)");
        }
        if (r.grammar->size() > grammar_words_) {
            return BLUE_ERROR("the grammar's automaton needs %zu words (%u states x %u byte classes); an instance "
                              "holds %u (--grammar-words)",
                              r.grammar->size(), (*r.grammar)[0], r.grammar->size() > 1 ? (*r.grammar)[1] : 0,
                              grammar_words_);
        }
    }
    const SamplingParams& s = r.sampling;
    if (!(s.temperature >= 0) || !(s.top_p > 0 && s.top_p <= 1) || !(s.min_p >= 0 && s.min_p <= 1) ||
        !(s.repeat_penalty > 0)) {
        return Status::error("sampling parameters out of range: temperature >= 0, 0 < top_p <= 1, "
                             "0 <= min_p <= 1, repeat_penalty > 0");
    }
    const bool penalties = s.repeat_penalty != 1.0f || s.presence_penalty != 0.0f || s.frequency_penalty != 0.0f;
    if (penalties && hasDevice()) {
        const uint32_t limit = deviceLoopLimit(device().info().cpu);
        const uint32_t most = maxPenaltyWindow(limit, config_.n_vocab, ctx_);
        const uint32_t window = std::min(s.repeat_last_n, ctx_);
        if (window > most) {
            return BLUE_ERROR("repeat_last_n %u: the penalties would walk %u tokens, and this device applies them "
                              "over at most %u (%s); use --repeat-last-n %u or less",
                              s.repeat_last_n, window, most, loopLimitReason(limit).c_str(), most);
        }
    }
    return Status::ok();
}

Result<std::unique_ptr<GpuMachine>> Engine::createMachine(uint32_t instances, uint32_t chain_cycles,
                                                          uint64_t max_cycles) {
    GpuOptions opt;
    opt.instances = instances;
    opt.sample_history = ctx_;
    opt.chain_cycles = chain_cycles;
    opt.max_cycles = max_cycles;
    opt.profile = options_.profile;
    opt.vram_budget = options_.vram_budget;
    opt.expert_cache = options_.expert_cache;
    opt.host_weights = options_.host_weights;
    opt.on_load = options_.on_load;
    // A paged pool's counters (committed, clock, in use, peak) come back with every chain.
    if (kv_pages_) opt.heap_watch = BLUE_KVP_BASE(module_.layout.in_slots);
    BLUE_TRY(deviceUsable());
    clearVkFailure();
    auto machine = GpuMachine::create(*device_, *pipelines_, module_, *weights_, opt);
    if (!machine) {
        noteDeviceFailure();
        const char* plural = instances == 1 ? "" : "s";
        return during(machine.status(),
                      strFormat("loading the model onto the device (a machine of %u instance%s)",
                                instances, plural));
    }
    return machine;
}

namespace {

// The matrix of every MATMUL and MOEMM in the module's blocks, once per instruction, with the
// share of it one row reads: all of a MATMUL's, k of E experts of a MOEMM's.
struct MatrixUse {
    const TensorDecl* t;
    uint64_t num = 1, den = 1;
    bool experts = false;
};
std::vector<MatrixUse> matmulMatrices(const Module& m) {
    std::vector<MatrixUse> out;
    for (const BlockDecl& b : m.blocks) {
        std::vector<TensorInstr> instrs;
        if (!decodeBlock(m, b, &instrs)) continue;
        for (const TensorInstr& ti : instrs) {
            const TensorDecl& w = m.tensors[ti.args[1]];
            if (ti.op == Op::MATMUL || ti.op == Op::MATMULADD || ti.op == Op::MATMULGLU) out.push_back({&w});
            if (ti.op == Op::MOEMM) out.push_back({&w, m.tensors[ti.args[0]].elements() / w.ne[1], w.ne[2], true});
        }
    }
    return out;
}

}  // namespace

uint64_t Engine::matmulWeightBytes() const {
    uint64_t bytes = 0;
    for (const MatrixUse& u : matmulMatrices(module_)) bytes += u.t->bytes * u.num / u.den;
    return bytes;
}

uint64_t Engine::matmulWeightElements() const {
    uint64_t n = 0;
    for (const MatrixUse& u : matmulMatrices(module_)) n += u.t->elements() * u.num / u.den;
    return n;
}

uint64_t Engine::expertWeightBytes() const {
    uint64_t bytes = 0;
    for (const MatrixUse& u : matmulMatrices(module_)) bytes += u.experts ? u.t->bytes : 0;
    return bytes;
}

namespace {

// What a generation run was doing: "generating request 2 (1 more queued; after 3 chain submits, at
// VM cycle 40)". `serving`: instance -> request (~0: none); requests that ended are not counted.
std::string describeRunning(const std::vector<uint32_t>& serving, size_t n_requests,
                            const std::vector<Completion>& out, const GpuStats& st) {
    std::string running;
    size_t n_running = 0, queued = 0;
    for (uint32_t r : serving) {
        if (r == 0xFFFFFFFFu) continue;
        running += (n_running++ ? ", " : "") + std::to_string(r);
    }
    for (size_t r = 0; r < n_requests; ++r) {
        bool started = !out[r].tokens.empty() || out[r].finished;
        for (uint32_t s : serving) started |= s == r;
        queued += started ? 0 : 1;
    }
    std::string what = n_running == 0 ? "generating (no request started yet"
                                      : strFormat("generating request%s %s (",
                                                  n_running > 1 ? "s" : "", running.c_str());
    if (n_running > 0 && queued > 0) what += strFormat("%zu more queued; ", queued);
    if (n_running == 0) what += strFormat(", %zu queued; ", queued);
    return what + strFormat("after %llu chain submits, at VM cycle %llu)",
                            (unsigned long long)st.submits, (unsigned long long)st.cycles);
}

}  // namespace

bool LogprobRecords::take(const OutputRecord& r) {
    if (r.kind == BLUE_OUT_INT) {
        pending.top.emplace_back(r.value, 0.0f);
        return true;
    }
    if (r.kind != BLUE_OUT_FLOAT) return false;
    float v = std::bit_cast<float>(r.value);
    if (!have) {
        pending.logprob = v;
        have = true;
    } else if (!pending.top.empty()) {
        pending.top.back().second = v;
    }
    return true;
}

std::optional<TokenLogprobs> LogprobRecords::pop() {
    if (!have) return std::nullopt;
    TokenLogprobs t = std::move(pending);
    pending = {};
    have = false;
    return t;
}

Result<std::vector<Completion>> Engine::run(const std::vector<GenerationRequest>& requests_in,
                                            const TokenCallback& on_token, const KvRun& kv) {
    const bool with_kv = kv.restore || kv.save;
    if (with_kv && requests_in.size() != 1) {
        return BLUE_ERROR("saving or restoring a KV snapshot takes one request (%zu given)", requests_in.size());
    }
    std::vector<GenerationRequest> requests = requests_in;
    if (kv.restore) {
        auto r = kvRequest(requests[0], *kv.restore);
        if (!r) return r.status();
        requests[0] = r.value();
    }
    for (size_t i = 0; i < requests.size(); ++i) {
        Status s = validate(requests[i]);
        if (!s) return s.prefix(strFormat("request %zu", i));
    }
    uint64_t budget = 16;
    for (const GenerationRequest& r : requests) {
        // An embedding emits n_embd records, 4 control steps each (layout.max_steps a cycle).
        budget += r.prompt.size() + (r.embed ? config_.n_embd / 256 + 1 : r.max_new) + 4;
    }
    const uint32_t instances = with_kv ? 1 : options_.instances;
    auto machine = createMachine(instances, options_.chain_cycles,
                                 options_.max_cycles ? options_.max_cycles : budget * 2);
    if (!machine) return machine.status();
    if (kv.restore) BLUE_TRY(kvRestore(*machine.value(), *kv.restore, requests[0].start));
    std::vector<Completion> out(requests.size());
    std::vector<TokenStreamDecoder> decoders;
    for (size_t i = 0; i < requests.size(); ++i) {
        GenerationRequest r = requests[i];
        r.tag = uint32_t(i);
        r.top_logprobs = std::min(r.top_logprobs, config_.n_vocab);
        BLUE_TRY(machine.value()->pushInput(encodeRequest(r)));
        // Text continues the prompt unless the prompt was just BOS.
        bool fresh = r.start == 0 && r.prompt.size() == 1 && int32_t(r.prompt[0]) == tokenizer_.bos();
        decoders.emplace_back(tokenizer_, false, fresh);
    }
    machine.value()->closeInput();
    // An instance announces which request it serves (BEGIN), streams its tokens, then END.
    std::vector<uint32_t> serving(instances, 0xFFFFFFFFu);
    std::vector<LogprobRecords> lps(instances);
    auto sink = [&](std::span<const OutputRecord> records) {
        for (const OutputRecord& rec : records) {
            uint32_t req = rec.inst < serving.size() ? serving[rec.inst] : 0xFFFFFFFFu;
            if (rec.kind == BLUE_OUT_BEGIN) {
                serving[rec.inst] = rec.value < out.size() ? rec.value : 0xFFFFFFFFu;
            } else if (rec.kind == BLUE_OUT_UINT && req != 0xFFFFFFFFu) {
                out[req].cached_tokens = rec.value;  // prefix reuse (vm/llm_abi.h)
            } else if (rec.kind == BLUE_OUT_FLOAT && req != 0xFFFFFFFFu && requests[req].embed) {
                out[req].embedding.push_back(std::bit_cast<float>(rec.value));
            } else if (req != 0xFFFFFFFFu && lps[rec.inst].take(rec)) {
                continue;
            } else if (rec.kind == BLUE_OUT_TOKEN && req != 0xFFFFFFFFu) {
                if (auto lp = lps[rec.inst].pop()) out[req].logprobs.push_back(std::move(*lp));
                out[req].tokens.push_back(rec.value);
                std::string text = decoders[req].push(int32_t(rec.value));
                out[req].text += text;
                if (on_token) on_token(req, rec.value, text);
            } else if (rec.kind == BLUE_OUT_END && req != 0xFFFFFFFFu) {
                std::string rest = decoders[req].finish();
                out[req].text += rest;
                if (on_token && !rest.empty()) on_token(req, 0xFFFFFFFFu, rest);
                out[req].finished = true;
                serving[rec.inst] = 0xFFFFFFFFu;
            }
        }
    };
    clearVkFailure();
    auto report = machine.value()->run(sink, false);
    stats_ = machine.value()->stats();
    if (!report) {
        noteDeviceFailure();
        return during(report.status(), describeRunning(serving, requests.size(), out, stats_));
    }
    if (!report.value().status) return report.value().status;
    std::string faults = describeFaults(module_, report.value().instances);
    if (!faults.empty()) return Status::error("the generation program faulted: " + faults);
    if (kv.save) BLUE_TRY(kvSave(*machine.value(), kv.save));
    if (kv_pages_) {  // the program's counters
        kv_pages_peak_ = stats_.heap_watch[BLUE_KVP_PEAK];
        kv_evictions_ = stats_.heap_watch[BLUE_KVP_EVICTIONS];
    }
    return out;
}

}  // namespace blue
