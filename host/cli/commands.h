// The bluevm subcommands. Each registers its options on the CLI11 app and returns the process
// exit code: 0 success, 1 an error the user can fix (message already printed), 3 the program
// itself failed (faults, watchdog).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

namespace blue::cli {

using Command = std::function<int()>;

Command addRunCommand(CLI::App& app);
Command addDevicesCommand(CLI::App& app);
Command addInfoCommand(CLI::App& app);
Command addQuantizeCommand(CLI::App& app);
Command addGenerateCommand(CLI::App& app);

// Prints "bluevm: message" to stderr and returns 1.
int fail(const std::string& message);

}  // namespace blue::cli
