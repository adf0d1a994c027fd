// `bluevm devices`: lists Vulkan devices with the features and limits BlueVM uses.
#include <cstdio>

#include "host/cli/commands.h"
#include "host/device.h"

namespace blue::cli {

Command addDevicesCommand(CLI::App& app) {
    CLI::App* sub = app.add_subcommand("devices", "List Vulkan devices and what BlueVM uses of them");
    (void)sub;
    return [] {
        auto list = listDevices();
        if (!list) return fail(list.message());
        for (const DeviceInfo& d : list.value()) {
            std::printf("%u: %s (%s)\n", d.index, d.name.c_str(), d.type.c_str());
            std::printf("   driver: %s, Vulkan %s\n", d.driver.c_str(), d.api.c_str());
            std::printf("   device-local memory %.1f GiB%s; largest storage binding %.0f MiB; "
                        "largest allocation %.0f MiB\n",
                        double(d.device_local_bytes) / (1ull << 30),
                        d.unified_memory ? " (host-mappable)" : "",
                        double(d.max_storage_buffer_range) / (1 << 20),
                        double(d.max_allocation) / (1 << 20));
            std::printf("   workgroups: max count %u x %u x %u, max %u invocations; subgroup %u; "
                        "min storage offset alignment %u\n",
                        d.max_workgroup_count[0], d.max_workgroup_count[1], d.max_workgroup_count[2],
                        d.max_workgroup_invocations, d.subgroup_size, d.min_storage_offset_alignment);
            std::string feats;
            for (const auto& [name, ok] : d.features) feats += (feats.empty() ? "" : ", ") + name + (ok ? " yes" : " no");
            std::printf("   features: %s\n", feats.c_str());
            std::printf("   usable by BlueVM: %s\n", d.missing.empty() ? "yes" : ("no, lacks " + d.missing).c_str());
        }
        if (list->empty()) std::printf("no Vulkan devices\n");
        return 0;
    };
}

}  // namespace blue::cli
