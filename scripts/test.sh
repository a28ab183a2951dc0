#!/usr/bin/env bash
# Run the whole test suite. pytest's "no tests collected" (exit 5) is a failure here.
set -uo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
