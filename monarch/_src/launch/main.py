"""``python -m monarch.launch``: parse torchrun's command line, run the agent, exit like torchrun.

Exit codes: 0 when every worker exited 0; 1 when workers failed (after the torchrun-format
summary), when the launcher was stopped by one of ``--signals-to-handle``, or for a bad
value; 2 for command-line syntax errors (argparse).

Signals: those in ``--signals-to-handle`` (default SIGTERM, SIGINT, SIGHUP, SIGQUIT) are
forwarded to every worker's process group, SIGKILL follows after ``--shutdown-timeout``
seconds (a second signal kills at once), then the launcher exits 1. SIGUSR1, unless it is
in that list, prints the Python stacks of every rank instead. The launcher never imports
torch.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from .cli import parse_args_or_exit
from .command import build_worker_command
from .config import LaunchConfigError

__all__ = ["main"]

PROG = "python -m monarch.launch"


def _write_parent_error_file(outcome: Any, launcher_env: dict[str, str]) -> None:
    """torchrun's ``@record`` on its own main: copy the root cause's error file to ours."""
    path = launcher_env.get("TORCHELASTIC_ERROR_FILE")
    if not path or outcome.error is None:
        return
    _, root = outcome.error.get_first_failure()
    if root.error_data is None:
        return
    data = json.loads(json.dumps(root.error_data))
    if root.exitcode and isinstance(data.get("message"), dict):
        data["message"]["errorCode"] = root.exitcode
    try:
        with open(path, "w") as fp:
            json.dump(data, fp)
    except OSError:
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Run a launch from a torchrun command line; returns the exit code."""
    launcher_env = dict(os.environ)  # what workers inherit, before anything else runs
    config = parse_args_or_exit(argv, launcher_env)
    try:
        command = build_worker_command(config, environ=launcher_env)
    except LaunchConfigError as err:
        sys.stderr.write(f"{PROG}: error: {err.format()}\n")
        return 1

    from monarch._src.runtime import output_writer

    from .agent import Agent, Target
    from .logs import launcher_logger
    from .summary import format_rank_summary
    from .worker_env import OMP_BANNER, needs_omp_banner

    log = launcher_logger()
    for notice in config.notices:
        log.warning(notice)
    if needs_omp_banner(config, launcher_env):
        log.warning(OMP_BANNER)
    if config.numa_binding:
        log.warning("--numa-binding=%s is accepted but not applied by monarch.launch", config.numa_binding)

    try:
        agent = Agent(
            config, Target(command=command, name=command.summary_name), launcher_env=launcher_env, log=log
        )
    except ValueError as err:
        sys.stderr.write(f"{PROG}: error: {err}\n")
        return 1

    handled = set(config.resolved_signals())
    previous: dict[signal.Signals, Any] = {}

    def on_signal(signum: int, frame: Any) -> None:
        agent.signal(signum)

    def on_usr1(signum: int, frame: Any) -> None:
        agent.dump_stacks("SIGUSR1")

    for sig in handled:
        try:
            previous[sig] = signal.signal(sig, on_signal)
        except (OSError, ValueError):
            log.warning("Failed to register signal handler for %s", sig.name)
    if signal.SIGUSR1 not in handled:
        previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, on_usr1)

    # The launcher owns its workers' failures; nothing reaches the client's fault hook,
    # but if something did, it must not end the launcher behind the agent's back.
    import monarch.actor as public

    public.unhandled_fault_hook = lambda failure: log.debug("ignored: %s", failure)

    try:
        outcome = agent.run()
    except Exception as err:  # the launcher itself could not run the job (say, a busy port)
        output_writer.flush_all(2.0)
        log.error("the launch failed: %s: %s", type(err).__name__, err, exc_info=log.isEnabledFor(10))
        return 1
    output_writer.flush_all(2.0)
    if config.summary:
        state = {"succeeded": "succeeded", "failed": "FAILED", "signaled": "stopped by a signal"}[
            outcome.state
        ]
        sys.stderr.write(
            format_rank_summary(
                outcome.reports, attempts=outcome.attempts, max_restarts=config.max_restarts, outcome=state
            )
            + "\n"
        )
    if outcome.state == "failed" and outcome.error is not None:
        _write_parent_error_file(outcome, launcher_env)
        sys.stderr.write(f"monarch.launch.ChildFailedError: {outcome.error.format_msg()}\n")
    elif outcome.state == "signaled":
        sys.stderr.write(
            f"monarch.launch.SignalException: Process {os.getpid()} got signal: {outcome.signum}\n"
        )
    sys.stderr.flush()
    for sig, handler in previous.items():
        try:
            signal.signal(sig, handler)
        except (OSError, ValueError, TypeError):
            pass
    return outcome.exit_code
