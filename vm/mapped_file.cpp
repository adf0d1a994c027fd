// POSIX implementation of MappedFile.
#include "vm/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace blue {

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
    if (this != &o) {
        unmap();
        data_ = o.data_;
        size_ = o.size_;
        path_ = std::move(o.path_);
        o.data_ = nullptr;
        o.size_ = 0;
    }
    return *this;
}

MappedFile::~MappedFile() { unmap(); }

void MappedFile::unmap() {
    if (data_ && size_) munmap(const_cast<uint8_t*>(data_), size_);
    data_ = nullptr;
    size_ = 0;
}

Result<MappedFile> MappedFile::open(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return BLUE_ERROR("%s: cannot open: %s", path.c_str(), std::strerror(errno));
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        return BLUE_ERROR("%s: not a regular file", path.c_str());
    }
    MappedFile f;
    f.path_ = path;
    f.size_ = size_t(st.st_size);
    if (f.size_ > 0) {
        void* p = mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int err = errno;
            ::close(fd);
            f.size_ = 0;
            return BLUE_ERROR("%s: mmap failed: %s", path.c_str(), std::strerror(err));
        }
        f.data_ = static_cast<const uint8_t*>(p);
    }
    ::close(fd);
    return f;
}

}  // namespace blue
