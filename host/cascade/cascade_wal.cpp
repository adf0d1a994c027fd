// The durable-slots write-ahead log (see cascade_wal.h).
#include "host/cascade/cascade_wal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "vm/mapped_file.h"

namespace blue {

namespace {

constexpr char kMagic[8] = {'B', 'L', 'U', 'E', 'W', 'A', 'L', '\0'};
constexpr uint32_t kCheckpointType = 1, kFinalType = 2;

uint32_t crc(const uint8_t* p, size_t n) { return uint32_t(crc32(0L, p, uInt(n))); }

void putU32(std::vector<uint8_t>* out, uint32_t v) {
    for (int i = 0; i < 4; ++i) out->push_back(uint8_t(v >> (8 * i)));
}
void putU64(std::vector<uint8_t>* out, uint64_t v) {
    putU32(out, uint32_t(v));
    putU32(out, uint32_t(v >> 32));
}
uint32_t getU32(const uint8_t* p) { return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24; }
uint64_t getU64(const uint8_t* p) { return getU32(p) | uint64_t(getU32(p + 4)) << 32; }

// Reads a payload's words in order; every read past the end fails once, naming what was wanted.
struct Words {
    std::span<const uint32_t> w;
    size_t at = 0;
    bool short_ = false;
    uint32_t next() {
        if (at >= w.size()) { short_ = true; return 0; }
        return w[at++];
    }
};

Result<CascadeCheckpoint> decodeCheckpoint(Words& in, const CascadeInfo& info) {
    CascadeCheckpoint c;
    c.step = in.next();
    c.stage = in.next();
    c.runs = in.next();
    c.total = in.next();
    for (uint32_t d = 0; d < info.loops; ++d) c.loops.push_back(in.next());
    for (uint32_t& w : c.stats) w = in.next();
    c.slot = in.next();
    uint32_t len = in.next();
    if (in.short_) return Status::error("checkpoint payload ends early");
    if (len > in.w.size() - in.at) return BLUE_ERROR("checkpoint slot length %u runs past the payload", len);
    c.tokens.assign(in.w.begin() + ptrdiff_t(in.at), in.w.begin() + ptrdiff_t(in.at + len));
    in.at += len;
    if (in.at != in.w.size()) return BLUE_ERROR("checkpoint payload has %zu words left over", in.w.size() - in.at);
    if (Status s = checkCheckpoint(c, info); !s) return s.prefix("checkpoint");
    return c;
}

Result<CascadeResult> decodeFinal(Words& in, const CascadeInfo& info) {
    CascadeResult r;
    r.complete = true;
    for (const std::string& name : info.stages) {
        StageStats st;
        st.name = name;
        st.state = in.next();
        st.tokens = in.next();
        st.entropy_sum = std::bit_cast<float>(in.next());
        st.entropy_max = std::bit_cast<float>(in.next());
        st.logprob_sum = std::bit_cast<float>(in.next());
        st.cycles = in.next();
        st.runs = in.next();
        if (st.state > BLUE_CAS_STATE_NO_BUDGET) return BLUE_ERROR("final record: stage '%s' has unknown state %u", name.c_str(), st.state);
        r.generated += st.state == BLUE_CAS_STATE_RAN ? st.tokens : 0;
        r.stages.push_back(st);
    }
    for (size_t k = 0; k < info.slots.size(); ++k) {
        uint32_t len = in.next();
        if (in.short_) return Status::error("final record ends early");
        if (len > info.slot_capacity[k] || len > in.w.size() - in.at) {
            return BLUE_ERROR("final record: slot '%s' length %u is more than its capacity or the payload holds", info.slots[k].c_str(), len);
        }
        r.slots.emplace_back();
        for (uint32_t i = 0; i < len; ++i) r.slots.back().push_back(int32_t(in.next()));
    }
    if (in.short_) return Status::error("final record ends early");
    if (in.at != in.w.size()) return BLUE_ERROR("final record has %zu words left over", in.w.size() - in.at);
    return r;
}

Status checkHeader(std::span<const uint8_t> b, const std::string& name, const WalIdentity& want) {
    auto at = [&](size_t offset, const std::string& what) {
        return Status::error(strFormat("%s: byte %zu: ", name.c_str(), offset) + what);
    };
    if (b.empty()) return at(0, "empty file (no header)");
    if (std::memcmp(b.data(), kMagic, std::min(b.size(), sizeof kMagic)) != 0) return at(0, "not a BlueVM write-ahead log (no BLUEWAL magic)");
    if (b.size() < kWalHeaderBytes) return at(b.size(), strFormat("truncated header (%zu of %zu bytes)", b.size(), kWalHeaderBytes));
    if (getU32(&b[36]) != crc(b.data(), 36)) return at(36, "header checksum mismatch (the header is corrupt)");
    if (uint32_t v = getU32(&b[8]); v != kWalVersion) return at(8, strFormat("format version %u, this bluevm reads %u", v, kWalVersion));
    const char* engines[] = {"the GPU", "the reference interpreter"};
    uint32_t engine = getU32(&b[12]);
    if (engine > 1) return at(12, strFormat("unknown engine %u", engine));
    if (engine != want.engine) {
        return at(12, strFormat("written by a run on %s; this run uses %s (runs on different engines may sample differently)",
                                engines[engine], engines[want.engine]));
    }
    if (uint64_t h = getU64(&b[16]); h != want.module_hash) {
        return at(16, strFormat("written for another module (hash %016llx; this one's is %016llx, models included)",
                                (unsigned long long)h, (unsigned long long)want.module_hash));
    }
    if (uint64_t h = getU64(&b[24]); h != want.task_hash) {
        return at(24, strFormat("written for another task (hash %016llx; this task's is %016llx)", (unsigned long long)h,
                                (unsigned long long)want.task_hash));
    }
    if (uint32_t s = getU32(&b[32]); s != want.seed) return at(32, strFormat("written for seed %u; this run's seed is %u", s, want.seed));
    return Status::ok();
}

}  // namespace

uint64_t walHash(std::span<const uint8_t> bytes) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint8_t c : bytes) h = (h ^ c) * 0x100000001b3ull;
    return h;
}

