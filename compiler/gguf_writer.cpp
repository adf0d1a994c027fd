// The GGUF writer: encodes metadata as it is set, lays tensors out at aligned offsets and streams
// their data (borrowed bytes or a fill callback, in chunks of whole rows) to a file or a buffer.
// The output matches llama.cpp's writer (gguf_write_to_file) byte for byte: v3, zero padding after
// the tensor infos (even with no tensors) and after every tensor's data, including the last.
#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "compiler/gguf.h"

namespace blue {

namespace {

constexpr uint64_t kFillChunkBytes = 4 << 20;  // rows per fill call: about this many bytes

void putBytes(std::vector<uint8_t>& out, const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
}

template <class T>
void put(std::vector<uint8_t>& out, T v) {
    putBytes(out, &v, sizeof(T));
}

void putString(std::vector<uint8_t>& out, std::string_view s) {
    put<uint64_t>(out, s.size());
    putBytes(out, s.data(), s.size());
}

std::vector<uint8_t> arrayHeader(GgufType elem, uint64_t count) {
    std::vector<uint8_t> out;
    put<uint32_t>(out, uint32_t(GgufType::Array));
    put<uint32_t>(out, uint32_t(elem));
    put<uint64_t>(out, count);
    return out;
}

uint64_t alignUp(uint64_t n, uint64_t align) {
    return (n + align - 1) / align * align;
}

}  // namespace

// Where write() sends bytes: a buffer in memory or a file.
class GgufWriter::Sink {
  public:
    explicit Sink(std::vector<uint8_t>* mem) : mem_(mem) {}
    explicit Sink(std::FILE* file) : file_(file) {}

    Status write(const void* p, size_t n) {
        if (mem_) {
            putBytes(*mem_, p, n);
        } else if (n > 0 && std::fwrite(p, 1, n, file_) != n) {
            return BLUE_ERROR("write failed after %" PRIu64 " bytes: %s", written_,
                              std::strerror(errno));
        }
        written_ += n;
        return {};
    }
    Status pad(uint64_t align) {
        static constexpr uint8_t kZeros[64] = {};
        uint64_t n = alignUp(written_, align) - written_;
        while (n > 0) {
            size_t step = size_t(std::min<uint64_t>(n, sizeof(kZeros)));
            BLUE_TRY(write(kZeros, step));
            n -= step;
        }
        return {};
    }
    uint64_t written() const { return written_; }

