// The GGUF reader: maps or takes the file's bytes, then checks every field against the bytes that
// remain before reading it. Counts are bounded by what the remaining bytes could hold before any
// allocation; no offset or size from the file is used unchecked.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstring>
#include <limits>

#include "compiler/gguf.h"

namespace blue {

struct GgufFile::Storage {
    std::vector<uint8_t> owned;
    void* map = nullptr;
    size_t map_size = 0;

    Storage() = default;
    Storage(const Storage&) = delete;
    Storage& operator=(const Storage&) = delete;
    ~Storage() {
        if (map) munmap(map, map_size);
    }
    const uint8_t* data() const { return map ? static_cast<const uint8_t*>(map) : owned.data(); }
    uint64_t size() const { return map ? map_size : owned.size(); }
};

namespace {

constexpr uint64_t kHeaderBytes = 24;        // magic, version, n_tensors, n_kv
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;  // empty key, type id, one-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;  // 1-char name, n_dims, one dim

// Reads little-endian fields from a byte range, refusing to read past its end.
class Cursor {
  public:
    Cursor(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}

    uint64_t pos() const { return pos_; }
    uint64_t left() const { return size_ - pos_; }
    const uint8_t* here() const { return data_ + pos_; }
    void skip(uint64_t n) {
        assert(n <= left());
        pos_ += n;
    }

    Status need(uint64_t n, const char* what) const {
        if (n <= left()) return {};
        return BLUE_ERROR("%s at 0x%" PRIx64 " needs %" PRIu64 " bytes, only %" PRIu64
                          " remain before end of file",
                          what, pos_, n, left());
    }

    template <class T>
    Status read(T& out, const char* what) {
        BLUE_TRY(need(sizeof(T), what));
        std::memcpy(&out, here(), sizeof(T));
        pos_ += sizeof(T);
        return {};
    }

    Status readString(std::string_view& out, const char* what) {
        uint64_t start = pos_;
        uint64_t len = 0;
        BLUE_TRY(read(len, what));
        if (len > left()) {
            return BLUE_ERROR("%s at 0x%" PRIx64 ": string length %" PRIu64
                              " runs past end of file (%" PRIu64 " bytes left)",
                              what, start, len, left());
        }
        out = std::string_view(reinterpret_cast<const char*>(here()), len);
        pos_ += len;
        return {};
    }

  private:
    const uint8_t* data_;
    uint64_t size_;
    uint64_t pos_ = 0;
};

bool knownValueType(uint32_t t) {
    return t <= uint32_t(GgufType::F64);
}

// Least bytes one array element of type t can occupy.
uint64_t minElementBytes(GgufType t) {
    if (uint64_t n = ggufScalarSize(t)) return n;
    return t == GgufType::String ? 8 : 12;
}

std::string shapeText(const GgufTensor& t) {
    std::string s = "[";
    for (uint32_t d = 0; d < t.n_dims; ++d) s += strFormat(d ? ", %" PRId64 : "%" PRId64, t.ne[d]);
    return s + "]";
}

}  // namespace

// Fills a GgufFile from its bytes; see the file comment of gguf.h for the layout.
class GgufParser {
  public:
    explicit GgufParser(GgufFile& f) : f_(f), c_(f.storage_->data(), f.storage_->size()) {}

    // Parses the bytes `f` holds (a buffer or, when `map` is not null, a mapping it takes over).
    static Result<GgufFile> run(std::string name, std::vector<uint8_t> bytes, void* map,
                                size_t map_size) {
        GgufFile f;
        f.name_ = std::move(name);
        f.storage_->owned = std::move(bytes);
        f.storage_->map = map;
        f.storage_->map_size = map_size;
        Status s = GgufParser(f).parse();
        if (!s) return s.prefix(f.name_);
        return f;
    }

  private:
    Status parse() {
        uint64_t n_tensors = 0, n_kv = 0;
        BLUE_TRY(parseHeader(n_tensors, n_kv));
        BLUE_TRY(parseKvs(n_kv));
        BLUE_TRY(readAlignment());
        BLUE_TRY(parseTensorInfos(n_tensors));
        return placeTensors();
    }

