// KV snapshots: one conversation's state (the token ids it has processed and their K and V rows
// in every layer's cache), saved after a run and restored before a later one, so that the later
// run continues exactly where the first stopped (`bluevm generate --kv-save/--kv-load`,
// bluevm_generate in the C API). Restoring is the host writing instance memory before the run;
// the request's start position (vm/llm_abi.h BLUE_REQ_START) tells the program where it goes on.
//
// File format (little-endian):
//   header, 64 bytes:
//      0  magic "BLUEKV\0\0"
//      8  u32 version (kKvSnapshotVersion)
//     12  u32 cache element type (DType: 0 F32, 1 F16)
//     16  u64 model hash (kvModelHash)
//     24  u32 caches (K and V of every layer: kcache.0, vcache.0, kcache.1, ...)
//     28  u32 elements of one position's row in a cache (KV heads x head size)
//     32  u32 context length of the run that saved it (information; a larger context loads it)
//     36  u32 tokens P (positions 0..P-1)
//     40  u64 payload bytes: 4 P + caches x P x row bytes
//     48  u32 CRC-32 of the payload
//     52  u32 0, u32 0 (reserved)
//     60  u32 CRC-32 of the 60 bytes before it
//   payload: P u32 token ids, then each cache's rows 0..P-1 in the cache's element type.
// Reading refuses, naming the file and what is wrong: a short file, bad magic, another version,
// a header or payload checksum that fails, a size that disagrees with the header, a snapshot of
// another model (hash), of another KV layout, or one longer than the context.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "compiler/gguf.h"
#include "vm/dtype.h"
#include "vm/status.h"

namespace blue {

inline constexpr uint32_t kKvSnapshotVersion = 1;
inline constexpr size_t kKvSnapshotHeaderBytes = 64;

// What a snapshot must match to be restored into a program.
struct KvLayout {
    uint64_t model_hash = 0;  // kvModelHash of the model's GGUF
    DType type = DType::F16;  // cache elements: F32 or F16
    uint32_t caches = 0;      // 2 x layers
    uint32_t row_elems = 0;   // elements per position per cache
    uint32_t ctx = 0;         // positions a cache holds
    uint64_t rowBytes() const { return uint64_t(row_elems) * (type == DType::F32 ? 4 : 2); }
};

struct KvSnapshot {
    KvLayout layout;
    std::vector<uint32_t> tokens;              // [P] ids at positions 0..P-1
    std::vector<std::vector<uint8_t>> caches;  // per cache: [P, row_elems] of layout.type
};

// The model's identity: FNV-1a 64 of its GGUF header (metadata, tensor names, types and shapes)
// and of the first 256 bytes of every tensor's data (another fine-tune of the same shape differs).
uint64_t kvModelHash(const GgufFile& g);

// The file's bytes. `s` must be consistent (caches x rows as its layout says).
std::vector<uint8_t> kvSnapshotEncode(const KvSnapshot& s);
// Parses a file's bytes; `name` starts every message. Checks the file itself, not the model.
Result<KvSnapshot> kvSnapshotDecode(std::span<const uint8_t> bytes, const std::string& name);
// Checks a decoded snapshot against the layout of the program it is to be restored into and
// the model's vocabulary; `name` starts every message.
Status kvSnapshotCheck(const KvSnapshot& s, const KvLayout& here, uint32_t n_vocab,
                       const std::string& name);

// Writes atomically (a temporary file renamed over `path`).
Status kvSnapshotWrite(const KvSnapshot& s, const std::string& path);
// Reads and decodes a file (kvSnapshotCheck is the caller's next step).
Result<KvSnapshot> kvSnapshotRead(const std::string& path);

}  // namespace blue
