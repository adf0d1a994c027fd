// CascadeRunner (see cascade_run.h).
#include "host/cascade/cascade_run.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "compiler/gguf.h"
#include "compiler/lower_model.h"
#include "host/llm/engine.h"
#include "host/machine_plan.h"
#include "vm/abi.h"
#include "vm/cascade_abi.h"
#include "vm/interp.h"

namespace blue {

namespace {

std::string dirOf(const std::string& path) {
    std::filesystem::path p(path);
    return p.has_parent_path() ? p.parent_path().string() : ".";
}

float asFloat(uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

}  // namespace

const char* StageStats::stateName() const {
    switch (state) {
        case BLUE_CAS_STATE_RAN: return "ran";
        case BLUE_CAS_STATE_SKIPPED: return "skipped";
        case BLUE_CAS_STATE_NO_BUDGET: return "no budget";
        default: return "not reached";
    }
}

CascadeRunner::~CascadeRunner() = default;

Result<std::unique_ptr<CascadeRunner>> CascadeRunner::open(const std::string& path, const CascadeRunOptions& options) {
    std::unique_ptr<CascadeRunner> r(new CascadeRunner());
    r->options_ = options;
    auto m = loadModuleFile(path);
    if (!m) return m.status();
    r->module_ = std::move(m.value());
    auto info = CascadeInfo::fromModule(r->module_);
    if (!info) return Status(info.status()).prefix(path);
    r->info_ = std::move(info.value());
    std::string dir = dirOf(path);
    for (const auto& [name, file] : options.models) {
        size_t index = r->info_.models.size();
        for (size_t k = 0; k < r->info_.models.size(); ++k) {
            if (r->info_.models[k] == name) index = k;
        }
        if (index == r->info_.models.size()) {
            return BLUE_ERROR("--model %s: %s has no model '%s' (it has: %s)", name.c_str(), path.c_str(), name.c_str(),
                              r->module_.metaValue("cascade.models")->c_str());
        }
        auto g = ggufOpen(file);
        if (!g) return Status(g.status()).prefix("--model " + name);
        auto tok = Tokenizer::fromGguf(g.value());
        if (!tok) return Status(tok.status()).prefix("--model " + name);
        if (vocabFingerprint(tok.value()) != r->info_.vocab) {
            return BLUE_ERROR("--model %s: %s has another vocabulary than the cascade was compiled for", name.c_str(), file.c_str());
        }
        std::string absolute = std::filesystem::absolute(file).string();
        if (Status s = rebindModel(r->module_, uint32_t(index), g.value(), absolute); !s) return s.prefix("--model " + name);
    }
    // The tokenizer (all models share it) comes from the first model's file.
    std::string first = resolveModulePath(dir, r->module_.externs[0]);
    auto g = ggufOpen(first);
    if (!g) return g.status();
    auto tok = Tokenizer::fromGguf(g.value());
    if (!tok) return tok.status();
    if (vocabFingerprint(tok.value()) != r->info_.vocab) {
        return BLUE_ERROR("%s: the vocabulary is not the one %s was compiled with; compile the cascade again", first.c_str(), path.c_str());
    }
    r->tokenizer_ = std::move(tok.value());
    auto w = WeightSource::open(r->module_, dir);
    if (!w) return w.status();
    r->weights_ = std::make_unique<WeightSource>(std::move(w.value()));
    if (!options.reference) {
        uint64_t weights = 0;  // every model's, as each is uploaded once
        for (const TensorDecl& t : r->module_.tensors) weights += t.source == DataSource::EXTERN ? t.bytes : 0;
        chooseLavapipeThreads(weights);
        if (Status s = r->resetDevice(); !s) return s;
        const uint32_t limit = deviceLoopLimit(r->device_->info().cpu);
        const uint32_t most = maxPenaltyWindow(limit, uint32_t(r->tokenizer_.vocabSize()), r->historyLength());
        if (r->info_.penalty_window > most) {
            return BLUE_ERROR("%s: stage '%s' applies repetition penalties over %u tokens (repeat_last_n), and this "
                              "device applies them over at most %u (%s); give that stage repeat_last_n %u or less",
                              path.c_str(), r->info_.penalty_stage.c_str(), r->info_.penalty_window, most,
                              loopLimitReason(limit).c_str(), most);
        }
    }
    return r;
}

std::string CascadeRunner::deviceName() const {
    return device_ ? std::string(device_->props().deviceName) : std::string("reference interpreter");
}

uint32_t CascadeRunner::validationErrors() const {
    std::lock_guard<std::mutex> lock(device_mutex_);
    return retired_validation_errors_ + (device_ ? device_->validationErrors() : 0);
}

Status CascadeRunner::resetDevice() {
    std::lock_guard<std::mutex> lock(device_mutex_);
    if (device_) retired_validation_errors_ += device_->validationErrors();
    pipelines_.reset();
    device_.reset();
    DeviceOptions dopt;
    dopt.select = options_.device;
    auto dev = Device::create(dopt);
    if (!dev) return dev.status();
    auto p = Pipelines::create(*dev.value());
    if (!p) return p.status();
    device_ = std::move(dev.value());
    pipelines_ = std::move(p.value());
    return Status::ok();
}

uint32_t CascadeRunner::historyLength() const {
    const std::string* ctx = module_.metaValue(kMetaCtx);
    return ctx ? uint32_t(std::strtoul(ctx->c_str(), nullptr, 10)) : 0;
}

Result<std::unique_ptr<GpuMachine>> CascadeRunner::createMachine(uint32_t instances, uint32_t chain_cycles,
                                                                 uint64_t max_cycles) {
    if (!device_ || !pipelines_) return Status::error("the cascade runs on the reference interpreter or has no device");
    GpuOptions opt;
    opt.instances = instances;
    opt.sample_history = historyLength();
    opt.max_cycles = max_cycles;
    opt.chain_cycles = chain_cycles;
    opt.max_submit_ms = options_.max_submit_ms;
    return GpuMachine::create(*device_, *pipelines_, module_, *weights_, opt);
}

Result<std::vector<CascadeResult>> CascadeRunner::run(const std::vector<CascadeTask>& tasks,
                                                      const CheckpointStream::Sink& on_checkpoint) {
    std::vector<std::vector<uint32_t>> messages;
    for (size_t i = 0; i < tasks.size(); ++i) {
        std::vector<int32_t> ids = tokenizer_.encode(tasks[i].text, false, true);
        if (ids.size() > info_.input_capacity) {
            return BLUE_ERROR("task %zu has %zu tokens, more than the cascade's input slot holds (%u; `slot input[N]` sets it)",
                              i, ids.size(), info_.input_capacity);
        }
        std::vector<uint32_t> resume;
        if (tasks[i].resume) {
            if (!info_.steps) return BLUE_ERROR("task %zu: this cascade module has no checkpoints; compile it again to resume", i);
            resume = tasks[i].resume->block(info_);
        }
        messages.push_back(cascadeRequest(uint32_t(i), tasks[i].seed, ids, resume));
    }
    uint32_t instances = std::max<uint32_t>(1, std::min<uint32_t>(options_.instances, uint32_t(std::max<size_t>(1, tasks.size()))));
    if (info_.max_fork) {
        instances += options_.siblings >= 0 ? uint32_t(options_.siblings) : instances * (info_.max_fork - 1);
    }
    uint64_t max_cycles = options_.max_cycles ? options_.max_cycles : 10000000;
    std::vector<OutputRecord> records;
    std::vector<CycleTime> clock;
    RunReport report;
    CheckpointStream stream(module_, info_, on_checkpoint);
    if (options_.reference) {
        BLUE_TRY(refCanRun(module_));
        RefMachine machine(module_, *weights_, MachineOptions{instances, max_cycles});
        if (on_checkpoint) machine.setOnOutput([&](std::span<const OutputRecord> recs) { stream.feed(recs); });
        // The interpreter's clock: host time after each cycle.
        const auto started = std::chrono::steady_clock::now();
        machine.setAfterCycle([&](uint64_t cycle) {
            clock.push_back({cycle + 1, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count()});
        });
        for (auto& msg : messages) machine.pushInput(msg);
        machine.closeInput();
        report = machine.run();
        records = report.output;
        stats_json_ = strFormat("{\"engine\":\"reference\",\"cycles\":%llu,\"steps\":%llu,\"block_runs\":%llu,\"round_trips\":0}",
                                (unsigned long long)report.cycles, (unsigned long long)report.steps,
                                (unsigned long long)report.block_runs);
    } else {
        GpuOptions opt;
        opt.instances = instances;
        opt.sample_history = historyLength();
        opt.max_cycles = max_cycles;
        opt.chain_cycles = options_.chain_cycles;
        opt.max_submit_ms = options_.max_submit_ms;
        opt.profile = options_.profile;
        opt.record_clock = true;
        auto machine = GpuMachine::create(*device_, *pipelines_, module_, *weights_, opt);
        if (!machine) return machine.status();
        for (auto& msg : messages) {
            if (Status s = machine.value()->pushInput(msg); !s) return s;
        }
        machine.value()->closeInput();
        auto rep = machine.value()->run(
            [&](std::span<const OutputRecord> recs) {
                records.insert(records.end(), recs.begin(), recs.end());
                if (on_checkpoint) stream.feed(recs);
            },
            false);
        if (!rep) return rep.status();
        report = std::move(rep.value());
        gpu_stats_ = machine.value()->stats();
        stats_json_ = gpu_stats_.json();
        clock = machine.value()->clock();
    }
    if (std::string faults = describeFaults(module_, report.instances); !faults.empty()) {
        return Status::error("the cascade program faulted (a compiler bug):\n" + faults);
    }
    if (!report.status) return report.status;
    if (!stream.status()) return stream.status();
    auto results = decode(records, tasks.size());
    if (results) {
        for (CascadeResult& r : results.value()) cascadeStageTimes(r, clock);
    }
    return results;
}

Result<std::vector<CascadeResult>> CascadeRunner::decode(std::span<const OutputRecord> records, size_t tasks) const {
    std::vector<CascadeResult> results(tasks);
    CascadeDecoder decoder(info_, tokenizer_, &module_);
    uint32_t tag = 0;
    CascadeResult r;
    for (const OutputRecord& rec : records) {
        if (rec.kind == BLUE_OUT_BEGIN && rec.value >= tasks) {
            return BLUE_ERROR("cascade output of instance %u: unknown request tag (record kind %u)", rec.inst, rec.kind);
        }
        auto ended = decoder.push(rec, &tag, &r);
        if (!ended) return ended.status();
        if (ended.value()) results[tag] = std::move(r);
    }
    for (auto& [t, partial] : decoder.takeUnfinished()) results[t] = std::move(partial);
    return results;
}

Result<bool> CascadeDecoder::push(const OutputRecord& rec, uint32_t* tag, CascadeResult* result) {
    Cursor& c = cursors_[rec.inst];
    auto bad = [&](const char* what) {
        return BLUE_ERROR("cascade output of instance %u: %s (record kind %u)", rec.inst, what, rec.kind);
    };
    const size_t stage_fields = info_.stages.size() * BLUE_CAS_OUT_STAGE_RECORDS;
    if (rec.kind == BLUE_OUT_BEGIN) {
        c = Cursor{};
        c.tag = rec.value;
        c.result.stages.resize(info_.stages.size());
        for (size_t s = 0; s < info_.stages.size(); ++s) c.result.stages[s].name = info_.stages[s];
        c.result.slots.assign(info_.slots.size(), {});
        return false;
    }
    if (c.tag < 0) return bad("record outside a request");
    CascadeResult& r = c.result;
    auto side = pushSide(c, rec);
    if (!side) return Status(side.status()).prefix(strFormat("cascade output of instance %u", rec.inst));
    if (side.value()) return false;
    if (module_) {  // checkpoints (durable slots) come between OUTBEGIN and the final records
        CheckpointDecoder& ck = checkpoints_.try_emplace(rec.inst, *module_, info_).first->second;
        auto fed = ck.feed(rec);
        if (!fed) return Status(fed.status()).prefix(strFormat("cascade output of instance %u", rec.inst));
        if (fed.value() == CheckpointDecoder::Feed::DONE) r.checkpoints.push_back(ck.checkpoint());
        if (fed.value() != CheckpointDecoder::Feed::NOT_MINE) return false;
    }
    if (rec.kind == BLUE_OUT_END) {
        r.complete = c.field >= stage_fields && c.slot == info_.slots.size() && !c.in_slot_tokens;
        finish(r);
        *tag = uint32_t(c.tag);
        *result = std::move(r);
        c = Cursor{};
        return true;
    }
    if (c.field < stage_fields) {
        StageStats& st = r.stages[c.field / BLUE_CAS_OUT_STAGE_RECORDS];
        switch (c.field % BLUE_CAS_OUT_STAGE_RECORDS) {
            case 0: st.state = rec.value; break;
            case 1: st.tokens = rec.value; break;
            case 2: st.entropy_sum = asFloat(rec.value); break;
            case 3: st.entropy_max = asFloat(rec.value); break;
            case 4: st.logprob_sum = asFloat(rec.value); break;
            case 5: st.cycles = rec.value; break;
            case 6: st.runs = rec.value; break;
            case 7: st.drafted = rec.value; break;
            case 8: st.accepted = rec.value; break;
            case 9: st.passes = rec.value; break;
            case 10: st.choice = rec.value; break;
            case 11: st.branches = rec.value; break;
            case 12: st.siblings = rec.value; break;
            case 13: st.branch_tokens = rec.value; break;
        }
        ++c.field;
        return false;
    }
    if (!c.in_slot_tokens) {
        if (rec.kind != BLUE_OUT_UINT || c.slot >= info_.slots.size()) return bad("expected a slot length");
        c.left = rec.value;
        c.in_slot_tokens = c.left > 0;
        if (!c.in_slot_tokens) ++c.slot;
        return false;
    }
    if (rec.kind != BLUE_OUT_TOKEN) return bad("expected a slot token");
    r.slots[c.slot].push_back(int32_t(rec.value));
    if (--c.left == 0) {
        c.in_slot_tokens = false;
        ++c.slot;
    }
    return false;
}

Result<bool> CascadeDecoder::pushSide(Cursor& c, const OutputRecord& rec) {
    using Side = Cursor::Side;
    CascadeResult& r = c.result;
    switch (c.side) {
        case Side::None: {
            std::string marker;
            if (rec.kind != BLUE_OUT_STR || !module_ || !module_->constString(rec.value, &marker)) return false;
            auto at = checkpoints_.find(rec.inst);
            if (at != checkpoints_.end() && at->second.inside()) return false;
            if (marker == BLUE_CAS_STREAM_MARKER) {
                if (info_.stream_slot < 0) return Status::error("a stream record, but the module names no stream slot");
                c.side = Side::StreamCount;
            } else if (marker == BLUE_CAS_STAGE_TIME_MARKER) {
                c.side = Side::Time;
                c.side_left = BLUE_CAS_STAGE_TIME_RECORDS - 1;
                r.runs.emplace_back();
            } else {
                return false;
            }
            return true;
        }
        case Side::StreamCount: {
            const uint32_t cap = info_.slot_capacity[size_t(info_.stream_slot)];
            if (rec.kind != BLUE_OUT_UINT || rec.value == 0 || rec.value > cap - std::min<size_t>(cap, r.streamed.size())) {
                return Status::error("stream record: expected a token count that fits the stream slot");
            }
            c.side = Side::StreamTokens;
            c.side_left = rec.value;
            return true;
        }
        case Side::StreamTokens:
            if (rec.kind != BLUE_OUT_TOKEN) return Status::error("stream record: expected a token");
            r.streamed.push_back(int32_t(rec.value));
            if (--c.side_left == 0) c.side = Side::None;
            return true;
        case Side::Time: {
            if (rec.kind != BLUE_OUT_UINT) return Status::error("stage-time record: expected a number");
            CascadeResult::StageRun& run = r.runs.back();
            const uint32_t field = BLUE_CAS_STAGE_TIME_RECORDS - c.side_left;  // 1: stage, 2: start, 3: cycles
            if (field == 1 && rec.value >= info_.stages.size()) return Status::error("stage-time record: no such stage");
            (field == 1 ? run.stage : field == 2 ? run.start : run.cycles) = rec.value;
            if (--c.side_left == 0) c.side = Side::None;
            return true;
        }
    }
    return false;
}

std::span<const int32_t> CascadeDecoder::streamed(uint32_t inst) const {
    auto it = cursors_.find(inst);
    if (it == cursors_.end() || it->second.tag < 0) return {};
    return it->second.result.streamed;
}

std::vector<std::pair<uint32_t, CascadeResult>> CascadeDecoder::takeUnfinished() {
    std::vector<std::pair<uint32_t, CascadeResult>> out;
    for (auto& [inst, c] : cursors_) {
        if (c.tag < 0) continue;
        finish(c.result);
        out.emplace_back(uint32_t(c.tag), std::move(c.result));
    }
    cursors_.clear();
    return out;
}

void CascadeDecoder::finish(CascadeResult& r) const {
    r.slot_text.clear();
    for (const auto& slot : r.slots) r.slot_text.push_back(tokenizer_.decode(slot));
    r.generated = 0;
    for (const StageStats& st : r.stages) {
        if (st.state == BLUE_CAS_STATE_RAN) r.generated += st.branches ? st.branch_tokens : st.tokens;
    }
}

std::vector<uint32_t> cascadeRequest(uint32_t tag, uint32_t seed, std::span<const int32_t> tokens,
                                     std::span<const uint32_t> resume) {
    std::vector<uint32_t> msg(BLUE_CAS_REQ_HEADER);
    msg[BLUE_CAS_REQ_TAG] = tag;
    msg[BLUE_CAS_REQ_SEED] = seed;
    if (!resume.empty()) {
        msg[BLUE_CAS_REQ_FLAGS] = BLUE_CAS_REQ_RESUME;
        msg.insert(msg.end(), resume.begin(), resume.end());
    }
    msg.insert(msg.end(), tokens.begin(), tokens.end());
    return msg;
}

std::string cascadeStatsJson(const CascadeResult& r) {
    std::string out = "{\"stages\":[";
    for (size_t s = 0; s < r.stages.size(); ++s) {
        const StageStats& st = r.stages[s];
        out += strFormat("%s{\"name\":\"%s\",\"state\":\"%s\",\"runs\":%u,\"tokens\":%u,\"cycles\":%u,"
                         "\"entropy_mean\":%.4f,\"entropy_max\":%.4f,\"logprob_mean\":%.4f",
                         s ? "," : "", st.name.c_str(), st.stateName(), st.runs, st.tokens, st.cycles,
                         st.entropyMean(), st.entropy_max, st.logprobMean());
        if (st.ms >= 0) out += strFormat(",\"ms\":%.3f,\"ms_total\":%.3f", st.ms, st.ms_total);
        if (st.passes) {
            out += strFormat(",\"drafted\":%u,\"accepted\":%u,\"acceptance\":%.4f,\"target_passes\":%u,"
                             "\"tokens_per_pass\":%.4f",
                             st.drafted, st.accepted, st.drafted ? double(st.accepted) / st.drafted : 0.0, st.passes,
                             double(st.tokens) / st.passes);
        }
        if (st.branches) {
            out += strFormat(",\"branches\":%u,\"by_siblings\":%u,\"branch_tokens\":%u,\"kept\":%u",
                             st.branches, st.siblings, st.branch_tokens, st.choice);
        }
        out += "}";
    }
    out += strFormat("],\"generated\":%u}", r.generated);
    return out;
}

namespace {

// The clock's time when `cycle` cycles were done: linear between the points around it (the
// cycles of one chain are taken to cost the same), the last point's time past the end.
double timeAt(std::span<const CycleTime> clock, uint64_t cycle) {
    CycleTime before;  // (0, 0): the first submit
    for (const CycleTime& p : clock) {
        if (p.cycles >= cycle) {
            if (p.cycles == before.cycles) return p.ms;
            const double f = double(cycle - before.cycles) / double(p.cycles - before.cycles);
            return before.ms + f * (p.ms - before.ms);
        }
        if (p.cycles > before.cycles || p.ms > before.ms) before = p;
    }
    return before.ms;
}

}  // namespace

void cascadeStageTimes(CascadeResult& r, std::span<const CycleTime> clock) {
    if (clock.empty()) return;
    for (StageStats& st : r.stages) st.ms = st.ms_total = 0;
    for (const CascadeResult::StageRun& run : r.runs) {
        if (run.stage >= r.stages.size()) continue;
        const double ms = std::max(0.0, timeAt(clock, uint64_t(run.start) + run.cycles) - timeAt(clock, run.start));
        r.stages[run.stage].ms = ms;  // runs arrive in order: the last one stays
        r.stages[run.stage].ms_total += ms;
    }
}

}  // namespace blue
