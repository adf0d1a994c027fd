// Cascade traces (see cascade_trace.h).
#include "host/cascade/cascade_trace.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

namespace blue {

std::string cascadeTraceLine(const CascadeInfo& info, const CascadeTask& task, const CascadeResult& r) {
    using nlohmann::ordered_json;
    ordered_json line;
    line["task"] = task.text;
    line["seed"] = task.seed;
    line["generated"] = r.generated;
    ordered_json stages = ordered_json::array();
    for (const StageStats& st : r.stages) {
        stages.push_back({{"name", st.name},
                          {"state", st.stateName()},
                          {"runs", st.runs},
                          {"tokens", st.tokens},
                          {"entropy_mean", st.entropyMean()},
                          {"entropy_max", st.entropy_max},
                          {"logprob_mean", st.logprobMean()},
                          {"cycles", st.cycles}});
        if (st.branches) {
            stages.back()["branches"] = st.branches;
            stages.back()["kept"] = st.choice;
            stages.back()["branch_tokens"] = st.branch_tokens;
        }
    }
    line["stages"] = std::move(stages);
    ordered_json slots = ordered_json::object();
    for (size_t k = 0; k < info.slots.size() && k < r.slot_text.size(); ++k) slots[info.slots[k]] = r.slot_text[k];
    line["slots"] = std::move(slots);
    if (info.prefer_chosen >= 0 && size_t(info.prefer_chosen) < r.slot_text.size() &&
        size_t(info.prefer_rejected) < r.slot_text.size()) {
        line["preference"] = {{"prompt", task.text},
                              {"chosen", r.slot_text[size_t(info.prefer_chosen)]},
                              {"rejected", r.slot_text[size_t(info.prefer_rejected)]}};
    }
    return line.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

Status appendTraceLine(const std::string& path, const std::string& line) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return BLUE_ERROR("--trace: cannot open %s: %s", path.c_str(), std::strerror(errno));
    std::string text = line + "\n";
    ssize_t n = ::write(fd, text.data(), text.size());
    int err = errno;
    ::close(fd);
    if (n != ssize_t(text.size())) return BLUE_ERROR("--trace: cannot write %s: %s", path.c_str(), n < 0 ? std::strerror(err) : "short write");
    return Status::ok();
}

}  // namespace blue
