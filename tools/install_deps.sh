#!/usr/bin/env bash
# Installs BlueVM's build and run dependencies from Debian 12's packages (needs root or sudo),
# then the npm client test's packages (tests/openai_client: `npm ci`, from its lock file). The npm
# step is optional: without nodejs/npm or the registry it says why and the script still succeeds;
# tools/test.sh then lets the openai client test skip instead of requiring it.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(
  build-essential cmake pkg-config ccache
  libvulkan-dev libvulkan-volk-dev glslang-dev glslang-tools spirv-tools
  mesa-vulkan-drivers vulkan-validationlayers vulkan-tools
  doctest-dev libcli11-dev nlohmann-json3-dev libcpp-httplib-dev libicu-dev zlib1g-dev
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages already installed"
else
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The openai npm client test (optional): node and npm from Debian when missing, then `npm ci`.
# Success leaves tests/openai_client/.npm_ci_ok, which makes tools/test.sh require that test.
rm -f tests/openai_client/.npm_ci_ok
npm_skip() {
  echo "install_deps: openai client test skipped: $1"
  exit 0
}
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends nodejs npm; } ||
    npm_skip "cannot install nodejs and npm with apt"
fi
node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
[ "$node_major" -ge 18 ] || npm_skip "node $(node --version 2>/dev/null) is older than 18 (the openai package needs 18)"
if ! (cd tests/openai_client && npm ci --no-audit --no-fund --loglevel=error); then
  npm_skip "npm ci in tests/openai_client failed (offline, or no access to the npm registry)"
fi
touch tests/openai_client/.npm_ci_ok
echo "install_deps: openai client test ready (tests/openai_client/node_modules)"
