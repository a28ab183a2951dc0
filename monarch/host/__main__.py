"""``python -m monarch.host``: run a host agent (see ``--help``)."""

from monarch._src.host.agent import run

if __name__ == "__main__":
    run()
