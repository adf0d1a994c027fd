// KV snapshot files (see kv_snapshot.h).
#include "host/memory/kv_snapshot.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace blue {

namespace {

constexpr char kMagic[8] = {'B', 'L', 'U', 'E', 'K', 'V', 0, 0};
// Bounds that keep every size product far from overflow; real models are well inside them.
constexpr uint32_t kMaxTokens = 1u << 24, kMaxCaches = 1u << 16, kMaxRowElems = 1u << 20;

uint32_t crc(const uint8_t* p, size_t n) {
    uLong c = crc32(0L, Z_NULL, 0);
    while (n > 0) {  // crc32 takes uInt lengths
        uInt step = uInt(std::min<size_t>(n, 1u << 30));
        c = crc32(c, p, step);
        p += step;
        n -= step;
    }
    return uint32_t(c);
}

uint64_t fnv(uint64_t h, std::span<const uint8_t> bytes) {
    for (uint8_t b : bytes) h = (h ^ b) * 0x100000001b3ull;
    return h;
}

void put32(std::vector<uint8_t>& out, size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) out[at + i] = uint8_t(v >> (8 * i));
}
void put64(std::vector<uint8_t>& out, size_t at, uint64_t v) {
    for (int i = 0; i < 8; ++i) out[at + i] = uint8_t(v >> (8 * i));
}
uint32_t get32(const uint8_t* p) {
    return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
uint64_t get64(const uint8_t* p) {
    return uint64_t(get32(p)) | uint64_t(get32(p + 4)) << 32;
}

uint64_t payloadBytes(const KvLayout& l, uint64_t tokens) {
    return 4 * tokens + uint64_t(l.caches) * tokens * l.rowBytes();
}

std::string typeName(DType t) {
    return std::string(dtypeName(t));
}

}  // namespace

uint64_t kvModelHash(const GgufFile& g) {
    uint64_t h = 0xcbf29ce484222325ull;
    std::span<const uint8_t> all = g.bytes();
    h = fnv(h, all.subspan(0, std::min<uint64_t>(g.dataOffset(), all.size())));
    for (const GgufTensor& t : g.tensors()) {
        std::span<const uint8_t> data = g.rawTensorData(t);
        h = fnv(h, data.subspan(0, std::min<size_t>(data.size(), 256)));
    }
    return h;
}

std::vector<uint8_t> kvSnapshotEncode(const KvSnapshot& s) {
    const KvLayout& l = s.layout;
    const uint64_t n = s.tokens.size(), payload = payloadBytes(l, n);
    std::vector<uint8_t> out(kKvSnapshotHeaderBytes + payload, 0);
    std::memcpy(out.data(), kMagic, 8);
    put32(out, 8, kKvSnapshotVersion);
    put32(out, 12, uint32_t(l.type));
    put64(out, 16, l.model_hash);
    put32(out, 24, l.caches);
    put32(out, 28, l.row_elems);
    put32(out, 32, l.ctx);
    put32(out, 36, uint32_t(n));
    put64(out, 40, payload);
    uint8_t* p = out.data() + kKvSnapshotHeaderBytes;
    for (uint32_t t : s.tokens) {
        for (int i = 0; i < 4; ++i) *p++ = uint8_t(t >> (8 * i));
    }
    const uint64_t cache_bytes = n * l.rowBytes();
    for (const std::vector<uint8_t>& c : s.caches) {
        std::memcpy(p, c.data(), std::min<uint64_t>(c.size(), cache_bytes));
        p += cache_bytes;
    }
    put32(out, 48, crc(out.data() + kKvSnapshotHeaderBytes, payload));
    put32(out, 60, crc(out.data(), 60));
    return out;
}

