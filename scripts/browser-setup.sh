#!/usr/bin/env bash
# Makes sure the status page's browser test can run here: headless Chromium and its
# WebDriver server (Debian: `chromium`, `chromium-driver`). The test starts
# chromedriver itself on a free port of 127.0.0.1 and kills it by its process group.
#
# Installs what is missing with apt-get when it can (as root, or with passwordless
# sudo); otherwise fails, saying what to install.
set -euo pipefail

packages="chromium chromium-driver"

missing() {
  local need=()
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
  command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
  echo "${need[*]:-}"
}

need=$(missing)
if [ -z "$need" ]; then
  echo "browser test prerequisites present: $(command -v chromium), $(command -v chromedriver)"
  exit 0
fi

echo "browser test prerequisites missing: $need"
if command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    as_root=()
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    as_root=(none)
  fi
  if [ "${as_root[0]:-}" != none ]; then
    echo "installing: $packages"
    "${as_root[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq $packages
    need=$(missing)
    if [ -z "$need" ]; then
      echo "installed: $(chromium --version 2>/dev/null | head -1), $(chromedriver --version | head -1)"
      exit 0
    fi
    echo "still missing after apt-get install: $need" >&2
  fi
fi

{
  echo "error: the browser test needs $need, and this script could not install it."
  echo "Install (Debian/Ubuntu, as root):"
  echo "    apt-get update && apt-get install -y $packages"
} >&2
exit 1
