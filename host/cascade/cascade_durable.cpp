// runDurable (see cascade_durable.h).
#include "host/cascade/cascade_durable.h"

#include <filesystem>

#include "host/cascade/cascade_wal.h"

namespace blue {

Result<DurableRun> runDurable(CascadeRunner& runner, const CascadeTask& task, bool reference, const std::string& wal_path,
                              const std::function<void(const std::string&)>& notice) {
    const CascadeInfo& info = runner.info();
    if (!info.steps) return BLUE_ERROR("--wal: this cascade module has no checkpoints; compile it again with this bluec");
    const WalIdentity id = walIdentity(runner, task, reference);
    DurableRun out;
    CascadeResume state = CascadeResume::initial(info);
    WalWriter wal;
    std::error_code ec;
    if (std::filesystem::exists(wal_path, ec)) {
        BLUE_TRY_ASSIGN(wal, WalWriter::open(wal_path));
        BLUE_TRY_ASSIGN(std::vector<uint8_t> bytes, wal.contents());
        BLUE_TRY_ASSIGN(WalContents log, walParse(bytes, wal_path, id, info));
        if (!log.torn.empty()) notice(log.torn + "; resuming from the record before it");
        if (log.final) {
            out.result = std::move(*log.final);
            for (const auto& slot : out.result.slots) out.result.slot_text.push_back(runner.tokenizer().decode(slot));
            out.from_log = true;
            notice(strFormat("%s: the run finished before (%zu checkpoints); printing its final slots without running again",
                             wal_path.c_str(), log.checkpoints.size()));
            return out;
        }
        for (const CascadeCheckpoint& c : log.checkpoints) state.apply(c);
        out.resumed_checkpoints = log.checkpoints.size();
        if (out.resumed_checkpoints) {
            const CascadeCheckpoint& last = log.checkpoints.back();
            notice(strFormat("%s: resuming after step %u (stage '%s'), checkpoint %zu", wal_path.c_str(), last.step,
                             info.stages[last.stage].c_str(), out.resumed_checkpoints));
        }
        BLUE_TRY(wal.cut(log.valid_bytes));
    } else {
        BLUE_TRY_ASSIGN(wal, WalWriter::create(wal_path, id));
    }
    CascadeTask t = task;
    if (out.resumed_checkpoints) t.resume = &state;
    auto results = runner.run({t}, [&](uint32_t, const CascadeCheckpoint& c) { return wal.append(walCheckpointPayload(c)); });
    if (!results) return results.status();
    out.result = std::move(results.value()[0]);
    if (!out.result.complete) return Status::error("the task did not complete");
    BLUE_TRY(wal.append(walFinalPayload(out.result)));
    return out;
}

}  // namespace blue
