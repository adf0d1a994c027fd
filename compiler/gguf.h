// GGUF files: the reader (memory-mapped, every field checked before use) and the writer.
//
// Layout (v2/v3, little-endian), byte-compatible with llama.cpp:
//   "GGUF" u32 version, u64 n_tensors, u64 n_kv,
//   n_kv x { string key, u32 value type, value },
//   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset },
//   zero padding to `general.alignment` (default 32), then the data section: each tensor's bytes
//   at its offset (relative to the section, a multiple of the alignment), zero-padded to it.
// Strings are u64 length + bytes (no terminator); arrays are u32 element type, u64 count, elements.
//
// A GgufFile is a parsed, validated view: metadata values and tensor records point into the bytes
// it owns (a read-only mapping or a buffer), so they stay valid as long as the GgufFile lives,
// including across moves.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "vm/dtype.h"
#include "vm/status.h"

namespace blue {

// Metadata value types, numbered as in the GGUF format.
enum class GgufType : uint32_t {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
};

constexpr uint32_t kGgufDefaultAlignment = 32;
constexpr uint32_t kGgufMaxDims = 4;
constexpr uint32_t kGgufMaxArrayDepth = 8;  // arrays of arrays nest at most this deep
constexpr size_t kGgufMaxTensorName = 63;   // llama.cpp's GGML_MAX_NAME - 1

// "u32", "string", "array", ...; "?" for ids the format does not define.
std::string_view ggufTypeName(GgufType t);
// Bytes of a scalar of type t; 0 for string, array and undefined ids.
uint64_t ggufScalarSize(GgufType t);
// `s` fit for an error message: non-printable bytes as \xNN, cut to max_len bytes with "...".
std::string ggufPrintable(std::string_view s, size_t max_len = 80);

// One metadata value: a view of its encoding inside the file (valid while the GgufFile lives).
// The to*() conversions fail (with a message naming the types, not the key) on a type mismatch or
// a value that does not fit the requested type.
class GgufValue {
  public:
    GgufType type() const { return type_; }
    GgufType elemType() const { return elem_type_; }  // arrays only
    uint64_t count() const { return count_; }         // arrays: elements; otherwise 1
    uint64_t fileOffset() const { return offset_; }   // where the value's encoding starts
    bool isArray() const { return type_ == GgufType::Array; }

    Result<uint64_t> toU64() const;  // any integer type holding a non-negative value
    Result<uint32_t> toU32() const;  // any integer type holding a value in [0, UINT32_MAX]
    Result<int64_t> toI64() const;   // any integer type holding a value <= INT64_MAX
    Result<double> toF64() const;    // f32, f64 or an integer type
    Result<bool> toBool() const;
    Result<std::string_view> toString() const;
    Result<std::vector<std::string_view>> toStringArray() const;
    Result<std::vector<float>> toF32Array() const;    // array of f32 or f64
    Result<std::vector<int32_t>> toI32Array() const;  // array of an integer type, values in range

    // Human-readable: `42`, `"llama"`, `[1, 2, 3, ... (512 total)]`; long strings are cut.
    std::string toDisplay(size_t max_elems = 8) const;
    // "u32", "string", "array<f32>", "array<array>".
    std::string typeDisplay() const;

    // The value's encoding after its type id (for copying a value unchanged into a writer).
    std::span<const uint8_t> encodedPayload() const;

  private:
    friend class GgufParser;
    GgufType type_ = GgufType::U8;
    GgufType elem_type_ = GgufType::U8;
    uint64_t count_ = 1;
    const uint8_t* data_ = nullptr;  // scalar bytes, string chars, or first array element
    uint64_t size_ = 0;              // bytes at data_
    const uint8_t* encoded_ = nullptr;
    uint64_t encoded_size_ = 0;
    uint64_t offset_ = 0;
};

struct GgufKv {
    std::string_view key;
    GgufValue value;
    uint64_t offset = 0;  // where the KV record starts in the file
};

struct GgufTensor {
    std::string_view name;
    uint32_t index = 0;  // position in the file's tensor table
    DType type = DType::F32;
    bool supported = false;  // dtypeInfo(type)->supported; data of others is refused
    uint32_t n_dims = 0;     // 1..4
    std::array<int64_t, kGgufMaxDims> ne{1, 1, 1, 1};  // ne[0]: row length (innermost); unused: 1
    int64_t n_elements = 0;
    uint64_t n_bytes = 0;
    uint64_t offset = 0;       // absolute file offset of the data
    uint64_t info_offset = 0;  // where the tensor's info record starts

