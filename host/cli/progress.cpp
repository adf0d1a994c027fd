// The stderr progress bar (see progress.h).
#include "host/cli/progress.h"

#include <unistd.h>

#include <cstdio>
#include <utility>

namespace blue::cli {

namespace {

constexpr int kBarWidth = 30;
constexpr auto kRedrawInterval = std::chrono::milliseconds(100);
// Jobs shorter than this draw nothing: a bar is for loading that takes more than a moment.
constexpr auto kFirstDraw = std::chrono::milliseconds(300);

}  // namespace

ProgressBar::ProgressBar(std::string label)
    : label_(std::move(label)),
      enabled_(isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

ProgressBar::~ProgressBar() {
    finish();
}

void ProgressBar::update(uint64_t done, uint64_t total) {
    if (!enabled_) return;
    auto now = std::chrono::steady_clock::now();
    if (!drawn_ && now - start_ < kFirstDraw) return;
    if (done < total && drawn_ && now - last_draw_ < kRedrawInterval) return;
    last_draw_ = now;
    double frac = total ? double(done) / double(total) : 1.0;
    if (frac > 1.0) frac = 1.0;
    int filled = int(frac * kBarWidth);
    char bar[kBarWidth + 1];
    for (int i = 0; i < kBarWidth; ++i) bar[i] = i < filled ? '#' : '.';
    bar[kBarWidth] = '\0';
    double seconds = std::chrono::duration<double>(now - start_).count();
    std::fprintf(stderr, "\r%s [%s] %3d%%  %.1f/%.1f MB  %.1f s\x1b[K", label_.c_str(), bar,
                 int(frac * 100.0), double(done) / 1e6, double(total) / 1e6, seconds);
    std::fflush(stderr);
    drawn_ = true;
}

void ProgressBar::finish() {
    if (!drawn_) return;
    std::fprintf(stderr, "\r\x1b[K");
    std::fflush(stderr);
    drawn_ = false;
}


std::function<void(uint64_t, uint64_t)> loadProgress(ProgressBar& bar, std::function<void()> then) {
    return [&bar, then = std::move(then), called = false](uint64_t done, uint64_t total) mutable {
        bar.update(done, total);
        if (done >= total && !called) {
            called = true;
            bar.finish();
            if (then) then();
        }
    };
}

}  // namespace blue::cli