  private:
    std::vector<uint8_t>* mem_ = nullptr;
    std::FILE* file_ = nullptr;
    uint64_t written_ = 0;
};

void GgufWriter::setEncoded(std::string_view key, std::vector<uint8_t> encoded) {
    for (Kv& kv : kvs_) {
        if (kv.key == key) {
            kv.encoded = std::move(encoded);
            return;
        }
    }
    kvs_.push_back({std::string(key), std::move(encoded)});
}

void GgufWriter::setScalar(std::string_view key, GgufType type, const void* v, size_t size) {
    std::vector<uint8_t> enc;
    put<uint32_t>(enc, uint32_t(type));
    putBytes(enc, v, size);
    setEncoded(key, std::move(enc));
}

void GgufWriter::setBool(std::string_view key, bool v) {
    uint8_t b = v ? 1 : 0;
    setScalar(key, GgufType::Bool, &b, 1);
}

void GgufWriter::setString(std::string_view key, std::string_view v) {
    std::vector<uint8_t> enc;
    put<uint32_t>(enc, uint32_t(GgufType::String));
    putString(enc, v);
    setEncoded(key, std::move(enc));
}

void GgufWriter::setRawArray(std::string_view key, GgufType elem, const void* data, size_t count,
                             size_t elem_size) {
    std::vector<uint8_t> enc = arrayHeader(elem, count);
    putBytes(enc, data, count * elem_size);
    setEncoded(key, std::move(enc));
}

void GgufWriter::setBoolArray(std::string_view key, const std::vector<bool>& values) {
    std::vector<uint8_t> enc = arrayHeader(GgufType::Bool, values.size());
    for (bool b : values) put<uint8_t>(enc, b ? 1 : 0);
    setEncoded(key, std::move(enc));
}

void GgufWriter::setStringArray(std::string_view key, std::span<const std::string> values) {
    std::vector<uint8_t> enc = arrayHeader(GgufType::String, values.size());
    for (const std::string& s : values) putString(enc, s);
    setEncoded(key, std::move(enc));
}

void GgufWriter::setStringArray(std::string_view key, std::span<const std::string_view> values) {
    std::vector<uint8_t> enc = arrayHeader(GgufType::String, values.size());
    for (std::string_view s : values) putString(enc, s);
    setEncoded(key, std::move(enc));
}

void GgufWriter::setValue(std::string_view key, const GgufValue& value) {
    std::vector<uint8_t> enc;
    put<uint32_t>(enc, uint32_t(value.type()));
    std::span<const uint8_t> payload = value.encodedPayload();
    putBytes(enc, payload.data(), payload.size());
    setEncoded(key, std::move(enc));
}

void GgufWriter::setAlignment(uint32_t alignment) {
    assert(alignment != 0 && (alignment & (alignment - 1)) == 0);
    setU32("general.alignment", alignment);
}

bool GgufWriter::hasKey(std::string_view key) const {
    for (const Kv& kv : kvs_) {
        if (kv.key == key) return true;
    }
    return false;
}

Status GgufWriter::addTensorRecord(Tensor t) {
    std::string ctx = "tensor '" + ggufPrintable(t.name) + "'";
    if (t.name.empty() || t.name.size() > kGgufMaxTensorName) {
        return BLUE_ERROR("%s: name must be 1..%zu bytes", ctx.c_str(), kGgufMaxTensorName);
    }
    for (const Tensor& other : tensors_) {
        if (other.name == t.name) return BLUE_ERROR("%s: added twice", ctx.c_str());
    }
    if (t.dims.empty() || t.dims.size() > kGgufMaxDims) {
        return BLUE_ERROR("%s: %zu dims (expected 1..%u)", ctx.c_str(), t.dims.size(),
                          kGgufMaxDims);
    }
    std::optional<DTypeInfo> info = dtypeInfo(t.type);
    if (!info) return BLUE_ERROR("%s: unknown type id %u", ctx.c_str(), uint32_t(t.type));
    int64_t n = 1;
    for (int64_t d : t.dims) {
        if (d <= 0 || __builtin_mul_overflow(n, d, &n)) {
            return BLUE_ERROR("%s: dims must be positive and their product fit int64", ctx.c_str());
        }
    }
    std::optional<uint64_t> row = dtypeRowBytes(t.type, uint64_t(t.dims[0]));
    if (!row) {
        return BLUE_ERROR("%s: row length %" PRId64 " is not a whole number of %s blocks",
                          ctx.c_str(), t.dims[0], info->name.data());
    }
    t.row_bytes = *row;
    if (__builtin_mul_overflow(*row, uint64_t(n / t.dims[0]), &t.n_bytes)) {
        return BLUE_ERROR("%s: byte size overflows", ctx.c_str());
    }
    if (!t.fill && t.data.size() != t.n_bytes) {
        return BLUE_ERROR("%s: %zu data bytes given, its shape and type need %" PRIu64, ctx.c_str(),
                          t.data.size(), t.n_bytes);
    }
    tensors_.push_back(std::move(t));
    return {};
}

Status GgufWriter::addTensor(std::string_view name, DType type, const std::vector<int64_t>& dims,
                             std::span<const uint8_t> data) {
    return addTensorRecord({std::string(name), type, dims, 0, 0, data, nullptr});
}

Status GgufWriter::addTensor(std::string_view name, DType type, const std::vector<int64_t>& dims,
                             GgufTensorFill fill) {
    assert(fill);
    return addTensorRecord({std::string(name), type, dims, 0, 0, {}, std::move(fill)});
}

Status GgufWriter::writeTensorData(Sink& sink, const Tensor& t) const {
    if (!t.fill) return sink.write(t.data.data(), t.data.size());
    uint64_t rows = t.n_bytes / t.row_bytes;
    uint64_t chunk_rows = std::max<uint64_t>(1, kFillChunkBytes / t.row_bytes);
    std::vector<uint8_t> buf;
    for (uint64_t r = 0; r < rows; r += chunk_rows) {
        uint64_t n = std::min(chunk_rows, rows - r);
        buf.assign(n * t.row_bytes, 0);
        Status s = t.fill(r, n, buf);
        if (!s) return s.prefix("tensor '" + t.name + "': fill");
        BLUE_TRY(sink.write(buf.data(), buf.size()));
    }
    return {};
}

Status GgufWriter::writeTo(Sink& sink) const {
    uint32_t align = kGgufDefaultAlignment;
    for (const Kv& kv : kvs_) {
        if (kv.key != "general.alignment") continue;
        uint32_t type = 0;
        std::memcpy(&type, kv.encoded.data(), 4);
        if (type != uint32_t(GgufType::U32)) return BLUE_ERROR("general.alignment must be a u32");
        std::memcpy(&align, kv.encoded.data() + 4, 4);
        if (align == 0 || (align & (align - 1)) != 0) {
            return BLUE_ERROR("general.alignment %u is not a power of two", align);
        }
    }
    std::vector<uint8_t> head;
    putBytes(head, "GGUF", 4);
    put<uint32_t>(head, 3);
    put<uint64_t>(head, tensors_.size());
    put<uint64_t>(head, kvs_.size());
    for (const Kv& kv : kvs_) {
        putString(head, kv.key);
        putBytes(head, kv.encoded.data(), kv.encoded.size());
    }
    uint64_t offset = 0;
    for (const Tensor& t : tensors_) {
        putString(head, t.name);
        put<uint32_t>(head, uint32_t(t.dims.size()));
        for (int64_t d : t.dims) put<uint64_t>(head, uint64_t(d));
        put<uint32_t>(head, uint32_t(t.type));
        put<uint64_t>(head, offset);
        offset += alignUp(t.n_bytes, align);
    }
    BLUE_TRY(sink.write(head.data(), head.size()));
    BLUE_TRY(sink.pad(align));
    for (const Tensor& t : tensors_) {
        BLUE_TRY(writeTensorData(sink, t));
        BLUE_TRY(sink.pad(align));
    }
    return {};
}

Result<std::vector<uint8_t>> GgufWriter::writeToMemory() const {
    std::vector<uint8_t> out;
    Sink sink(&out);
    BLUE_TRY(writeTo(sink));
    return out;
}

Status GgufWriter::write(const std::string& path) const {
    std::FILE* file = std::fopen(path.c_str(), "wb");
    if (!file) return BLUE_ERROR("%s: cannot create: %s", path.c_str(), std::strerror(errno));
    Sink sink(file);
    Status s = writeTo(sink);
    if (std::fclose(file) != 0 && s) {
        s = BLUE_ERROR("close failed: %s", std::strerror(errno));
    }
    if (!s) {
        std::remove(path.c_str());
        return s.prefix(path);
    }
    return {};
}

}  // namespace blue
