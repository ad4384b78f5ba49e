#!/usr/bin/env bash
# The README's first command: speak a sentence with the built-in demo checkpoint.
# On Linux without a Vulkan driver it first installs Mesa's lavapipe (software Vulkan).
# Usage: scripts/demo.sh ["text"] [out.wav]
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "$(uname)" == Linux ]] && ! ls /usr/share/vulkan/icd.d/*.json >/dev/null 2>&1; then
  echo "no Vulkan driver found: installing Mesa's lavapipe (software Vulkan)" >&2
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq mesa-vulkan-drivers libvulkan1 >/dev/null
fi
exec cargo run --release --locked -p drama-cli -- synth --text "${1:-Hello from drama, the Drama 3 engine.}" -o "${2:-hello.wav}"