    Status parseHeader(uint64_t& n_tensors, uint64_t& n_kv);
    Status parseKvs(uint64_t n_kv);
    Status parseValue(GgufType type, uint32_t depth, GgufValue& out);
    Status parseArrayHeader(uint32_t depth, GgufType& elem, uint64_t& count);
    Status skipElements(GgufType elem, uint64_t count, uint32_t depth);
    Status readAlignment();
    Status parseTensorInfos(uint64_t n_tensors);
    Status parseTensorInfo(uint32_t index, GgufTensor& t);
    Status parseTensorShape(GgufTensor& t);
    Status placeTensors();

    GgufFile& f_;
    Cursor c_;
    std::vector<uint64_t> rel_offsets_;  // per tensor, as stored (relative to the data section)
};

Status GgufParser::parseHeader(uint64_t& n_tensors, uint64_t& n_kv) {
    uint64_t size = c_.left();
    if (size < 4) {
        return BLUE_ERROR("truncated header: file is %" PRIu64
                          " bytes, a GGUF header needs %" PRIu64,
                          size, kHeaderBytes);
    }
    if (std::memcmp(c_.here(), "GGUF", 4) != 0) {
        std::string_view magic(reinterpret_cast<const char*>(c_.here()), 4);
        return BLUE_ERROR("bad magic '%s' at 0x0 (expected 'GGUF'): not a GGUF file",
                          ggufPrintable(magic).c_str());
    }
    c_.skip(4);
    uint32_t version = 0;
    BLUE_TRY(c_.read(version, "truncated header: version"));
    if (version == 1) return BLUE_ERROR("GGUF version 1 is not supported (only versions 2 and 3)");
    if (version != 2 && version != 3) {
        return BLUE_ERROR("unsupported GGUF version %u (only versions 2 and 3)%s", version,
                          (version & 0xffff) == 0 ? "; is the file big-endian?" : "");
    }
    f_.version_ = version;
    BLUE_TRY(c_.read(n_tensors, "truncated header: tensor count"));
    BLUE_TRY(c_.read(n_kv, "truncated header: KV count"));
    uint64_t left = c_.left();
    if (n_kv > left / kMinKvBytes) {
        return BLUE_ERROR("KV count %" PRIu64 " at 0x10 cannot fit in the %" PRIu64
                          " bytes after the header",
                          n_kv, left);
    }
    if (n_tensors > (left - n_kv * kMinKvBytes) / kMinTensorInfoBytes) {
        return BLUE_ERROR("tensor count %" PRIu64 " at 0x8 cannot fit in the %" PRIu64
                          " bytes after the header",
                          n_tensors, left);
    }
    return {};
}

Status GgufParser::parseKvs(uint64_t n_kv) {
    f_.kvs_.reserve(n_kv);
    for (uint64_t i = 0; i < n_kv; ++i) {
        GgufKv kv;
        kv.offset = c_.pos();
        std::string what = strFormat("key of KV #%" PRIu64, i);
        BLUE_TRY(c_.readString(kv.key, what.c_str()));
        std::string ctx = strFormat("key '%s' (KV #%" PRIu64 " at 0x%" PRIx64 ")",
                                    ggufPrintable(kv.key).c_str(), i, kv.offset);
        auto [it, fresh] = f_.kv_index_.emplace(kv.key, f_.kvs_.size());
        if (!fresh)
            return BLUE_ERROR("duplicate %s: first defined by KV #%zu", ctx.c_str(), it->second);
        uint32_t type = 0;
        Status s = c_.read(type, "value type");
        if (s) s = parseValue(GgufType(type), 0, kv.value);
        if (!s) return s.prefix(ctx);
        f_.kvs_.push_back(kv);
    }
    return {};
}

Status GgufParser::parseValue(GgufType type, uint32_t depth, GgufValue& out) {
    out.type_ = type;
    out.offset_ = c_.pos();
    out.encoded_ = c_.here();
    if (uint64_t n = ggufScalarSize(type)) {
        BLUE_TRY(c_.need(n, "value"));
        out.data_ = c_.here();
        out.size_ = n;
        c_.skip(n);
    } else if (type == GgufType::String) {
        std::string_view s;
        BLUE_TRY(c_.readString(s, "string value"));
        out.data_ = reinterpret_cast<const uint8_t*>(s.data());
        out.size_ = s.size();
    } else if (type == GgufType::Array) {
        BLUE_TRY(parseArrayHeader(depth, out.elem_type_, out.count_));
        out.data_ = c_.here();
        uint64_t start = c_.pos();
        BLUE_TRY(skipElements(out.elem_type_, out.count_, depth + 1));
        out.size_ = c_.pos() - start;
    } else {
        return BLUE_ERROR("unknown value type %u at 0x%" PRIx64, uint32_t(type), c_.pos() - 4);
    }
    out.encoded_size_ = c_.pos() - out.offset_;
    return {};
}

Status GgufParser::parseArrayHeader(uint32_t depth, GgufType& elem, uint64_t& count) {
    uint64_t at = c_.pos();
    uint32_t elem_id = 0;
    BLUE_TRY(c_.read(elem_id, "array element type"));
    BLUE_TRY(c_.read(count, "array count"));
    if (!knownValueType(elem_id)) {
        return BLUE_ERROR("array at 0x%" PRIx64 ": unknown element type %u", at, elem_id);
    }
    elem = GgufType(elem_id);
    if (elem == GgufType::Array && depth + 1 >= kGgufMaxArrayDepth) {
        return BLUE_ERROR("array at 0x%" PRIx64 ": arrays nested deeper than %u levels", at,
                          kGgufMaxArrayDepth);
    }
    uint64_t min_bytes = minElementBytes(elem);
    if (count > c_.left() / min_bytes) {
        return BLUE_ERROR("array at 0x%" PRIx64 ": count %" PRIu64
                          " of %s elements (at least %" PRIu64
                          " bytes each) cannot fit in the %" PRIu64 " bytes left",
                          at, count, ggufTypeName(elem).data(), min_bytes, c_.left());
    }
    return {};
}

Status GgufParser::skipElements(GgufType elem, uint64_t count, uint32_t depth) {
    if (uint64_t n = ggufScalarSize(elem)) {
        c_.skip(n * count);  // parseArrayHeader checked that count elements fit
        return {};
    }
    for (uint64_t i = 0; i < count; ++i) {
        Status s;
        if (elem == GgufType::String) {
            std::string_view unused;
            s = c_.readString(unused, "array string");
        } else {
            GgufType inner;
            uint64_t inner_count = 0;
            s = parseArrayHeader(depth, inner, inner_count);
            if (s) s = skipElements(inner, inner_count, depth + 1);
        }
        if (!s) return s.prefix(strFormat("element %" PRIu64, i));
    }
    return {};
}

Status GgufParser::readAlignment() {
    const GgufValue* v = f_.find("general.alignment");
    if (!v) return {};
    Result<uint64_t> a = v->toU64();
    if (!a) return Status(a.status()).prefix("general.alignment");
    if (*a == 0 || (*a & (*a - 1)) != 0 || *a > (uint64_t(1) << 30)) {
        return BLUE_ERROR("general.alignment %" PRIu64 " is not a power of two in [1, 2^30]", *a);
    }
    f_.alignment_ = uint32_t(*a);
    return {};
}

Status GgufParser::parseTensorInfos(uint64_t n_tensors) {
    f_.tensors_.reserve(n_tensors);
    rel_offsets_.reserve(n_tensors);
    for (uint64_t i = 0; i < n_tensors; ++i) {
        GgufTensor t;
        BLUE_TRY(parseTensorInfo(uint32_t(i), t));
        f_.tensors_.push_back(t);
    }
    return {};
}

Status GgufParser::parseTensorInfo(uint32_t index, GgufTensor& t) {
    t.index = index;
    t.info_offset = c_.pos();
    std::string what = strFormat("name of tensor #%u", index);
    BLUE_TRY(c_.readString(t.name, what.c_str()));
    if (t.name.empty())
        return BLUE_ERROR("tensor #%u at 0x%" PRIx64 ": empty name", index, t.info_offset);
    std::string ctx = strFormat("tensor '%s' (#%u)", ggufPrintable(t.name).c_str(), index);
    auto [it, fresh] = f_.tensor_index_.emplace(t.name, index);
    if (!fresh) {
        return BLUE_ERROR("duplicate tensor name '%s' (#%u at 0x%" PRIx64 "; first is #%zu)",
                          ggufPrintable(t.name).c_str(), index, t.info_offset, it->second);
    }
    Status s = parseTensorShape(t);
    uint64_t rel = 0;
    if (s) s = c_.read(rel, "data offset");
    if (!s) return s.prefix(ctx);
    rel_offsets_.push_back(rel);
    return {};
}

Status GgufParser::parseTensorShape(GgufTensor& t) {
    uint64_t at = c_.pos();
    BLUE_TRY(c_.read(t.n_dims, "n_dims"));
    if (t.n_dims == 0 || t.n_dims > kGgufMaxDims) {
        return BLUE_ERROR("n_dims %u at 0x%" PRIx64 " (expected 1..%u)", t.n_dims, at,
                          kGgufMaxDims);
    }
    t.n_elements = 1;
    for (uint32_t d = 0; d < t.n_dims; ++d) {
        uint64_t dim = 0;
        at = c_.pos();
        BLUE_TRY(c_.read(dim, "dimension"));
        if (dim == 0 || dim > uint64_t(std::numeric_limits<int64_t>::max())) {
            return BLUE_ERROR("dimension %u at 0x%" PRIx64 " is %" PRIu64 " (must be in [1, 2^63))",
                              d, at, dim);
        }
        t.ne[d] = int64_t(dim);
        if (__builtin_mul_overflow(t.n_elements, t.ne[d], &t.n_elements)) {
            return BLUE_ERROR("element count of dims ne[0..%u] overflows int64", d);
        }
    }
    at = c_.pos();
    uint32_t type_id = 0;
    BLUE_TRY(c_.read(type_id, "type id"));
    std::optional<DTypeInfo> info = dtypeInfo(type_id);
    if (!info) return BLUE_ERROR("unknown type id %u at 0x%" PRIx64, type_id, at);
    t.type = info->type;
    t.supported = info->supported;
    std::optional<uint64_t> row_bytes = dtypeRowBytes(t.type, uint64_t(t.ne[0]));
    if (!row_bytes) {
        return BLUE_ERROR("row length %" PRId64 " is not a whole number of %s blocks (%u elements)",
                          t.ne[0], info->name.data(), info->block_elems);
    }
    if (__builtin_mul_overflow(*row_bytes, uint64_t(t.rows()), &t.n_bytes)) {
        return BLUE_ERROR("byte size of shape %s overflows", shapeText(t).c_str());
    }
    return {};
}

Status GgufParser::placeTensors() {
    uint64_t align = f_.alignment_;
    uint64_t size = c_.pos() + c_.left();
    f_.data_offset_ = (c_.pos() + align - 1) / align * align;
    for (GgufTensor& t : f_.tensors_) {
        uint64_t rel = rel_offsets_[t.index];
        std::string ctx = strFormat("tensor '%s' (#%u)", ggufPrintable(t.name).c_str(), t.index);
        if (rel % align != 0) {
            return BLUE_ERROR("%s: data offset 0x%" PRIx64
                              " is not a multiple of the alignment (%" PRIu64 ")",
                              ctx.c_str(), rel, align);
        }
        uint64_t end = 0;
        if (__builtin_add_overflow(f_.data_offset_, rel, &t.offset) ||
            __builtin_add_overflow(t.offset, t.n_bytes, &end)) {
            return BLUE_ERROR("%s: data offset 0x%" PRIx64 " + %" PRIu64 " bytes overflows",
                              ctx.c_str(), rel, t.n_bytes);
        }
        if (end > size) {
            return BLUE_ERROR("%s: data [0x%" PRIx64 ", 0x%" PRIx64
                              ") runs past end of file (0x%" PRIx64 ")",
                              ctx.c_str(), t.offset, end, size);
        }
    }
    return {};
}

GgufFile::GgufFile() : storage_(std::make_unique<Storage>()) {}
GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

std::span<const uint8_t> GgufFile::bytes() const {
    if (!storage_) return {};
    return {storage_->data(), size_t(storage_->size())};
}

Result<GgufFile> ggufParse(std::vector<uint8_t> bytes, std::string name) {
    return GgufParser::run(std::move(name), std::move(bytes), nullptr, 0);
}

Result<GgufFile> ggufOpen(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return BLUE_ERROR("%s: cannot open: %s", path.c_str(), std::strerror(errno));
    struct stat st {};
    bool stat_ok = fstat(fd, &st) == 0;
    if (!stat_ok || !S_ISREG(st.st_mode)) {
        int err = stat_ok ? 0 : errno;
        ::close(fd);
        return BLUE_ERROR("%s: not a regular file%s%s", path.c_str(), err ? ": " : "",
                          err ? std::strerror(err) : "");
    }
    void* map = nullptr;
    if (st.st_size > 0) {
        map = mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int err = errno;
            ::close(fd);
            return BLUE_ERROR("%s: cannot map %lld bytes: %s", path.c_str(),
                              static_cast<long long>(st.st_size), std::strerror(err));
        }
    }
    ::close(fd);
    return GgufParser::run(path, {}, map, map ? size_t(st.st_size) : 0);
}

