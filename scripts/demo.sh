#!/usr/bin/env bash
# The README's first command: builds `drama` (the same build the test command uses, so the
# two compile once together) and speaks a sentence with the built-in demo checkpoint.
# On Linux without a Vulkan driver it first installs Mesa's lavapipe (software Vulkan), and
# without cmake (which builds libopus, for Opus output) cmake.
#
# Usage: scripts/demo.sh ["text"] [out.wav]
#   text     what to say (default: a greeting)
#   out.wav  where to write it, relative to the folder you call the script from
#            (default: hello.wav there; `-` writes the WAV to standard output)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
missing=()
if [[ "$(uname)" == Linux ]]; then
  ls /usr/share/vulkan/icd.d/*.json >/dev/null 2>&1 || missing+=(mesa-vulkan-drivers libvulkan1)
  command -v cmake >/dev/null || missing+=(cmake)
fi
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "installing ${missing[*]} (no Vulkan driver: Mesa's lavapipe, software Vulkan; cmake: for libopus)" >&2
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# A fixed seed: the demo says the same thing every time (see README, "The demo").
exec cargo run --manifest-path "$root/Cargo.toml" --locked -p drama-cli -- \
  synth --seed 1 --text "${1:-Hello from drama, the Drama 3 engine.}" -o "${2:-hello.wav}"
