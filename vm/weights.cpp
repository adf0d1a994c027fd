// WeightSource: maps external weight files and hands out tensor byte ranges.
#include "vm/weights.h"

namespace blue {

std::string resolveModulePath(const std::string& module_dir, const std::string& path) {
    if (path.empty() || path[0] == '/' || module_dir.empty()) return path;
    return module_dir + "/" + path;
}

Result<WeightSource> WeightSource::open(const Module& m, const std::string& module_dir) {
    WeightSource src;
    src.module_ = &m;
    for (const std::string& name : m.externs) {
        Result<MappedFile> f = MappedFile::open(resolveModulePath(module_dir, name));
        if (!f) return f.status();
        src.files_.push_back(std::move(f.value()));
    }
    for (const TensorDecl& t : m.tensors) {
        if (t.source != DataSource::EXTERN) continue;
        const MappedFile& f = src.files_[t.extern_index];
        uint64_t size = f.bytes().size();
        if (t.offset > size || t.bytes > size - t.offset) {
            return BLUE_ERROR("%s: tensor '%s' needs bytes [%llu, +%llu) but the file has %llu",
                              f.path().c_str(), t.name.c_str(), (unsigned long long)t.offset,
                              (unsigned long long)t.bytes, (unsigned long long)size);
        }
    }
    return src;
}

std::span<const uint8_t> WeightSource::tensorBytes(uint32_t index) const {
    const TensorDecl& t = module_->tensors[index];
    switch (t.source) {
        case DataSource::DATA: return {module_->data.data() + t.offset, size_t(t.bytes)};
        case DataSource::EXTERN:
            return files_[t.extern_index].bytes().subspan(t.offset, size_t(t.bytes));
        case DataSource::NONE: break;
    }
    return {};
}

}  // namespace blue