const GgufValue* GgufFile::find(std::string_view key) const {
    auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

const GgufTensor* GgufFile::findTensor(std::string_view name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::span<const uint8_t> GgufFile::rawTensorData(const GgufTensor& t) const {
    assert(t.index < tensors_.size() && tensors_[t.index].offset == t.offset);
    return bytes().subspan(t.offset, t.n_bytes);
}

Result<std::span<const uint8_t>> GgufFile::tensorData(const GgufTensor& t) const {
    if (!t.supported) {
        return BLUE_ERROR("%s: tensor '%s' (#%u) has type %s, which BlueVM does not support",
                          name_.c_str(), ggufPrintable(t.name).c_str(), t.index,
                          dtypeName(t.type).data());
    }
    return rawTensorData(t);
}

template <class T>
Result<T> GgufFile::getWith(std::string_view key, const T* fallback,
                            Result<T> (*convert)(const GgufValue&)) const {
    const GgufValue* v = find(key);
    if (!v) {
        if (fallback) return *fallback;
        return BLUE_ERROR("%s: missing key '%s'", name_.c_str(), std::string(key).c_str());
    }
    Result<T> r = convert(*v);
    if (!r) return Status(r.status()).prefix(name_ + ": key '" + std::string(key) + "'");
    return r;
}

namespace {
Result<uint32_t> asU32(const GgufValue& v) {
    return v.toU32();
}
Result<uint64_t> asU64(const GgufValue& v) {
    return v.toU64();
}
Result<int64_t> asI64(const GgufValue& v) {
    return v.toI64();
}
Result<bool> asBool(const GgufValue& v) {
    return v.toBool();
}
Result<std::string_view> asString(const GgufValue& v) {
    return v.toString();
}
Result<std::vector<std::string_view>> asStrings(const GgufValue& v) {
    return v.toStringArray();
}
Result<std::vector<float>> asF32s(const GgufValue& v) {
    return v.toF32Array();
}
Result<std::vector<int32_t>> asI32s(const GgufValue& v) {
    return v.toI32Array();
}
Result<float> asF32(const GgufValue& v) {
    Result<double> d = v.toF64();
    if (!d) return d.status();
    if (std::isfinite(*d) && std::fabs(*d) > double(std::numeric_limits<float>::max())) {
        return BLUE_ERROR("value %g does not fit f32", *d);
    }
    return float(*d);
}
}  // namespace

Result<uint32_t> GgufFile::getU32(std::string_view key) const {
    return getWith<uint32_t>(key, nullptr, asU32);
}
Result<uint32_t> GgufFile::getU32Or(std::string_view key, uint32_t fallback) const {
    return getWith(key, &fallback, asU32);
}
Result<uint64_t> GgufFile::getU64(std::string_view key) const {
    return getWith<uint64_t>(key, nullptr, asU64);
}
Result<int64_t> GgufFile::getI64(std::string_view key) const {
    return getWith<int64_t>(key, nullptr, asI64);
}
Result<float> GgufFile::getF32(std::string_view key) const {
    return getWith<float>(key, nullptr, asF32);
}
Result<float> GgufFile::getF32Or(std::string_view key, float fallback) const {
    return getWith(key, &fallback, asF32);
}
Result<bool> GgufFile::getBool(std::string_view key) const {
    return getWith<bool>(key, nullptr, asBool);
}
Result<bool> GgufFile::getBoolOr(std::string_view key, bool fallback) const {
    return getWith(key, &fallback, asBool);
}
Result<std::string_view> GgufFile::getString(std::string_view key) const {
    return getWith<std::string_view>(key, nullptr, asString);
}
Result<std::string_view> GgufFile::getStringOr(std::string_view key,
                                               std::string_view fallback) const {
    return getWith(key, &fallback, asString);
}
Result<std::vector<std::string_view>> GgufFile::getStringArray(std::string_view key) const {
    return getWith<std::vector<std::string_view>>(key, nullptr, asStrings);
}
Result<std::vector<float>> GgufFile::getF32Array(std::string_view key) const {
    return getWith<std::vector<float>>(key, nullptr, asF32s);
}
Result<std::vector<int32_t>> GgufFile::getI32Array(std::string_view key) const {
    return getWith<std::vector<int32_t>>(key, nullptr, asI32s);
}

}  // namespace blue
