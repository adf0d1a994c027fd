// The bluevm subcommands. Each registers its options on the CLI11 app and returns the process
// exit code: 0 success, 1 an error the user can fix (message already printed), 3 the program
// itself failed (faults, watchdog).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

#include "host/machine.h"

namespace blue::cli {

using Command = std::function<int()>;

Command addRunCommand(CLI::App& app);
Command addDevicesCommand(CLI::App& app);
Command addInfoCommand(CLI::App& app);
Command addQuantizeCommand(CLI::App& app);
Command addGenerateCommand(CLI::App& app);
Command addTokenizeCommand(CLI::App& app);
Command addBenchCommand(CLI::App& app);
Command addDetokenizeCommand(CLI::App& app);
Command addServeCommand(CLI::App& app);

// `bluevm run M.bir --prompt ...` for a module lowered from a model: generates like `generate`.
int runGenerationModule(const std::string& path, const std::string& prompt, int32_t n_predict,
                        float temperature, uint32_t seed, uint32_t instances, bool stats,
                        const std::string& device);

// Registers --device-limits NAME|FILE on a command that opens a device: it sets
// BLUE_DEVICE_LIMITS for this process, which Device::create reads (host/device_profile.h).
void addDeviceLimitsOption(CLI::App* sub);
// --vram-budget SIZE (bytes, or with a unit: 512M, 2GiB; K/M/G are powers of 1024).
// --host-weights read|stream|auto: how kernels reach the weights beyond the budget.
void addVramBudgetOption(CLI::App* sub, uint64_t* bytes, GpuOptions::HostWeights* mode, bool* expert_cache);
// --kv-page PS and --kv-pool N (paged KV caches: EngineOptions::kv_page, kv_pool); `pool_default`
// says what N is when left out, as the command sizes it.
void addKvPageOptions(CLI::App* sub, uint32_t* page, uint32_t* pool, const char* pool_default);

// Prints "bluevm: message" to stderr and returns 1.
int fail(const std::string& message);

}  // namespace blue::cli