    int64_t rows() const { return n_elements / ne[0]; }
};

// A parsed GGUF file. Movable, not copyable; owns its bytes.
class GgufFile {
  public:
    GgufFile();
    GgufFile(GgufFile&&) noexcept;
    GgufFile& operator=(GgufFile&&) noexcept;
    GgufFile(const GgufFile&) = delete;
    GgufFile& operator=(const GgufFile&) = delete;
    ~GgufFile();

    const std::string& name() const { return name_; }  // as used in messages
    uint32_t version() const { return version_; }
    uint32_t alignment() const { return alignment_; }
    uint64_t dataOffset() const { return data_offset_; }  // start of the data section
    std::span<const uint8_t> bytes() const;

    const std::vector<GgufKv>& kvs() const { return kvs_; }
    const GgufValue* find(std::string_view key) const;  // nullptr when absent
    bool has(std::string_view key) const { return find(key) != nullptr; }

    // Typed metadata getters. Integer getters accept any integer type whose value fits; float
    // getters accept f32, f64 and integers. They fail when the key is missing (the *Or forms
    // return `fallback` instead), on a type mismatch, or when the value does not fit; messages
    // name the file and the key.
    Result<uint32_t> getU32(std::string_view key) const;
    Result<uint32_t> getU32Or(std::string_view key, uint32_t fallback) const;
    Result<uint64_t> getU64(std::string_view key) const;
    Result<int64_t> getI64(std::string_view key) const;
    Result<float> getF32(std::string_view key) const;
    Result<float> getF32Or(std::string_view key, float fallback) const;
    Result<bool> getBool(std::string_view key) const;
    Result<bool> getBoolOr(std::string_view key, bool fallback) const;
    Result<std::string_view> getString(std::string_view key) const;
    Result<std::string_view> getStringOr(std::string_view key, std::string_view fallback) const;
    Result<std::vector<std::string_view>> getStringArray(std::string_view key) const;
    Result<std::vector<float>> getF32Array(std::string_view key) const;
    Result<std::vector<int32_t>> getI32Array(std::string_view key) const;

    const std::vector<GgufTensor>& tensors() const { return tensors_; }
    const GgufTensor* findTensor(std::string_view name) const;  // nullptr when absent

    // The tensor's bytes inside the file. Fails for types BlueVM does not support (the error
    // names the tensor and its type); `t` must be one of this file's tensors.
    Result<std::span<const uint8_t>> tensorData(const GgufTensor& t) const;
    // The bytes whatever the type (for copying or hashing); `t` must be one of this file's.
    std::span<const uint8_t> rawTensorData(const GgufTensor& t) const;

  private:
    friend class GgufParser;
    struct Storage;
    template <class T>
    Result<T> getWith(std::string_view key, const T* fallback,
                      Result<T> (*convert)(const GgufValue&)) const;

    std::unique_ptr<Storage> storage_;
    std::string name_;
    uint32_t version_ = 0;
    uint32_t alignment_ = kGgufDefaultAlignment;
    uint64_t data_offset_ = 0;
    std::vector<GgufKv> kvs_;
    std::vector<GgufTensor> tensors_;
    std::unordered_map<std::string_view, size_t> kv_index_;
    std::unordered_map<std::string_view, size_t> tensor_index_;
};

// Memory-maps `path` read-only and parses it. Fails when the file cannot be opened or mapped, or
// is not a valid GGUF v2/v3 file; messages start with `path`. The mapping lives as long as the
// returned GgufFile (a file truncated by someone else while mapped can still fault: mmap's limit).
Result<GgufFile> ggufOpen(const std::string& path);

// Parses a file held in memory (tests, fuzzing); `name` prefixes error messages.
Result<GgufFile> ggufParse(std::vector<uint8_t> bytes, std::string name);

// Produces the bytes of rows [first_row, first_row + n_rows) of a tensor into `out` (exactly
// n_rows * row bytes); a failed Status aborts the write.
using GgufTensorFill =
    std::function<Status(uint64_t first_row, uint64_t n_rows, std::span<uint8_t> out)>;

// Builds a GGUF v3 file. Keys keep the order they were first set in; setting a key again
// replaces its value. Tensors are written in the order added, each at an aligned offset.
class GgufWriter {
  public:
    void setU8(std::string_view key, uint8_t v) { setScalar(key, GgufType::U8, &v, 1); }
    void setI8(std::string_view key, int8_t v) { setScalar(key, GgufType::I8, &v, 1); }
    void setU16(std::string_view key, uint16_t v) { setScalar(key, GgufType::U16, &v, 2); }
    void setI16(std::string_view key, int16_t v) { setScalar(key, GgufType::I16, &v, 2); }
    void setU32(std::string_view key, uint32_t v) { setScalar(key, GgufType::U32, &v, 4); }
    void setI32(std::string_view key, int32_t v) { setScalar(key, GgufType::I32, &v, 4); }
    void setU64(std::string_view key, uint64_t v) { setScalar(key, GgufType::U64, &v, 8); }
    void setI64(std::string_view key, int64_t v) { setScalar(key, GgufType::I64, &v, 8); }
    void setF32(std::string_view key, float v) { setScalar(key, GgufType::F32, &v, 4); }
    void setF64(std::string_view key, double v) { setScalar(key, GgufType::F64, &v, 8); }
    void setBool(std::string_view key, bool v);
    void setString(std::string_view key, std::string_view v);

