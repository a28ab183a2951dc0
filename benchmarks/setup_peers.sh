#!/usr/bin/env bash
# Idempotently create the peer venvs used by benchmarks/run_all.py:
#   .venvs/torchmonarch : Meta's torchmonarch 0.7.0 (also imports as `monarch`,
#                         so it must never be installed into the checkout's .venv)
#   .venvs/ray          : Ray (pinned) + numpy
# Usage: bash benchmarks/setup_peers.sh [--force]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENVS="$ROOT/.venvs"
PY="${PYTHON:-python3}"
TORCHMONARCH_VERSION="0.7.0"
RAY_VERSION="2.60.0"          # pinned: the version pip resolved when this was written
NUMPY_SPEC="numpy"

FORCE=0
[[ "${1:-}" == "--force" ]] && FORCE=1

mkdir -p "$VENVS"

# pip, minus the harmless warnings about this machine's empty extra-index folders
pipq() { "$@" 2>&1 | { grep -v "neither a file nor a directory" || true; }; }

make_venv() {  # name
  local d="$VENVS/$1"
  if [[ $FORCE == 1 ]]; then rm -rf "$d"; fi
  if [[ ! -x "$d/bin/python" ]]; then
    echo "[setup_peers] creating $d"
    "$PY" -m venv "$d"
    pipq "$d/bin/python" -m pip install -q --upgrade pip
  fi
}

# --- torchmonarch ---------------------------------------------------------
make_venv torchmonarch
TM="$VENVS/torchmonarch/bin/python"
if ! "$TM" -c "import importlib.metadata as m, sys; sys.exit(m.version('torchmonarch') != '$TORCHMONARCH_VERSION')" 2>/dev/null; then
  echo "[setup_peers] installing torchmonarch==$TORCHMONARCH_VERSION"
  pipq "$TM" -m pip install -q "torchmonarch==$TORCHMONARCH_VERSION" $NUMPY_SPEC
fi
# The actor API must import. torchmonarch may need torch; if so, use ONLY the
# pinned CPU wheel that lies on local disk (an unpinned torch pulls CUDA builds).
if ! "$TM" -c "from monarch.actor import Actor, endpoint, this_host, this_proc" >/dev/null 2>&1; then
  echo "[setup_peers] monarch.actor does not import without torch; installing torch==2.13.0"
  pipq "$TM" -m pip install -q "torch==2.13.0"
  "$TM" -c "from monarch.actor import Actor, endpoint, this_host, this_proc"
fi
echo "[setup_peers] torchmonarch ok: $("$TM" -c "import importlib.metadata as m; print(m.version('torchmonarch'))")"

# --- ray ------------------------------------------------------------------
make_venv ray
RP="$VENVS/ray/bin/python"
if ! "$RP" -c "import importlib.metadata as m, sys; sys.exit(m.version('ray') != '$RAY_VERSION')" 2>/dev/null; then
  echo "[setup_peers] installing ray==$RAY_VERSION"
  pipq "$RP" -m pip install -q "ray==$RAY_VERSION" $NUMPY_SPEC
fi
"$RP" -c "import ray, numpy"
echo "[setup_peers] ray ok: $("$RP" -c "import ray; print(ray.__version__)")"
