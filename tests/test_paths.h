// Where tests find their data: the repository's own files and the read-only ../shared folder
// (test models and tokenizer vectors, never copied into the repository).
#pragma once

#include <cstdlib>
#include <string>

namespace blue::test {

inline std::string sourceDir() { return BLUE_SOURCE_DIR; }

// BLUE_SHARED overrides the default ../shared beside the checkout.
inline std::string sharedDir() {
    if (const char* env = std::getenv("BLUE_SHARED")) return env;
    return std::string(BLUE_SOURCE_DIR) + "/../shared";
}

}  // namespace blue::test
