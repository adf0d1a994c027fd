/* The volk meta-loader, compiled once from Debian's libvulkan-volk-dev. */
#define VOLK_IMPLEMENTATION
#include <volk.h>
