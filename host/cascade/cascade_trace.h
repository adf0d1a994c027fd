// Traces of cascade runs (`bluevm run CASCADE.bir --trace FILE`): one JSON line per request with
// the task, the seed, every stage's statistics and every slot's text, and, for a cascade with
// `prefer CHOSEN over REJECTED`, a preference pair for DPO-style training:
//   {"task":T,"seed":S,"generated":N,
//    "stages":[{"name","state","runs","tokens","entropy_mean","entropy_max","logprob_mean","cycles"}],
//    "slots":{"SLOT":TEXT,...},"preference":{"prompt":T,"chosen":TEXT,"rejected":TEXT}}
// Text that is not valid UTF-8 has its bad bytes replaced by U+FFFD.
#pragma once

#include <string>

#include "host/cascade/cascade_run.h"

namespace blue {

// The trace line of one finished request, without the newline.
std::string cascadeTraceLine(const CascadeInfo& info, const CascadeTask& task, const CascadeResult& r);

// Appends `line` and a newline to `path` (created if missing) with one write.
Status appendTraceLine(const std::string& path, const std::string& line);

}  // namespace blue