WalIdentity walIdentity(const CascadeRunner& runner, const CascadeTask& task, bool reference) {
    WalIdentity id;
    id.engine = reference ? 1 : 0;
    id.module_hash = walHash(serializeModule(runner.module()));
    id.task_hash = walHash({reinterpret_cast<const uint8_t*>(task.text.data()), task.text.size()});
    id.seed = task.seed;
    return id;
}

std::vector<uint32_t> walCheckpointPayload(const CascadeCheckpoint& c) {
    std::vector<uint32_t> p = {kCheckpointType, c.step, c.stage, c.runs, c.total};
    p.insert(p.end(), c.loops.begin(), c.loops.end());
    p.insert(p.end(), c.stats.begin(), c.stats.end());
    p.push_back(c.slot);
    p.push_back(uint32_t(c.tokens.size()));
    p.insert(p.end(), c.tokens.begin(), c.tokens.end());
    return p;
}

std::vector<uint32_t> walFinalPayload(const CascadeResult& r) {
    std::vector<uint32_t> p = {kFinalType};
    for (const StageStats& st : r.stages) {
        for (uint32_t w : {st.state, st.tokens, std::bit_cast<uint32_t>(st.entropy_sum), std::bit_cast<uint32_t>(st.entropy_max),
                           std::bit_cast<uint32_t>(st.logprob_sum), st.cycles, st.runs}) {
            p.push_back(w);
        }
    }
    for (const auto& slot : r.slots) {
        p.push_back(uint32_t(slot.size()));
        p.insert(p.end(), slot.begin(), slot.end());
    }
    return p;
}

std::vector<uint8_t> walHeader(const WalIdentity& id) {
    std::vector<uint8_t> h(kMagic, kMagic + sizeof kMagic);
    putU32(&h, kWalVersion);
    putU32(&h, id.engine);
    putU64(&h, id.module_hash);
    putU64(&h, id.task_hash);
    putU32(&h, id.seed);
    putU32(&h, crc(h.data(), h.size()));
    return h;
}

