// A child process with its stdout and stderr read through pipes: how tests run the command-line
// programs as a user does.
#pragma once

#include <doctest/doctest.h>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

namespace blue::test {

struct Child {
    pid_t pid = -1;
    int out = -1, err = -1;
    std::string out_text, err_text;

    explicit Child(const std::vector<std::string>& args) {
        int po[2], pe[2];
        REQUIRE(pipe(po) == 0);
        REQUIRE(pipe(pe) == 0);
        pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            dup2(po[1], 1);
            dup2(pe[1], 2);
            close(po[0]);
            close(pe[0]);
            std::vector<char*> argv;
            for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
            argv.push_back(nullptr);
            execv(argv[0], argv.data());
            _exit(127);
        }
        close(po[1]);
        close(pe[1]);
        out = po[0];
        err = pe[0];
    }
    ~Child() {
        if (pid > 0) {
            kill(pid, SIGKILL);
            waitpid(pid, nullptr, 0);
        }
        if (out >= 0) close(out);
        if (err >= 0) close(err);
    }
    // Reads whatever arrives within `ms`; a pipe that reaches its end is closed.
    void pump(int ms) {
        pollfd fds[2] = {{out, POLLIN, 0}, {err, POLLIN, 0}};
        if (poll(fds, 2, ms) <= 0) return;
        char buf[4096];
        for (int k = 0; k < 2; ++k) {
            int& fd = k == 0 ? out : err;
            if (fd < 0 || !(fds[k].revents & (POLLIN | POLLHUP))) continue;
            ssize_t got = read(fd, buf, sizeof buf);
            if (got > 0) {
                (k == 0 ? out_text : err_text).append(buf, size_t(got));
            } else {
                close(fd);
                fd = -1;
            }
        }
    }
    // Waits for the exit, collecting output; returns the exit code (-1: killed or timed out).
    int wait(int timeout_s = 300) {
        auto until = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
        while ((out >= 0 || err >= 0) && std::chrono::steady_clock::now() < until) pump(100);
        if (out >= 0 || err >= 0) {
            MESSAGE("the child ran past " << timeout_s << " s: killed");
            kill(pid, SIGKILL);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
};

}  // namespace blue::test
