// bluevm: runs Blue-IR programs on a Vulkan GPU (or lavapipe on a CPU).
#include <cstdio>
#include <map>

#include "host/cli/commands.h"

namespace blue::cli {

int fail(const std::string& message) {
    std::fprintf(stderr, "bluevm: %s\n", message.c_str());
    return 1;
}

}  // namespace blue::cli

int main(int argc, char** argv) {
    CLI::App app{"bluevm: a virtual machine that runs on the GPU"};
    app.require_subcommand(1);
    std::map<CLI::App*, blue::cli::Command> commands;
    auto add = [&](blue::cli::Command (*f)(CLI::App&)) {
        size_t before = app.get_subcommands({}).size();
        blue::cli::Command cmd = f(app);
        commands[app.get_subcommands({})[before]] = cmd;
    };
    add(&blue::cli::addRunCommand);
    add(&blue::cli::addDevicesCommand);
    add(&blue::cli::addInfoCommand);
    add(&blue::cli::addQuantizeCommand);
    add(&blue::cli::addGenerateCommand);
    add(&blue::cli::addTokenizeCommand);
    add(&blue::cli::addBenchCommand);
    add(&blue::cli::addDetokenizeCommand);
    add(&blue::cli::addServeCommand);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    for (auto& [sub, cmd] : commands) {
        if (sub->parsed()) return cmd();
    }
    return 2;
}