Result<KvSnapshot> kvSnapshotDecode(std::span<const uint8_t> bytes, const std::string& name) {
    const char* f = name.c_str();
    if (bytes.size() < kKvSnapshotHeaderBytes) {
        return BLUE_ERROR("%s: truncated: %zu bytes, shorter than the %zu-byte snapshot header", f,
                          bytes.size(), kKvSnapshotHeaderBytes);
    }
    const uint8_t* h = bytes.data();
    if (std::memcmp(h, kMagic, 8) != 0)
        return BLUE_ERROR("%s: not a BlueVM KV snapshot (bad magic)", f);
    const uint32_t version = get32(h + 8);
    if (version != kKvSnapshotVersion) {
        return BLUE_ERROR("%s: snapshot format version %u; this build reads version %u", f, version,
                          kKvSnapshotVersion);
    }
    if (get32(h + 60) != crc(h, 60))
        return BLUE_ERROR("%s: byte 60: header checksum mismatch (the file is corrupt)", f);
    KvSnapshot s;
    KvLayout& l = s.layout;
    const uint32_t type = get32(h + 12);
    l.type = DType(type);
    l.model_hash = get64(h + 16);
    l.caches = get32(h + 24);
    l.row_elems = get32(h + 28);
    l.ctx = get32(h + 32);
    const uint32_t n = get32(h + 36);
    if (l.type != DType::F32 && l.type != DType::F16)
        return BLUE_ERROR("%s: byte 12: cache type %u is not F32 or F16", f, type);
    if (l.caches == 0 || l.caches > kMaxCaches || l.row_elems == 0 || l.row_elems > kMaxRowElems ||
        n > kMaxTokens) {
        return BLUE_ERROR("%s: bad header: %u caches of %u-element rows, %u tokens", f, l.caches,
                          l.row_elems, n);
    }
    const uint64_t payload = payloadBytes(l, n);
    if (get64(h + 40) != payload) {
        return BLUE_ERROR("%s: byte 40: payload size %llu disagrees with the header's shape (%llu)",
                          f, (unsigned long long)get64(h + 40), (unsigned long long)payload);
    }
    const uint64_t want = kKvSnapshotHeaderBytes + payload;
    if (bytes.size() < want) {
        return BLUE_ERROR("%s: truncated: %zu bytes, the header announces %llu", f, bytes.size(),
                          (unsigned long long)want);
    }
    if (bytes.size() > want) {
        return BLUE_ERROR("%s: %llu unexpected bytes after the snapshot's end (byte %llu)", f,
                          (unsigned long long)(bytes.size() - want), (unsigned long long)want);
    }
    const uint8_t* p = h + kKvSnapshotHeaderBytes;
    if (get32(h + 48) != crc(p, payload)) {
        return BLUE_ERROR("%s: byte 64: payload checksum mismatch (the file is corrupt)", f);
    }
    s.tokens.resize(n);
    for (uint32_t i = 0; i < n; ++i, p += 4) s.tokens[i] = get32(p);
    const uint64_t cache_bytes = uint64_t(n) * l.rowBytes();
    s.caches.resize(l.caches);
    for (std::vector<uint8_t>& c : s.caches) {
        c.assign(p, p + cache_bytes);
        p += cache_bytes;
    }
    return s;
}

Status kvSnapshotCheck(const KvSnapshot& s, const KvLayout& here, uint32_t n_vocab,
                       const std::string& name) {
    const char* f = name.c_str();
    const KvLayout& l = s.layout;
    if (l.model_hash != here.model_hash) {
        return BLUE_ERROR(
            "%s: saved with another model (model hash %016llx; this model's is %016llx)", f,
            (unsigned long long)l.model_hash, (unsigned long long)here.model_hash);
    }
    if (l.caches != here.caches || l.row_elems != here.row_elems) {
        return BLUE_ERROR(
            "%s: KV layout differs: the snapshot has %u caches of %u-element rows, this program %u "
            "of %u",
            f, l.caches, l.row_elems, here.caches, here.row_elems);
    }
    if (l.type != here.type) {
        return BLUE_ERROR("%s: KV cache type differs: the snapshot holds %s rows, this program %s",
                          f, typeName(l.type).c_str(), typeName(here.type).c_str());
    }
    if (s.caches.size() != l.caches)
        return BLUE_ERROR("%s: %zu caches, the layout says %u", f, s.caches.size(), l.caches);
    for (const std::vector<uint8_t>& c : s.caches) {
        if (c.size() != s.tokens.size() * l.rowBytes())
            return BLUE_ERROR("%s: a cache's rows do not match its tokens", f);
    }
    if (s.tokens.empty()) return BLUE_ERROR("%s: the snapshot holds no tokens", f);
    if (s.tokens.size() >= here.ctx) {
        return BLUE_ERROR(
            "%s: the snapshot holds %zu tokens; this context holds %u (use a larger --ctx)", f,
            s.tokens.size(), here.ctx);
    }
    for (size_t i = 0; i < s.tokens.size(); ++i) {
        if (s.tokens[i] >= n_vocab) {
            return BLUE_ERROR("%s: token %u at position %zu is outside the vocabulary (%u)", f,
                              s.tokens[i], i, n_vocab);
        }
    }
    return Status::ok();
}

Status kvSnapshotWrite(const KvSnapshot& s, const std::string& path) {
    std::vector<uint8_t> bytes = kvSnapshotEncode(s);
    const std::string tmp = path + ".tmp";
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        if (!out) return BLUE_ERROR("%s: cannot write (%s)", tmp.c_str(), std::strerror(errno));
        out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
        out.flush();
        if (!out) {
            std::remove(tmp.c_str());
            return BLUE_ERROR("%s: write failed (%s)", tmp.c_str(), std::strerror(errno));
        }
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) {
        std::remove(tmp.c_str());
        return BLUE_ERROR("%s: cannot write (%s)", path.c_str(), ec.message().c_str());
    }
    return Status::ok();
}

Result<KvSnapshot> kvSnapshotRead(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in)
        return BLUE_ERROR("%s: cannot open KV snapshot (%s)", path.c_str(), std::strerror(errno));
    // The header first: a file that is not a snapshot (a model passed by mistake) is refused
    // without reading it whole.
    std::vector<uint8_t> bytes(kKvSnapshotHeaderBytes);
    in.read(reinterpret_cast<char*>(bytes.data()), std::streamsize(bytes.size()));
    bytes.resize(size_t(in.gcount()));
    if (bytes.size() == kKvSnapshotHeaderBytes && std::memcmp(bytes.data(), kMagic, 8) == 0) {
        bytes.insert(bytes.end(), std::istreambuf_iterator<char>(in),
                     std::istreambuf_iterator<char>());
    }
    if (in.bad()) return BLUE_ERROR("%s: read failed", path.c_str());
    return kvSnapshotDecode(bytes, path);
}

}  // namespace blue
