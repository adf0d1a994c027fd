// The test binary's entry point. Tests find shared data (../shared) relative to the source tree.
//
// Validation messages fail the run wherever they come from. Each GPU test checks its own device
// (CHECK_NO_VALIDATION_ERRORS), but a device made by an engine, a server thread or a child process
// (`bluevm serve`, the command line) reports only to its stderr. So the binary sets
// BLUE_VALIDATION_LOG to a file of its own, which every Device of this process and of the
// processes it starts appends each message to (host/device.cpp); after each test case the file is
// checked, the test cases during which it grew are named at the end with their messages, and the
// run exits non-zero.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Finding {
    std::string test;
    std::string messages;
};

std::string g_log_path;
std::vector<Finding> g_findings;
std::uintmax_t g_log_seen = 0;

std::uintmax_t logSize() {
    std::error_code ec;
    auto n = std::filesystem::file_size(g_log_path, ec);
    return ec ? 0 : n;
}

// Records the messages appended since the last look, under `test`.
void collect(const std::string& test) {
    std::uintmax_t size = logSize();
    if (size <= g_log_seen) return;
    std::ifstream in(g_log_path, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(g_log_seen));
    std::string text(size - g_log_seen, '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    g_log_seen = size;
    g_findings.push_back({test, text});
}

struct ValidationListener : doctest::IReporter {
    explicit ValidationListener(const doctest::ContextOptions&) {}
    void report_query(const doctest::QueryData&) override {}
    void test_run_start() override {}
    void test_run_end(const doctest::TestRunStats&) override {}
    void test_case_start(const doctest::TestCaseData& tc) override {
        collect(std::string("(between test cases, before ") + tc.m_name + ")");
        current_ = std::string(tc.m_file.c_str()) + ": " + tc.m_name;
    }
    void test_case_reenter(const doctest::TestCaseData&) override {}
    void test_case_end(const doctest::CurrentTestCaseStats&) override {
        collect(current_);
    }
    void test_case_exception(const doctest::TestCaseException&) override {}
    void subcase_start(const doctest::SubcaseSignature&) override {}
    void subcase_end() override {}
    void log_assert(const doctest::AssertData&) override {}
    void log_message(const doctest::MessageData&) override {}
    void test_case_skipped(const doctest::TestCaseData&) override {}

   private:
    std::string current_;
};

REGISTER_LISTENER("validation-log", 1, ValidationListener);

}  // namespace

int main(int argc, char** argv) {
    const char* preset = std::getenv("BLUE_VALIDATION_LOG");
    bool own_log = !(preset && *preset);
    if (own_log) {
        g_log_path = (std::filesystem::temp_directory_path() /
                      ("blue_validation_" + std::to_string(getpid()) + ".log")).string();
        std::remove(g_log_path.c_str());
        setenv("BLUE_VALIDATION_LOG", g_log_path.c_str(), 1);
    } else {
        g_log_path = preset;
        g_log_seen = logSize();
    }
    doctest::Context context(argc, argv);
    int rc = context.run();
    collect("(after the last test case)");
    if (!g_findings.empty()) {
        std::fprintf(stderr, "\n[validation] %zu test case(s) produced validation messages "
                             "(from any device, thread or child process; log %s):\n",
                     g_findings.size(), g_log_path.c_str());
        for (const Finding& f : g_findings) {
            std::string text = f.messages.size() > 4000 ? f.messages.substr(0, 4000) + "...\n"
                                                         : f.messages;
            std::fprintf(stderr, "[validation] during %s:\n%s", f.test.c_str(), text.c_str());
        }
        if (rc == 0) rc = 1;
    } else if (own_log) {
        std::remove(g_log_path.c_str());
    }
    return rc;
}
