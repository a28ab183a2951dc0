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
# Debian packages some tests need, installed only when missing, and only as root (CI runs as
# root; elsewhere those tests skip and say why): iproute2 (`ip`) for the many-hosts tests'
# clusters of network namespaces (tests/netns.py), and SLURM's daemons, its clients and munge
# for the throw-away SLURM cluster of tests/slurm/ (tests/slurm_cluster.py).
packages=()
has() { PATH="$PATH:/usr/sbin:/sbin" command -v "$1" >/dev/null; }
has ip || packages+=(iproute2)
has slurmctld || packages+=(slurmctld)
has slurmd || packages+=(slurmd)
has sbatch || packages+=(slurm-client)
has munged || packages+=(munge)
if [ ${#packages[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  # Quiet unless it fails: then everything apt said goes to stderr, and setup goes on.
  if ! log=$( { apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}"; } 2>&1); then
    # The tests that need them skip and say why; everything else still runs.
    printf '%s\n' "$log" >&2
    echo "setup.sh: warning: installing ${packages[*]} with apt-get failed (see above)" >&2
  fi
fi
