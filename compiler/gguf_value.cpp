// GGUF metadata values: type names, conversions with range checks, and display for `info`.
// Values are views of bytes the parser has already bounds-checked; walking them here asserts.
#include <bit>
#include <cassert>
#include <cinttypes>
#include <cstring>
#include <limits>
#include <optional>

#include "compiler/gguf.h"

namespace blue {

static_assert(std::endian::native == std::endian::little, "GGUF is little-endian");

namespace {

template <class T>
T load(const uint8_t* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}

// An integer of any GGUF width, widened without loss: `bits` is the two's complement value.
struct WideInt {
    bool negative;
    uint64_t bits;
};

std::optional<WideInt> readInt(GgufType t, const uint8_t* p) {
    auto from_signed = [](int64_t v) { return WideInt{v < 0, uint64_t(v)}; };
    switch (t) {
        case GgufType::U8:
            return WideInt{false, load<uint8_t>(p)};
        case GgufType::U16:
            return WideInt{false, load<uint16_t>(p)};
        case GgufType::U32:
            return WideInt{false, load<uint32_t>(p)};
        case GgufType::U64:
            return WideInt{false, load<uint64_t>(p)};
        case GgufType::I8:
            return from_signed(load<int8_t>(p));
        case GgufType::I16:
            return from_signed(load<int16_t>(p));
        case GgufType::I32:
            return from_signed(load<int32_t>(p));
        case GgufType::I64:
            return from_signed(load<int64_t>(p));
        default:
            return std::nullopt;
    }
}

bool isIntegerType(GgufType t) {
    switch (t) {
        case GgufType::U8:
        case GgufType::I8:
        case GgufType::U16:
        case GgufType::I16:
        case GgufType::U32:
        case GgufType::I32:
        case GgufType::U64:
        case GgufType::I64:
            return true;
        default:
            return false;
    }
}

std::optional<double> readFloat(GgufType t, const uint8_t* p) {
    if (t == GgufType::F32) return load<float>(p);
    if (t == GgufType::F64) return load<double>(p);
    if (auto w = readInt(t, p)) return w->negative ? double(int64_t(w->bits)) : double(w->bits);
    return std::nullopt;
}

template <class T>
std::optional<T> narrow(WideInt w) {
    if (w.negative) {
        if constexpr (std::is_signed_v<T>) {
            if (int64_t(w.bits) >= int64_t(std::numeric_limits<T>::min()))
                return T(int64_t(w.bits));
        }
        return std::nullopt;
    }
    if (w.bits <= uint64_t(std::numeric_limits<T>::max())) return T(w.bits);
    return std::nullopt;
}

std::string intText(WideInt w) {
    return w.negative ? strFormat("%" PRId64, int64_t(w.bits)) : strFormat("%" PRIu64, w.bits);
}

// Size of the element at p (already validated by the parser).
uint64_t elementSize(GgufType t, const uint8_t* p) {
    if (uint64_t n = ggufScalarSize(t)) return n;
    if (t == GgufType::String) return 8 + load<uint64_t>(p);
    assert(t == GgufType::Array);
    GgufType inner = GgufType(load<uint32_t>(p));
    uint64_t count = load<uint64_t>(p + 4);
    uint64_t size = 12;
    for (uint64_t i = 0; i < count; ++i) size += elementSize(inner, p + size);
    return size;
}

Status mismatch(const char* wanted, const GgufValue& v) {
    return BLUE_ERROR("expected %s, found %s", wanted, v.typeDisplay().c_str());
}

template <class T>
Result<T> toInt(const GgufValue& v, std::span<const uint8_t> bytes, const char* name) {
    auto w = v.isArray() ? std::nullopt : readInt(v.type(), bytes.data());
    if (!w) return mismatch("an integer", v);
    auto n = narrow<T>(*w);
    if (!n) return BLUE_ERROR("value %s does not fit %s", intText(*w).c_str(), name);
    return *n;
}

}  // namespace

std::string_view ggufTypeName(GgufType t) {
    switch (t) {
        case GgufType::U8:
            return "u8";
        case GgufType::I8:
            return "i8";
        case GgufType::U16:
            return "u16";
        case GgufType::I16:
            return "i16";
        case GgufType::U32:
            return "u32";
        case GgufType::I32:
            return "i32";
        case GgufType::F32:
            return "f32";
        case GgufType::Bool:
            return "bool";
        case GgufType::String:
            return "string";
        case GgufType::Array:
            return "array";
        case GgufType::U64:
            return "u64";
        case GgufType::I64:
            return "i64";
        case GgufType::F64:
            return "f64";
    }
    return "?";
}

uint64_t ggufScalarSize(GgufType t) {
    switch (t) {
        case GgufType::U8:
        case GgufType::I8:
        case GgufType::Bool:
            return 1;
        case GgufType::U16:
        case GgufType::I16:
            return 2;
        case GgufType::U32:
        case GgufType::I32:
        case GgufType::F32:
            return 4;
        case GgufType::U64:
        case GgufType::I64:
        case GgufType::F64:
            return 8;
        default:
            return 0;
    }
}

std::string ggufPrintable(std::string_view s, size_t max_len) {
    std::string out;
    for (size_t i = 0; i < s.size() && i < max_len; ++i) {
        auto c = static_cast<unsigned char>(s[i]);
        if (c == '\\') {
            out += "\\\\";
        } else if (c < 0x20 || c == 0x7f) {
            out += strFormat("\\x%02x", c);
        } else {
            out += char(c);  // printable ASCII; UTF-8 passes through
        }
    }
    if (s.size() > max_len) out += "...";
    return out;
}

Result<uint64_t> GgufValue::toU64() const {
    return toInt<uint64_t>(*this, {data_, size_}, "u64");
}
Result<uint32_t> GgufValue::toU32() const {
    return toInt<uint32_t>(*this, {data_, size_}, "u32");
}
Result<int64_t> GgufValue::toI64() const {
    return toInt<int64_t>(*this, {data_, size_}, "i64");
}

Result<double> GgufValue::toF64() const {
    auto f = isArray() ? std::nullopt : readFloat(type_, data_);
    if (!f) return mismatch("a number", *this);
    return *f;
}

Result<bool> GgufValue::toBool() const {
    if (type_ != GgufType::Bool) return mismatch("bool", *this);
    return data_[0] != 0;
}

Result<std::string_view> GgufValue::toString() const {
    if (type_ != GgufType::String) return mismatch("string", *this);
    return std::string_view(reinterpret_cast<const char*>(data_), size_);
}

Result<std::vector<std::string_view>> GgufValue::toStringArray() const {
    if (!isArray() || elem_type_ != GgufType::String) return mismatch("array<string>", *this);
    std::vector<std::string_view> out;
    out.reserve(count_);
    const uint8_t* p = data_;
    for (uint64_t i = 0; i < count_; ++i) {
        uint64_t len = load<uint64_t>(p);
        assert(p + 8 + len <= data_ + size_);
        out.emplace_back(reinterpret_cast<const char*>(p + 8), len);
        p += 8 + len;
    }
    return out;
}

Result<std::vector<float>> GgufValue::toF32Array() const {
    if (!isArray() || (elem_type_ != GgufType::F32 && elem_type_ != GgufType::F64)) {
        return mismatch("array<f32>", *this);
    }
    std::vector<float> out(count_);
    uint64_t step = ggufScalarSize(elem_type_);
    for (uint64_t i = 0; i < count_; ++i) out[i] = float(*readFloat(elem_type_, data_ + i * step));
    return out;
}

Result<std::vector<int32_t>> GgufValue::toI32Array() const {
    if (!isArray() || !isIntegerType(elem_type_)) return mismatch("array of integers", *this);
    uint64_t step = ggufScalarSize(elem_type_);
    std::vector<int32_t> out(count_);
    for (uint64_t i = 0; i < count_; ++i) {
        WideInt w = *readInt(elem_type_, data_ + i * step);
        auto n = narrow<int32_t>(w);
        if (!n) {
            return BLUE_ERROR("element %" PRIu64 " (value %s) does not fit i32", i,
                              intText(w).c_str());
        }
        out[i] = *n;
    }
    return out;
}

std::span<const uint8_t> GgufValue::encodedPayload() const {
    return {encoded_, encoded_size_};
}

std::string GgufValue::typeDisplay() const {
    if (!isArray()) return std::string(ggufTypeName(type_));
    return "array<" + std::string(ggufTypeName(elem_type_)) + ">";
}

std::string GgufValue::toDisplay(size_t max_elems) const {
    if (auto w = isArray() ? std::nullopt : readInt(type_, data_)) return intText(*w);
    switch (type_) {
        case GgufType::F32:
        case GgufType::F64:
            return strFormat("%g", *readFloat(type_, data_));
        case GgufType::Bool:
            return data_[0] ? "true" : "false";
        case GgufType::String:
            return "\"" + ggufPrintable(*toString(), 60) + "\"";
        default:
            break;
    }
    std::string out = "[";
    const uint8_t* p = data_;
    for (uint64_t i = 0; i < count_ && i < max_elems; ++i) {
        GgufValue elem;
        elem.type_ = elem_type_;
        uint64_t elem_bytes = elementSize(elem_type_, p);
        elem.data_ = p;
        elem.size_ = elem_bytes;
        if (elem_type_ == GgufType::String) {
            elem.data_ = p + 8;
            elem.size_ -= 8;
        } else if (elem_type_ == GgufType::Array) {
            elem.elem_type_ = GgufType(load<uint32_t>(p));
            elem.count_ = load<uint64_t>(p + 4);
            elem.data_ = p + 12;
            elem.size_ -= 12;
        }
        p += elem_bytes;
        out += (i ? ", " : "") + elem.toDisplay(std::max<size_t>(max_elems / 2, 2));
    }
    if (count_ > max_elems) out += strFormat(", ... (%" PRIu64 " total)", count_);
    return out + "]";
}

}  // namespace blue
