// Preloaded into the sanitizer run of the tests (tools/test_sanitize.sh): dlclose keeps every
// library mapped. The Vulkan loader unloads the driver and the layers when the last instance is
// destroyed; LeakSanitizer, which reports at exit, then names their frames "<unknown module>" and
// their globals no longer hold what they point to. Kept mapped, leaks inside them are attributed
// to their own modules, which tests/sanitizers/lsan.supp can suppress by name without touching
// BlueVM's frames. (Newer loaders offer VK_LOADER_DISABLE_DYNAMIC_LIBRARY_UNLOADING for this;
// Debian 12's 1.3.239 does not.)
#include <dlfcn.h>

int dlclose(void* handle) {
    (void)handle;
    return 0;
}
