#!/usr/bin/env bash
# Installs everything on a fresh Debian 12 (bookworm) machine: Nsight Systems, the NVTX library and
# Chromium from Debian (non-free for nsys), then a virtualenv .venv with dlprof and its test tools.
# Usage: ./install.sh            (system packages need root or sudo; set DLPROF_SKIP_APT=1 to skip them)
set -euo pipefail
cd "$(dirname "$0")"

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

if [ -z "${DLPROF_SKIP_APT:-}" ] && command -v apt-get >/dev/null 2>&1; then
  if ! grep -rqsE "bookworm.*non-free|Components:.*non-free" /etc/apt/sources.list /etc/apt/sources.list.d/; then
    echo "Adding Debian bookworm contrib/non-free (Nsight Systems lives there)"
    printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: contrib non-free\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      | $SUDO tee /etc/apt/sources.list.d/dlprof-nonfree.sources >/dev/null
  fi
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q nsight-systems libnvtoolsext1 chromium chromium-driver
  # The nsys CLI looks for its importer here; without the link it writes only a .qdstrm.
  if [ -d /usr/lib/nsight-systems/host-linux-x64 ]; then
    $SUDO mkdir -p /usr/lib/x86_64-linux-gnu/nsight-systems
    $SUDO ln -sfn /usr/lib/nsight-systems/host-linux-x64 /usr/lib/x86_64-linux-gnu/nsight-systems/host-linux-x64
  fi
fi

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test,dask]" -r requirements-test.txt
echo "Installed: $(.venv/bin/dlprof --version). Activate with: source .venv/bin/activate"
