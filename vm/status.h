// Status and Result: how BlueVM reports failures that come from untrusted input (bytecode, GGUF
// files, requests) or from the environment (missing files, no device). Programming bugs assert
// instead; unrecoverable Vulkan failures are reported by host/vk_check.h.
//
// A failed Status carries one human-readable line that names what is wrong and where, e.g.
// "module.bir: code section: instruction 12 (offset 0x60): jump target 900 outside code (size 40)".
#pragma once

#include <cassert>
#include <cstdarg>
#include <cstdio>
#include <string>
#include <utility>

namespace blue {

class Status {
public:
    Status() = default;  // ok
    static Status ok() { return {}; }
    static Status error(std::string message) {
        Status s;
        s.failed_ = true;
        s.message_ = std::move(message);
        return s;
    }

    bool isOk() const { return !failed_; }
    explicit operator bool() const { return !failed_; }
    const std::string& message() const { return message_; }

    // Prefixes the message with context ("file.gguf: "), keeping the innermost detail last.
    Status& prefix(const std::string& context) {
        if (failed_) message_ = context + ": " + message_;
        return *this;
    }

private:
    bool failed_ = false;
    std::string message_;
};

// printf-style formatting into std::string; used to build error messages.
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
inline std::string strFormat(const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    va_list copy;
    va_copy(copy, args);
    int n = std::vsnprintf(nullptr, 0, fmt, copy);
    va_end(copy);
    std::string out(n > 0 ? size_t(n) : 0, '\0');
    if (n > 0) std::vsnprintf(out.data(), out.size() + 1, fmt, args);
    va_end(args);
    return out;
}

#define BLUE_ERROR(...) ::blue::Status::error(::blue::strFormat(__VA_ARGS__))

// Result<T>: a value or a failed Status. Access to value() of a failed result is a bug.
template <class T>
class Result {
public:
    Result(T value) : value_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
    Result(Status status) : status_(std::move(status)) {  // NOLINT(google-explicit-constructor)
        assert(!status_.isOk() && "Result built from an ok Status without a value");
    }

    bool isOk() const { return status_.isOk(); }
    explicit operator bool() const { return status_.isOk(); }
    const Status& status() const { return status_; }
    const std::string& message() const { return status_.message(); }

    T& value() & {
        assert(isOk());
        return value_;
    }
    const T& value() const& {
        assert(isOk());
        return value_;
    }
    T&& value() && {
        assert(isOk());
        return std::move(value_);
    }
    T* operator->() { return &value(); }
    const T* operator->() const { return &value(); }
    T& operator*() { return value(); }

private:
    T value_{};
    Status status_;
};

// Propagates a failed Status out of the enclosing function.
#define BLUE_TRY(expr)                         \
    do {                                       \
        ::blue::Status blue_try_s_ = (expr);   \
        if (!blue_try_s_) return blue_try_s_;  \
    } while (0)

// `BLUE_TRY_ASSIGN(auto x, f());` declares (or assigns) x from a Result, or returns its failure.
#define BLUE_TRY_CAT_(a, b) a##b
#define BLUE_TRY_CAT(a, b) BLUE_TRY_CAT_(a, b)
#define BLUE_TRY_ASSIGN(lhs, expr) BLUE_TRY_ASSIGN_IMPL_(BLUE_TRY_CAT(blue_try_r_, __LINE__), lhs, expr)
#define BLUE_TRY_ASSIGN_IMPL_(tmp, lhs, expr) \
    auto tmp = (expr);                         \
    if (!tmp) return tmp.status();             \
    lhs = std::move(tmp.value())

}  // namespace blue
