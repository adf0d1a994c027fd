// The test binary's entry point. Tests find shared data (../shared) relative to the source tree.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
