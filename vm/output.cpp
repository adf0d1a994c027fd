// Output records to text (see output.h).
#include "vm/output.h"

#include <bit>

#include "vm/abi.h"

namespace blue {

std::string recordText(const Module& m, const OutputRecord& r, const Detokenizer& detok) {
    switch (r.kind) {
        case BLUE_OUT_INT: return std::to_string(int32_t(r.value));
        case BLUE_OUT_UINT: return std::to_string(r.value);
        case BLUE_OUT_FLOAT: return strFormat("%g", double(std::bit_cast<float>(r.value)));
        case BLUE_OUT_CHAR: return std::string(1, char(r.value & 0xFF));
        case BLUE_OUT_STR: {
            std::string s;
            return m.constString(r.value, &s) ? s : strFormat("<bad string %u>", r.value);
        }
        case BLUE_OUT_TOKEN: return detok ? detok(r.value) : strFormat("<%u>", r.value);
        case BLUE_OUT_END:
        case BLUE_OUT_BEGIN: return "";
    }
    return strFormat("<record kind %u>", r.kind);
}

void appendOutputText(const Module& m, std::span<const OutputRecord> records,
                      std::vector<std::string>* per_instance, const Detokenizer& detok) {
    for (const OutputRecord& r : records) {
        if (r.inst < per_instance->size()) (*per_instance)[r.inst] += recordText(m, r, detok);
    }
}

std::string formatInstanceOutput(const std::vector<std::string>& per_instance) {
    std::string out;
    for (size_t i = 0; i < per_instance.size(); ++i) {
        const std::string& text = per_instance[i];
        size_t start = 0;
        while (start < text.size()) {
            size_t end = text.find('\n', start);
            if (end == std::string::npos) end = text.size();
            out += strFormat("[%zu] ", i) + text.substr(start, end - start) + "\n";
            start = end + 1;
        }
    }
    return out;
}

}  // namespace blue
