#!/bin/bash
# Packs this build for a machine with a GPU and no build environment (a lent test machine, a
# cluster node): the stripped binaries, the libraries they need that such a machine may lack
# (Debian 12's Vulkan loader, libglvnd, ICU, cpp-httplib), the Khronos validation layer, and
# ../shared's stories260K and tokenizer vectors, in one tar.xz with a run.sh.
#
#   bash tools/pack_for_gpu.sh /tmp/bluevm-gpu.tar.xz      # after tools/build.sh
#   # there, in a checkout of the same commit:
#   mkdir .pack && tar xJf bluevm-gpu.tar.xz -C .pack
#   bash .pack/run.sh build/tests/blue_tests -tc='ops gpu*'   # BLUE_VALIDATION=1 is set
#   bash .pack/run.sh bash tools/test_shards.sh 6 /tmp/shards  # the whole suite, 6 processes
#
# run.sh puts the binaries under build/, links the source path the tests were built with to the
# checkout when it differs (BLUE_SOURCE_DIR is compiled in), finds NVIDIA's ICD where the
# driver mounts it, and runs the command with the validation layer on.
set -euo pipefail
out=${1:?usage: tools/pack_for_gpu.sh OUT.tar.xz}
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build
shared=${BLUE_SHARED:-$root/../shared}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
bins=(host/bluevm tests/blue_tests compiler/bluec tools/synth/blue-synth tools/blue-capi-example)
for b in "${bins[@]}"; do
    [ -x "$build/$b" ] || { echo "pack_for_gpu: $build/$b is missing; run tools/build.sh first" >&2; exit 1; }
    mkdir -p "$stage/build/$(dirname "$b")"
    strip -o "$stage/build/$b" "$build/$b"
done
# Libraries beside glibc and the C++ runtime, which any x86-64 Linux of the last years has.
mkdir -p "$stage/lib" "$stage/layers" "$stage/shared/models"
for b in "${bins[@]}"; do ldd "$build/$b"; done | awk '/=> \//{print $3}' | sort -u |
    grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' | xargs -r -I{} cp -L {} "$stage/lib/"
cp -L /usr/lib/x86_64-linux-gnu/libvulkan.so.1 "$stage/lib/"
# NVIDIA's Vulkan ICD is libGLX_nvidia, which needs libglvnd's dispatch libraries.
debs=$(mktemp -d)
(cd "$debs" && apt-get download libglvnd0 libglx0 libegl1 libgl1 >/dev/null 2>&1) ||
    echo "pack_for_gpu: apt-get download of libglvnd failed; the target must have it" >&2
for d in "$debs"/*.deb; do [ -e "$d" ] && dpkg -x "$d" "$debs/x"; done
[ -d "$debs/x" ] && find "$debs/x" -name '*.so.*' -exec cp -L {} "$stage/lib/" \;
rm -rf "$debs"
strip -o "$stage/layers/libVkLayer_khronos_validation.so" /usr/lib/x86_64-linux-gnu/libVkLayer_khronos_validation.so
sed 's#"library_path": "libVkLayer#"library_path": "./libVkLayer#' \
    /usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json > "$stage/layers/VkLayer_khronos_validation.json"
cp -r "$shared/models/stories260K" "$stage/shared/models/"
cp -r "$shared/vocab" "$stage/shared/"
cat > "$stage/run.sh" <<EOF
#!/bin/bash
# Runs a command of the packed BlueVM build from the checkout's root (tools/pack_for_gpu.sh).
pack=\$(cd "\$(dirname "\$0")" && pwd)
mkdir -p build && cp -r "\$pack/build/." build/
src="$root"
if [ "\$PWD" != "\$src" ] && [ ! -e "\$src" ]; then mkdir -p "\$(dirname "\$src")" && ln -s "\$PWD" "\$src"; fi
export LD_LIBRARY_PATH="\$pack/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do [ -d \$d ] && LD_LIBRARY_PATH=\$LD_LIBRARY_PATH:\$d; done
for f in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json; do
    [ -z "\${VK_DRIVER_FILES:-}" ] && [ -f \$f ] && export VK_DRIVER_FILES=\$f
done
export VK_LAYER_PATH="\$pack/layers" BLUE_SHARED="\$pack/shared" BLUE_VALIDATION=\${BLUE_VALIDATION:-1}
export XDG_RUNTIME_DIR=\${XDG_RUNTIME_DIR:-/tmp}
exec "\$@"
EOF
chmod +x "$stage/run.sh"
tar -C "$stage" -cf - . | xz -T0 -6 > "$out"
echo "pack_for_gpu: $out ($(du -h "$out" | cut -f1))"
