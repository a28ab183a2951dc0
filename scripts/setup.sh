#!/usr/bin/env bash
# Create .venv with monarch-aio (editable) and its test dependencies. Idempotent.
# torch is pinned to the CPU build on this machine's disk; never let an unpinned torch in.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip >/dev/null 2>&1 || true
# The editable install is a plain path entry (pyproject's package-dir), not setuptools'
# import-hook finder, whose import (pathlib, re, ...) every Python process would pay, spawned
# workers included.
.venv/bin/pip install -q -e ".[test]"
if [ "${MONARCH_SKIP_TORCH:-0}" != "1" ]; then
  .venv/bin/pip install -q "torch==2.13.0"
fi
# The many-hosts tests build clusters of network namespaces with `ip` (tests/netns.py); a fresh
# Debian machine may lack iproute2. Installed only when missing, and only as root.
if ! command -v ip >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2
fi
