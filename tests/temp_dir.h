// A scratch folder for a test's files (modules, models, logs), removed when the test ends.
#pragma once

#include <doctest/doctest.h>

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace blue::test {

struct TempDir {
    std::string path;
    explicit TempDir(const std::string& prefix = "blue_test") {
        std::string tmpl = "/tmp/" + prefix + "_XXXXXX";
        REQUIRE(mkdtemp(tmpl.data()) != nullptr);
        path = tmpl;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
};

}  // namespace blue::test
