"""What a launched script sees of its own file: an absolute ``__file__``, as under torchrun.

``python -u script.py`` (what torchrun runs) gives the script an absolute ``__file__`` while
``sys.argv[0]`` stays as typed, so a script that changes directory still finds the files
next to it.
"""

from __future__ import annotations

import json
import os

import pytest
from launch_helpers import clean_env, monarch_launch

READS_ITS_NEIGHBOUR = """
import json, os, sys, tempfile
here = os.path.dirname(__file__)
os.chdir(tempfile.gettempdir())
with open(os.path.join(here, "settings.json")) as fp:
    settings = json.load(fp)
print(json.dumps({
    "rank": os.environ["RANK"],
    "file": __file__,
    "argv0": sys.argv[0],
    "setting": settings["lr"],
    "name": __name__,
}), flush=True)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("start", [[], ["--preload", "json"]], ids=["exec", "preload"])
def test_script_file_is_absolute_and_argv0_as_typed(scripts, start):
    scripts.write("reads_neighbour.py", READS_ITS_NEIGHBOUR)
    (scripts.root / "settings.json").write_text(json.dumps({"lr": 0.5}))
    r = monarch_launch(
        "--nproc-per-node", "2", *start, "reads_neighbour.py", env=clean_env(), cwd=scripts.root
    )
    assert r.rc == 0, r
    seen = sorted(
        (json.loads(line) for line in r.out.splitlines() if line.startswith("{")), key=lambda d: d["rank"]
    )
    assert [d["rank"] for d in seen] == ["0", "1"], r
    for d in seen:
        assert d["file"] == os.path.join(str(scripts.root), "reads_neighbour.py")
        assert d["argv0"] == "reads_neighbour.py"
        assert d["setting"] == 0.5
        assert d["name"] == "__main__"
