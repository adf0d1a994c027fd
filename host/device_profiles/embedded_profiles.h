// The profile files of host/device_profiles/, embedded at build time by embed_profiles.cmake
// (the generated .cpp is never committed).
#pragma once

#include <cstddef>

namespace blue {

struct EmbeddedProfile {
    const char* name;  // file name without .json
    const char* json;  // the file's text
};

extern const EmbeddedProfile kEmbeddedProfiles[];
extern const size_t kEmbeddedProfileCount;

}  // namespace blue