    // Arrays of numbers: T is one of uint8_t..int64_t, float, double.
    template <class T>
    void setArray(std::string_view key, std::span<const T> values);
    void setBoolArray(std::string_view key, const std::vector<bool>& values);
    void setStringArray(std::string_view key, std::span<const std::string> values);
    void setStringArray(std::string_view key, std::span<const std::string_view> values);
    // Copies a value read from another file unchanged (any type, nested arrays included).
    void setValue(std::string_view key, const GgufValue& value);

    // Sets the data alignment (a power of two) and records it as `general.alignment` (u32).
    void setAlignment(uint32_t alignment);
    bool hasKey(std::string_view key) const;

    // Adds a tensor with dims ne[0..n) (ne[0] innermost). `data` is borrowed: it must hold exactly
    // the tensor's bytes and stay valid until the last write. Fails on a duplicate or too-long
    // name, bad dims, an unknown type, a row that is not a whole number of blocks, or a size
    // mismatch.
    Status addTensor(std::string_view name, DType type, const std::vector<int64_t>& dims,
                     std::span<const uint8_t> data);
    // As above, with the data produced at write time, in chunks of whole rows.
    Status addTensor(std::string_view name, DType type, const std::vector<int64_t>& dims,
                     GgufTensorFill fill);

    // Writes the file; on failure the partial file is removed. Fails on I/O errors, an invalid
    // alignment, or a fill callback that fails.
    Status write(const std::string& path) const;
    Result<std::vector<uint8_t>> writeToMemory() const;

  private:
    struct Kv {
        std::string key;
        std::vector<uint8_t> encoded;  // u32 type id, then the value
    };
    struct Tensor {
        std::string name;
        DType type;
        std::vector<int64_t> dims;
        uint64_t n_bytes;
        uint64_t row_bytes;
        std::span<const uint8_t> data;
        GgufTensorFill fill;
    };
    class Sink;

    void setEncoded(std::string_view key, std::vector<uint8_t> encoded);
    void setScalar(std::string_view key, GgufType type, const void* v, size_t size);
    void setRawArray(std::string_view key, GgufType elem, const void* data, size_t count,
                     size_t elem_size);
    Status addTensorRecord(Tensor t);
    Status writeTo(Sink& sink) const;
    Status writeTensorData(Sink& sink, const Tensor& t) const;

    std::vector<Kv> kvs_;
    std::vector<Tensor> tensors_;
};

template <class T>
constexpr GgufType ggufTypeOf() {
    if constexpr (std::is_same_v<T, uint8_t>)
        return GgufType::U8;
    else if constexpr (std::is_same_v<T, int8_t>)
        return GgufType::I8;
    else if constexpr (std::is_same_v<T, uint16_t>)
        return GgufType::U16;
    else if constexpr (std::is_same_v<T, int16_t>)
        return GgufType::I16;
    else if constexpr (std::is_same_v<T, uint32_t>)
        return GgufType::U32;
    else if constexpr (std::is_same_v<T, int32_t>)
        return GgufType::I32;
    else if constexpr (std::is_same_v<T, uint64_t>)
        return GgufType::U64;
    else if constexpr (std::is_same_v<T, int64_t>)
        return GgufType::I64;
    else if constexpr (std::is_same_v<T, float>)
        return GgufType::F32;
    else if constexpr (std::is_same_v<T, double>)
        return GgufType::F64;
    else
        static_assert(sizeof(T) == 0, "not a GGUF numeric type");
}

template <class T>
void GgufWriter::setArray(std::string_view key, std::span<const T> values) {
    setRawArray(key, ggufTypeOf<T>(), values.data(), values.size(), sizeof(T));
}

}  // namespace blue
