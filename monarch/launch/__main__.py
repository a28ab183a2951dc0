"""``python -m monarch.launch`` (and the ``monarch-launch`` console script): a drop-in torchrun."""

from __future__ import annotations

import sys


def main() -> int:
    """Run the launcher on ``sys.argv`` and return its exit status (the console script's entry)."""
    from monarch._src.launch.main import main as _main

    return _main()


if __name__ == "__main__":
    sys.exit(main())
