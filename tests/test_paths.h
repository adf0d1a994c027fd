// Where tests find their data: the repository's own files and the read-only ../shared folder
// (test models and tokenizer vectors, never copied into the repository).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace blue::test {

inline std::string sourceDir() { return BLUE_SOURCE_DIR; }

// BLUE_SHARED overrides the default ../shared beside the checkout.
inline std::string sharedDir() {
    if (const char* env = std::getenv("BLUE_SHARED")) return env;
    return std::string(BLUE_SOURCE_DIR) + "/../shared";
}

// The 256 greedy token ids from BOS that stories260K is known to produce (the first line of
// expected_greedy_bos_256.txt).
inline std::vector<uint32_t> expectedGreedyIds() {
    std::ifstream in(sharedDir() + "/models/stories260K/expected_greedy_bos_256.txt");
    std::string line;
    std::getline(in, line);
    std::istringstream ss(line);
    std::vector<uint32_t> ids;
    for (uint32_t id; ss >> id;) ids.push_back(id);
    return ids;
}

}  // namespace blue::test