std::vector<uint8_t> walRecord(std::span<const uint32_t> payload) {
    std::vector<uint8_t> r;
    r.reserve(kWalRecordHeaderBytes + payload.size() * 4);
    putU32(&r, uint32_t(payload.size() * 4));
    size_t crc_at = r.size();
    putU32(&r, 0);
    putU32(&r, 0);
    for (uint32_t w : payload) putU32(&r, w);
    uint32_t c = crc(r.data() + kWalRecordHeaderBytes, payload.size() * 4);
    for (int i = 0; i < 4; ++i) r[crc_at + size_t(i)] = uint8_t(c >> (8 * i));
    uint32_t hc = crc(r.data(), 8);
    for (int i = 0; i < 4; ++i) r[8 + size_t(i)] = uint8_t(hc >> (8 * i));
    return r;
}

Result<WalContents> walParse(std::span<const uint8_t> b, const std::string& name, const WalIdentity& expect,
                             const CascadeInfo& info) {
    BLUE_TRY(checkHeader(b, name, expect));
    WalContents out;
    size_t at = kWalHeaderBytes;
    auto fail = [&](size_t offset, const std::string& what) {
        return Status::error(strFormat("%s: byte %zu: ", name.c_str(), offset) + what);
    };
    uint32_t runs = 0, total = 0;
    for (size_t index = 0; at < b.size(); ++index) {
        if (out.final) return fail(at, "data after the final record");
        size_t left = b.size() - at;
        if (left < kWalRecordHeaderBytes) {
            out.torn = strFormat("%s: byte %zu: the last record is torn (%zu of its %zu header bytes); dropped", name.c_str(), at,
                                 left, kWalRecordHeaderBytes);
            break;
        }
        uint32_t len = getU32(&b[at]), payload_crc = getU32(&b[at + 4]);
        if (getU32(&b[at + 8]) != crc(&b[at], 8)) return fail(at, strFormat("record %zu: header checksum mismatch", index));
        if (len % 4 || len < 4 || len > kWalMaxPayload) return fail(at, strFormat("record %zu: bad payload length %u", index, len));
        if (len > left - kWalRecordHeaderBytes) {
            out.torn = strFormat("%s: byte %zu: the last record is torn (%zu of its %u payload bytes); dropped", name.c_str(), at,
                                 left - kWalRecordHeaderBytes, len);
            break;
        }
        const uint8_t* p = &b[at + kWalRecordHeaderBytes];
        if (crc(p, len) != payload_crc) return fail(at, strFormat("record %zu: payload checksum mismatch", index));
        std::vector<uint32_t> words(len / 4);
        for (size_t i = 0; i < words.size(); ++i) words[i] = getU32(p + 4 * i);
        Words in{std::span<const uint32_t>(words).subspan(1)};
        if (words[0] == kCheckpointType) {
            auto c = decodeCheckpoint(in, info);
            if (!c) return fail(at, strFormat("record %zu: ", index) + c.message());
            if (c->runs < runs || c->total < total) return fail(at, strFormat("record %zu: its counters go backwards", index));
            runs = c->runs;
            total = c->total;
            out.checkpoints.push_back(std::move(c.value()));
        } else if (words[0] == kFinalType) {
            auto r = decodeFinal(in, info);
            if (!r) return fail(at, strFormat("record %zu: ", index) + r.message());
            out.final = std::move(r.value());
        } else {
            return fail(at, strFormat("record %zu: unknown record type %u", index, words[0]));
        }
        at += kWalRecordHeaderBytes + len;
    }
    out.valid_bytes = at;
    return out;
}

Result<WalContents> walRead(const std::string& path, const WalIdentity& expect, const CascadeInfo& info) {
    std::error_code ec;
    if (std::filesystem::file_size(path, ec) == 0 && !ec) return walParse({}, path, expect, info);
    auto f = MappedFile::open(path);
    if (!f) return f.status();
    return walParse(f->bytes(), path, expect, info);
}

