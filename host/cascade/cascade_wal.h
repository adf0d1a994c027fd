// The write-ahead log of durable slots (`bluevm run CASCADE.bir --wal FILE`): the checkpoints a
// cascade program reported for one task, appended and fsynced as each stage ends, so that a run
// killed at any point resumes after its last completed stage.
//
// Format (little-endian):
//   header, 40 bytes: magic "BLUEWAL\0", u32 version (1), u32 engine (0 GPU, 1 reference),
//     u64 module hash, u64 task hash (FNV-1a 64 of the module's serialized bytes, of the task's
//     text), u32 seed, u32 CRC-32 of the 36 bytes before it;
//   then records: u32 payload length (a multiple of 4, at most kWalMaxPayload), u32 CRC-32 of
//     the payload, u32 CRC-32 of those 8 bytes, then the payload as u32 words:
//       checkpoint: 1, step, stage, runs, total, loop counters, 7 statistics words, slot,
//                   length, tokens (vm/cascade_abi.h);
//       final:      2, per stage its 7 statistics words, per slot its length and tokens.
// Reading refuses (naming the file, the byte offset and the fault) a bad header, another
// module, task, seed or engine, a record whose header or payload checksum fails, a payload that
// does not decode or does not fit the module, and anything after a final record. A record cut
// short by the end of the file (the writer died inside a write) is reported and dropped.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "host/cascade/cascade_checkpoint.h"
#include "host/cascade/cascade_run.h"

namespace blue {

inline constexpr uint32_t kWalVersion = 1;
inline constexpr size_t kWalHeaderBytes = 40, kWalRecordHeaderBytes = 12;
inline constexpr uint32_t kWalMaxPayload = 64u << 20;

struct WalIdentity {
    uint32_t engine = 0;  // 0 GPU, 1 reference interpreter
    uint64_t module_hash = 0, task_hash = 0;
    uint32_t seed = 0;
};

uint64_t walHash(std::span<const uint8_t> bytes);
// The identity of a run of `runner`'s module on `task` (with `reference` the engine).
WalIdentity walIdentity(const CascadeRunner& runner, const CascadeTask& task, bool reference);

struct WalContents {
    std::vector<CascadeCheckpoint> checkpoints;
    std::optional<CascadeResult> final;  // the finished run's result (no slot text)
    uint64_t valid_bytes = 0;  // header and complete records; a writer continues from here
    std::string torn;          // a torn last record that was dropped: why (empty: none)
};

// Parses a log's bytes; `name` starts every message.
Result<WalContents> walParse(std::span<const uint8_t> bytes, const std::string& name,
                             const WalIdentity& expect, const CascadeInfo& info);
Result<WalContents> walRead(const std::string& path, const WalIdentity& expect, const CascadeInfo& info);

// Payload encodings (exposed for tests).
std::vector<uint32_t> walCheckpointPayload(const CascadeCheckpoint& c);
std::vector<uint32_t> walFinalPayload(const CascadeResult& r);
// A whole record (header and payload) as the log stores it.
std::vector<uint8_t> walRecord(std::span<const uint32_t> payload);
std::vector<uint8_t> walHeader(const WalIdentity& id);

// Appends records to a log; every append is written with one write() and fsynced. A writer
// holds an exclusive flock() on the log for its lifetime, so two runs never share one.
class WalWriter {
public:
    WalWriter() = default;
    WalWriter(WalWriter&& o) noexcept : path_(std::move(o.path_)), fd_(o.fd_) { o.fd_ = -1; }
    WalWriter& operator=(WalWriter&& o) noexcept;
    ~WalWriter();
    // A new log holding only the header: written to PATH.tmp.PID, fsynced and linked to PATH
    // (which must not exist), so that PATH never exists with a partial header.
    static Result<WalWriter> create(const std::string& path, const WalIdentity& id);
    // An existing log, for reading with contents() and then appending. Fails when another
    // process holds it.
    static Result<WalWriter> open(const std::string& path);
    Result<std::vector<uint8_t>> contents() const;
    // Cuts the log to `valid_bytes` (dropping a torn record); appends go there.
    Status cut(uint64_t valid_bytes);
    Status append(std::span<const uint32_t> payload);

private:
    std::string path_;
    int fd_ = -1;
};

}  // namespace blue
