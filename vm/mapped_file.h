// A read-only memory-mapped file (POSIX mmap). Used for weight files referenced by modules.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "vm/status.h"

namespace blue {

class MappedFile {
public:
    MappedFile() = default;
    MappedFile(MappedFile&& o) noexcept { *this = std::move(o); }
    MappedFile& operator=(MappedFile&& o) noexcept;
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;
    ~MappedFile();

    // Maps the whole file. Fails with a message naming the path and the OS error.
    static Result<MappedFile> open(const std::string& path);

    std::span<const uint8_t> bytes() const { return {data_, size_}; }
    const std::string& path() const { return path_; }

private:
    void unmap();

    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
    std::string path_;
};

}  // namespace blue
