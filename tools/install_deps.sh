#!/usr/bin/env bash
# Installs BlueVM's build and run dependencies from Debian 12's packages (needs root or sudo).
set -euo pipefail
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
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages already installed"
  exit 0
fi
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