// ---- writer ----------------------------------------------------------------------------------

namespace {

Status writeAll(int fd, std::span<const uint8_t> bytes, const std::string& path) {
    size_t done = 0;
    while (done < bytes.size()) {
        ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return BLUE_ERROR("%s: write failed: %s", path.c_str(), std::strerror(errno));
        done += size_t(n);
    }
    if (::fsync(fd) != 0) return BLUE_ERROR("%s: fsync failed: %s", path.c_str(), std::strerror(errno));
    return Status::ok();
}

void syncDir(const std::string& path) {
    std::filesystem::path dir = std::filesystem::path(path).parent_path();
    int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        ::fsync(fd);
        ::close(fd);
    }
}

}  // namespace

WalWriter& WalWriter::operator=(WalWriter&& o) noexcept {
    if (this != &o) {
        if (fd_ >= 0) ::close(fd_);
        path_ = std::move(o.path_);
        fd_ = o.fd_;
        o.fd_ = -1;
    }
    return *this;
}

WalWriter::~WalWriter() {
    if (fd_ >= 0) ::close(fd_);
}

namespace {

Status lockLog(int fd, const std::string& path) {
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return Status::ok();
    if (errno == EWOULDBLOCK) return BLUE_ERROR("%s: the log is in use by another process", path.c_str());
    return BLUE_ERROR("%s: cannot lock: %s", path.c_str(), std::strerror(errno));
}

}  // namespace

Result<WalWriter> WalWriter::create(const std::string& path, const WalIdentity& id) {
    std::string tmp = path + ".tmp." + std::to_string(::getpid());
    int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return BLUE_ERROR("%s: cannot create: %s", tmp.c_str(), std::strerror(errno));
    WalWriter w;
    w.path_ = path;
    w.fd_ = fd;
    Status s = lockLog(fd, tmp);
    if (s) s = writeAll(fd, walHeader(id), tmp);
    if (s && ::link(tmp.c_str(), path.c_str()) != 0) {
        s = errno == EEXIST ? BLUE_ERROR("%s: the log appeared while this run started; another process is using it", path.c_str())
                            : BLUE_ERROR("%s: cannot create: %s", path.c_str(), std::strerror(errno));
    }
    ::unlink(tmp.c_str());
    if (!s) return s;
    syncDir(path);
    return w;
}

Result<WalWriter> WalWriter::open(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return BLUE_ERROR("%s: cannot open: %s", path.c_str(), std::strerror(errno));
    WalWriter w;
    w.path_ = path;
    w.fd_ = fd;
    BLUE_TRY(lockLog(fd, path));
    return w;
}

Result<std::vector<uint8_t>> WalWriter::contents() const {
    struct stat st;
    if (::fstat(fd_, &st) != 0) return BLUE_ERROR("%s: cannot stat: %s", path_.c_str(), std::strerror(errno));
    std::vector<uint8_t> bytes(size_t(st.st_size));
    size_t done = 0;
    while (done < bytes.size()) {
        ssize_t n = ::pread(fd_, bytes.data() + done, bytes.size() - done, off_t(done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return BLUE_ERROR("%s: cannot read: %s", path_.c_str(), n < 0 ? std::strerror(errno) : "the file shrank");
        done += size_t(n);
    }
    return bytes;
}

Status WalWriter::cut(uint64_t valid_bytes) {
    if (::ftruncate(fd_, off_t(valid_bytes)) != 0 || ::lseek(fd_, off_t(valid_bytes), SEEK_SET) < 0) {
        return BLUE_ERROR("%s: cannot cut the log at byte %llu: %s", path_.c_str(), (unsigned long long)valid_bytes,
                          std::strerror(errno));
    }
    return Status::ok();
}

Status WalWriter::append(std::span<const uint32_t> payload) {
    return writeAll(fd_, walRecord(payload), path_);
}

}  // namespace blue
