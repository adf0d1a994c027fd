// A one-line progress bar on stderr for long CLI jobs (quantizing, writing synthetic models,
// loading weights onto the device).
// It draws only when stderr is a terminal, so logs and pipes stay clean.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace blue::cli {

class ProgressBar {
  public:
    // `label` starts the line ("quantizing"). Draws nothing unless stderr is a terminal.
    explicit ProgressBar(std::string label);
    ~ProgressBar();  // clears the line if one was drawn
    ProgressBar(const ProgressBar&) = delete;
    ProgressBar& operator=(const ProgressBar&) = delete;

    // Records progress (`done` of `total` bytes) and redraws at most every 100 ms, and always when
    // done reaches total.
    void update(uint64_t done, uint64_t total);
    // Clears the line so the next message starts on a clean one.
    void finish();
    bool enabled() const { return enabled_; }

  private:
    std::string label_;
    bool enabled_ = false;
    bool drawn_ = false;
    std::chrono::steady_clock::time_point start_, last_draw_;
};

// A load callback (EngineOptions::on_load) drawing `bar`; when the load completes it clears the
// bar and calls `then` once (e.g. to print the prompt on the line the bar used).
std::function<void(uint64_t, uint64_t)> loadProgress(ProgressBar& bar, std::function<void()> then = {});

}  // namespace blue::cli
