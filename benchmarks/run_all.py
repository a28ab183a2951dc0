#!/usr/bin/env python3
"""Run the benchmark for monarch-aio, torchmonarch and Ray in one go and compare.

    bash benchmarks/setup_peers.sh          # once: creates .venvs/torchmonarch and .venvs/ray
    python3 benchmarks/run_all.py [--quick] [--passes N] [--rounds N] [--impls a,b,c]
    python3 benchmarks/run_all.py --floor   # monarch-aio against the raw socket floor only

Each "pass" runs every implementation once, in a rotating order, as its own
subprocess (with a timeout); samples from all passes are pooled and the median
reported, so the three implementations share the machine's noise.
Raw JSON + logs go to benchmarks/out/run-<timestamp>/; the table is printed and
also written to summary.md there (and benchmarks/out/latest.md / latest.json).
Standard library only, so it runs under any python3.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _benchutil import METRICS, RAY_NUM_CPUS, RAY_OBJECT_STORE_BYTES, RAY_PEER_RESOURCE  # noqa: E402

ROOT = os.path.dirname(HERE)

IMPLS = {
    # name: (python, script)
    "monarch-aio": (os.path.join(ROOT, ".venv", "bin", "python"), "bench_monarch_api.py"),
    "torchmonarch": (os.path.join(ROOT, ".venvs", "torchmonarch", "bin", "python"), "bench_monarch_api.py"),
    "ray": (os.path.join(ROOT, ".venvs", "ray", "bin", "python"), "bench_ray.py"),
    # The same messaging workloads with no framework (uvloop + msgpack over Unix sockets).
    "floor": (os.path.join(ROOT, ".venv", "bin", "python"), "bench_floor.py"),
}
OURS, TM, RAY, FLOOR = "monarch-aio", "torchmonarch", "ray", "floor"
#: ``--baseline PYTHON``: monarch-aio from another checkout's interpreter, under this name.
BASELINE = "monarch-aio@baseline"

#: ``--netns``: the suffix of an implementation's name when its client runs in one network
#: namespace and its peer in another (on a host agent; for Ray, on a second node).
NETNS = "@netns"
#: The command line of a host agent listening at ``tcp://ADDRESS`` (``{address}``), for the
#: implementations that can put the peer on another host.
AGENTS = {
    OURS: ["-m", "monarch.host", "--listen", "tcp://{address}", "--log-level", "warning"],
    TM: [
        "-c",
        "from monarch.actor import run_worker_loop_forever as r; "
        "r(ca='trust_all_connections', address='tcp://{address}')",
    ],
}
AGENT_PORT = 4100
#: Ray across namespaces: the head's GCS port, and how long its processes get to exit on SIGTERM
#: before SIGKILL, as `ray stop` does (which cannot be used: it stops every Ray process of the
#: machine, other sessions' too). Most exit at once; the head's GCS server or autoscaler monitor
#: may wait on one another for good (seen: 10 s), hence SIGKILL soon.
RAY_HEAD_PORT = 6379
RAY_STOP_GRACE_S = 3.0
#: Implementations that find their own TCP address by resolving the hostname and refuse a
#: loopback one (torchmonarch: "hostname resolved to no non-loopback, non-link-local address").
#: With ``--netns`` their processes see a private /etc/hosts naming their namespace's address.
RESOLVES_HOSTNAME = {TM}


#: What a target's ratio is taken against (kind -> the name in its description); "abs" targets
#: compare monarch-aio's own value.
REFERENCES = {"vs_tm": "torchmonarch", "vs_ray": "Ray", "vs_floor": "floor"}


def target(op: str, value: float, kind: str = "abs", unit: str = "") -> tuple[str, str, str, float]:
    """(description, kind, op, value): ours/reference (or ours, for "abs") must be op value."""
    desc = f"{op} {value:g}x {REFERENCES[kind]}" if kind in REFERENCES else f"{op} {value:g} {unit}"
    return desc, kind, op, value


#: metric -> (target against the peers, target against the floor under ``--floor``).
TARGETS = {
    "rt_sync_us": (target("<=", 0.1, "vs_tm"), target("<=", 1.5, "vs_floor")),
    "rt_await_us": (target("<=", 0.1, "vs_tm"), target("<=", 1.5, "vs_floor")),
    "outstanding_calls_per_s": (target(">=", 10, "vs_tm"), target(">=", 0.5, "vs_floor")),
    "gather_per_s": (target(">=", 5, "vs_tm"), target(">=", 0.6, "vs_floor")),
    "gather_await_per_s": (None, target(">=", 0.6, "vs_floor")),
    "spawn_s": (target("<=", 0.5, "vs_tm"), None),
    "payload_bytes_mb_per_s": (target(">=", 1.5, "vs_tm"), None),
    "payload_numpy_mb_per_s": (target(">=", 1, "vs_ray"), None),
    "inproc_rt_us": (target("<=", 30, unit="µs"), target("<=", 10, unit="µs")),
    "inproc_rt_await_us": (None, target("<=", 10, unit="µs")),
    "import_s": (target("<=", 0.1, unit="s"), None),
    "idle_worker_rss_mb": (target("<=", 50, unit="MB"), None),
}


def targets_of(floor: bool) -> dict[str, tuple[str, str, str, float]]:
    """The targets a run checks: against the floor (``--floor``) or against the peers."""
    chosen = {m: pair[1 if floor else 0] for m, pair in TARGETS.items()}
    return {m: t for m, t in chosen.items() if t is not None}


_BENCH_LINE = re.compile(r"^\[bench\] (\w+) \.\.\.$")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1 pass, 2 rounds, short loops")
    p.add_argument("--passes", type=int, default=None, help="interleaved passes (default 3, quick 1)")
    p.add_argument("--rounds", type=int, default=None, help="measured rounds per pass (default 2)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument(
        "--loop-s", type=float, default=None, help="seconds per call-loop round (default 1.0, quick 0.4)"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per benchmark subprocess (default 300, quick 180)",
    )
    p.add_argument(
        "--metric-timeout",
        type=float,
        default=None,
        help="per-metric hang limit inside a benchmark (it then exits and is restarted "
        "for the remaining metrics; default 90, quick 45)",
    )
    p.add_argument(
        "--transport", default=None, help="passed to each benchmark (tcp: all of them over loopback TCP)"
    )
    p.add_argument(
        "--client-loop",
        choices=["asyncio", "uvloop"],
        default=None,
        help="passed to each benchmark: the event loop awaited metrics run on (default: each "
        "benchmark's own; monarch-aio: asyncio, the floor: uvloop)",
    )
    p.add_argument(
        "--netns",
        action="store_true",
        help="also run each implementation as <name>@netns: the client in one network namespace, "
        "the peer in another (monarch-aio, torchmonarch: on a host agent; Ray: on the second "
        "node of a two-node cluster) (tests/netns.py; root only); everything over TCP",
    )
    p.add_argument(
        "--impls",
        default=",".join(n for n in IMPLS if n != FLOOR),
        help="comma-separated subset of " + ",".join(IMPLS),
    )
    p.add_argument(
        "--floor",
        action="store_true",
        help="monarch-aio and the floor only, alternately, on the messaging metrics (unless "
        "--metrics says otherwise), with the floor targets",
    )
    p.add_argument(
        "--baseline",
        default=None,
        metavar="PYTHON",
        help=f"also run monarch-aio under this interpreter (another checkout's venv) as {BASELINE}",
    )
    p.add_argument("--metrics", default=None, help="comma-separated subset of metric keys")
    p.add_argument("--out-dir", default=os.path.join(HERE, "out"))
    a = p.parse_args()
    a.passes = a.passes or (1 if a.quick else 3)
    a.rounds = a.rounds or 2
    a.loop_s = a.loop_s or (0.4 if a.quick else 1.0)
    a.metric_timeout = a.metric_timeout or (45.0 if a.quick else 90.0)
    a.timeout = a.timeout or (180.0 if a.quick else 300.0)
    if a.netns and a.transport not in (None, "tcp"):
        p.error("--netns compares over TCP: leave --transport out or say tcp")
    if a.netns:
        a.transport = "tcp"
    if a.floor:
        a.impls = f"{OURS},{FLOOR}"
        a.metrics = a.metrics or ",".join(targets_of(floor=True))
    if a.baseline:
        IMPLS[BASELINE] = (a.baseline, IMPLS[OURS][1])
        a.impls += "," + BASELINE
    return a


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: str, n: int = 15) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [ln.rstrip() for ln in f.readlines()]
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def _last_json_line(path: str) -> dict[str, Any] | None:
    try:
        with open(path, errors="replace") as f:
            lines = f.read().strip().splitlines()
    except OSError:
        return None
    for ln in reversed(lines):
        ln = ln.strip()
        if ln.startswith("{"):
            try:
                return json.loads(ln)
            except ValueError:
                return None
    return None


def _running_metric(stderr_path: str) -> str | None:
    """The metric the benchmark had started last (from its '[bench] X ...' lines)."""
    last = None
    try:
        with open(stderr_path, errors="replace") as f:
            for ln in f:
                m = _BENCH_LINE.match(ln.strip())
                if m:
                    last = m.group(1)
    except OSError:
        pass
    return last


def run_one(name: str, args, run_dir: str, tag: str, metrics: list[str], cluster=None) -> dict[str, Any]:
    impl, netns = name.removesuffix(NETNS), name.endswith(NETNS)
    py, script = IMPLS[impl]
    out_json = os.path.join(run_dir, tag + ".json")
    out_log, err_log = os.path.join(run_dir, tag + ".stdout"), os.path.join(run_dir, tag + ".stderr")
    info: dict[str, Any] = {"impl": name, "tag": tag, "result": None, "error": None}
    if not os.path.exists(py):
        info["error"] = f"interpreter not found: {py} (run benchmarks/setup_peers.sh)"
        return info
    cmd = [
        py,
        os.path.join(HERE, script),
        "--rounds",
        str(args.rounds),
        "--warmup",
        str(args.warmup),
        "--loop-s",
        str(args.loop_s),
        "--metric-timeout",
        str(args.metric_timeout),
        "--out",
        out_json,
        "--metrics",
        ",".join(metrics),
    ]
    if args.transport:
        cmd += ["--transport", args.transport]
    if args.client_loop:
        cmd += ["--client-loop", args.client_loop]
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    # bytecode caching on (this machine sets PYTHONDONTWRITEBYTECODE), but the caches
    # live under benchmarks/out/, never in the source tree.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = os.path.join(args.out_dir, "pycache")
    # cwd outside the checkout: the checkout's monarch/ must not shadow torchmonarch's
    # `monarch` (worker procs are started with `python -c`, which puts cwd on sys.path).
    cwd = os.path.join(run_dir, "cwd")
    os.makedirs(cwd, exist_ok=True)
    t0 = time.perf_counter()
    # The peer's side (exited last) outlives the client.
    with open(out_log, "w") as so, open(err_log, "w") as se, contextlib.ExitStack() as peer_side:
        if cluster is not None and impl in RESOLVES_HOSTNAME:
            # One host: the bridge's address is this (root) namespace's own.
            here = cluster.hosts[0].address if netns else cluster.bridge_address
            cmd = _hostname_at(here, cmd, run_dir)
        if netns:
            client_host = cluster.hosts[0]
            env["MONARCH_TCP_BIND_HOST"] = client_host.address
            env["MONARCH_HOST_SECRET"] = f"bench-{os.getpid()}"
            # Ray's nodes and driver authenticate each other with a token, as monarch's with
            # the secret (Ray's default would be ~/.ray/auth_token, shared by the machine).
            env["RAY_AUTH_MODE"] = "token"
            env["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
            start_peer_side = _ray_cluster if impl == RAY else _host_agent
            try:
                peer_host = peer_side.enter_context(start_peer_side(impl, py, cluster, env, cwd, se, run_dir))
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                info["error"] = f"the peer's side did not start: {e} (log: {err_log})"
                return info
            cmd = cluster.argv(client_host.index, [*cmd, "--peer-host", peer_host])
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=so, stderr=se, stdin=subprocess.DEVNULL, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            _kill_group(proc.pid)  # also reaps worker procs the benchmark left behind
            if rc is None:
                proc.wait()
    info["wall_s"] = round(time.perf_counter() - t0, 1)
    res = _last_json_line(out_log)
    if res is None and os.path.exists(out_json):
        try:
            with open(out_json) as f:
                res = json.load(f)
        except ValueError:
            res = None
    info["result"] = res
    info["rc"] = rc
    info["running_metric"] = _running_metric(err_log)
    if rc is None:
        info["hung_metric"] = info["running_metric"]
        info["error"] = f"timed out after {args.timeout:.0f}s (in metric {info['running_metric']})"
    elif rc == 3 and res and res.get("hung"):
        info["hung_metric"] = info["running_metric"]
        info["error"] = f"{res['hung']} hung (> {args.metric_timeout:.0f}s); process killed"
    elif rc != 0 or res is None:
        tail = [ln for ln in _tail(err_log, 40).splitlines() if ln.strip()]
        exc = [ln for ln in tail if re.match(r"^[\w.]+(Error|Exception|Interrupt|Exit)\b", ln)]
        info["error"] = (
            f"exit code {rc}: "
            + ((exc[-1] if exc else " | ".join(tail[-3:]))[-500:] or "(no stderr)")
            + f" (log: {err_log})"
        )
    return info


@contextlib.contextmanager
def _host_agent(
    impl: str, py: str, cluster, env: dict[str, str], cwd: str, log, run_dir: str
) -> Iterator[str]:
    """A host agent of ``impl`` in the second namespace, for as long as the context lasts; yields
    its ``--peer-host``."""
    agent_host = cluster.hosts[1]
    address = f"{agent_host.address}:{AGENT_PORT}"
    agent_cmd = [py, *(word.format(address=address) for word in AGENTS[impl])]
    if impl in RESOLVES_HOSTNAME:
        agent_cmd = _hostname_at(agent_host.address, agent_cmd, run_dir)
    agent = cluster.popen(
        agent_host.index,
        agent_cmd,
        cwd=cwd,
        env=env,
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait_listening(cluster, agent_host.index, AGENT_PORT, agent)
        yield f"tcp://{address}"
    finally:
        _kill_group(agent.pid)  # the agent and the procs it spawned
        agent.wait()


@contextlib.contextmanager
def _ray_cluster(
    impl: str, py: str, cluster, env: dict[str, str], cwd: str, log, run_dir: str
) -> Iterator[str]:
    """A two-node Ray cluster for as long as the context lasts: the head in the client's namespace,
    a node offering RAY_PEER_RESOURCE (where the peer goes) in the second; yields the head's
    address (the ``--peer-host`` of bench_ray.py). Afterwards no process of it is left, in either
    namespace."""
    ray = os.path.join(os.path.dirname(py), "ray")
    head, peer = cluster.hosts
    head_address = f"{head.address}:{RAY_HEAD_PORT}"
    # Each node its own temp dir (logs, sockets), short: Unix socket paths live under it.
    temp = tempfile.mkdtemp(prefix="raybench-")
    common = ["--disable-usage-stats", f"--object-store-memory={RAY_OBJECT_STORE_BYTES}"]
    head_start = [
        "--head",
        f"--port={RAY_HEAD_PORT}",
        f"--num-cpus={RAY_NUM_CPUS}",
        "--include-dashboard=false",
    ]
    peer_start = [
        f"--address={head_address}",
        "--num-cpus=0",
        "--resources",
        json.dumps({RAY_PEER_RESOURCE: 1000}),
    ]
    try:
        for host, how in ((head, head_start), (peer, peer_start)):
            # `ray start` returns once its node is up, leaving the node's processes as daemons.
            start = [
                ray,
                "start",
                *how,
                *common,
                f"--node-ip-address={host.address}",
                f"--temp-dir={temp}/{host.index}",
            ]
            done = cluster.run(host.index, start, timeout=120, cwd=cwd, env=env, stdout=log, stderr=log)
            if done.returncode != 0:
                raise RuntimeError(
                    f"`ray start` in namespace {host.netns} exited with code {done.returncode}"
                )
        yield head_address
    finally:
        for host in (peer, head):
            cluster.kill_processes(host.index, RAY_STOP_GRACE_S)
        shutil.rmtree(temp, ignore_errors=True)


def _hostname_at(address: str, cmd: list[str], run_dir: str) -> list[str]:
    """``cmd`` in a mount namespace of its own whose /etc/hosts names ``address`` for this
    machine's hostname (root only)."""
    hosts = os.path.join(run_dir, f"hosts-{address}")
    with open(hosts, "w") as f:
        f.write(f"127.0.0.1 localhost\n{address} {socket.gethostname()}\n")
    return ["unshare", "--mount", "--", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', hosts, *cmd]


def _wait_listening(cluster, host: int, port: int, agent: subprocess.Popen, timeout: float = 30.0) -> None:
    """Return once something listens on TCP ``port`` in ``host``'s namespace; raise if ``agent``
    exits first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if agent.poll() is not None:
            raise RuntimeError(f"the host agent exited with code {agent.returncode} before listening")
        done = subprocess.run(
            cluster.argv(host, ["ss", "-Hltn", f"sport = :{port}"]),
            capture_output=True,
            text=True,
            timeout=10,
        )
        if done.stdout.strip():
            return
        time.sleep(0.05)  # polling an external condition: the agent says nothing on stdout
    raise RuntimeError(f"no host agent listening on port {port} after {timeout:.0f} s")


def _cluster(args):
    """Two network namespaces for ``--netns`` (client, agent), or None."""
    if not args.netns:
        return None
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import netns

    reason = netns.unavailable_reason()
    if reason:
        sys.exit(f"--netns: {reason}")
    return netns.Cluster(2).__enter__()


def fmt(metric: str, v: float | None) -> str:
    if v is None:
        return "—"
    for m in METRICS:
        if m.key == metric:
            return m.fmt.format(v) + " " + m.unit
    return str(v)


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def main() -> int:
    args = parse_args()
    names = [n for n in args.impls.split(",") if n]
    for n in names:
        if n not in IMPLS:
            sys.exit(f"unknown impl {n!r}; choose from {list(IMPLS)}")
    cluster = _cluster(args)
    if cluster is not None:
        names = names + [n + NETNS for n in names]
    try:
        return _run_and_report(args, names, cluster)
    finally:
        if cluster is not None:
            cluster.close()


def _run_and_report(args, names: list[str], cluster) -> int:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = os.path.join(args.out_dir, f"run-{stamp}")
    os.makedirs(run_dir, exist_ok=True)

    samples: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    errors: dict[str, list[str]] = {n: [] for n in names}
    meta: dict[str, dict[str, Any]] = {n: {} for n in names}
    skip: dict[str, list[str]] = {n: [] for n in names}  # metrics that hung: not retried
    dead: set = set()  # impls that produced nothing at all
    runs = []

    wanted = [m.key for m in METRICS]
    if args.metrics:
        wanted = [m for m in args.metrics.split(",") if m]

    for p in range(args.passes):
        order = names[p % len(names) :] + names[: p % len(names)]
        for n in order:
            if n in dead:
                continue
            remaining = [m for m in wanted if m not in skip[n]]
            attempt = 0
            while remaining:
                print(
                    f"[run_all] pass {p + 1}/{args.passes}: {n}"
                    + (f" (restart {attempt}: {','.join(remaining)})" if attempt else "")
                    + " ...",
                    file=sys.stderr,
                    flush=True,
                )
                info = run_one(
                    n, args, run_dir, f"{n}.pass{p}" + (f".r{attempt}" if attempt else ""), remaining, cluster
                )
                runs.append({k: v for k, v in info.items() if k != "result"})
                res = info["result"] or {}
                for m, xs in (res.get("samples") or {}).items():
                    samples[n].setdefault(m, []).extend(x for x in xs if x is not None)
                for m, e in (res.get("errors") or {}).items():
                    errors[n].append(f"pass {p + 1}: {m}: {e}")
                for k in ("impl", "monarch_path"):
                    if k in res:
                        meta[n][k] = res[k]
                if res.get("notes"):
                    meta[n].setdefault("notes", {}).update(res["notes"])
                print(
                    f"[run_all]   {n}: {info.get('wall_s', 0)}s"
                    + (f", error: {info['error'][:300]}" if info["error"] else ""),
                    file=sys.stderr,
                    flush=True,
                )
                if not info["error"]:
                    break
                errors[n].append(f"pass {p + 1}: {info['error']}")
                if info.get("hung_metric"):
                    skip[n].append(info["hung_metric"])  # never retried: it would just hang again
                attempted = set((res.get("metrics") or {}).keys())
                if info.get("running_metric"):
                    attempted.add(info["running_metric"])
                if not (res.get("metrics") or {}) and not info.get("running_metric"):
                    dead.add(n)  # died before measuring anything (e.g. import failed)
                    break
                left = [m for m in remaining if m not in attempted and m not in skip[n]]
                if left == remaining:
                    break
                remaining = left
                attempt += 1

    med: dict[str, dict[str, float | None]] = {
        n: {m.key: (statistics.median(samples[n][m.key]) if samples[n].get(m.key) else None) for m in METRICS}
        for n in names
    }

    def get(n: str, m: str) -> float | None:
        return med.get(n, {}).get(m)

    lines = []
    lines.append(
        f"# monarch benchmark {stamp}  (passes={args.passes}, rounds/pass={args.rounds}, "
        f"loop={args.loop_s}s, client loop: {args.client_loop or 'default'}; medians of pooled samples)"
    )
    lines.append("")
    for n in names:
        lines.append(
            f"- **{n}**: {meta[n].get('impl', '?')}"
            + (f" — `monarch` from {meta[n]['monarch_path']}" if meta[n].get("monarch_path") else "")
        )
    lines.append("")
    # More ratio columns with --netns: ours against each peer across namespaces, and each
    # implementation across namespaces against itself on one host.
    pairs = [
        (a, b)
        for a, b in [
            (OURS, FLOOR),
            (OURS, BASELINE),
            (OURS + NETNS, TM + NETNS),
            (OURS + NETNS, RAY + NETNS),
            (OURS + NETNS, OURS),
            (TM + NETNS, TM),
            (RAY + NETNS, RAY),
        ]
        if a in names and b in names
    ]
    targets = targets_of(args.floor)
    hdr = (
        ["metric"]
        + names
        + ["monarch-aio / torchmonarch", "monarch-aio / ray"]
        + [f"{a} / {b}" for a, b in pairs]
        + ["target", "met?"]
    )
    lines.append("| " + " | ".join(hdr) + " |")
    lines.append("|" + "---|" * len(hdr))
    verdicts = {}
    for metric in METRICS:
        m, label = metric.key, metric.label
        if args.metrics and m not in args.metrics.split(","):
            continue
        row = [f"{label} (`{m}`)"] + [fmt(m, get(n, m)) for n in names]
        r_tm = ratio(get(OURS, m), get(TM, m))
        r_ray = ratio(get(OURS, m), get(RAY, m))
        row.append(f"{r_tm:.3g}x" if r_tm is not None else "—")
        row.append(f"{r_ray:.3g}x" if r_ray is not None else "—")
        for a, b in pairs:
            r = ratio(get(a, m), get(b, m))
            row.append(f"{r:.3g}x" if r is not None else "—")
        verdict = "n/a"
        tgt = targets.get(m)
        if tgt:
            desc, kind, op, val = tgt
            x = {
                "vs_tm": r_tm,
                "vs_ray": r_ray,
                "vs_floor": ratio(get(OURS, m), get(FLOOR, m)),
                "abs": get(OURS, m),
            }[kind]
            if x is not None:
                verdict = "yes" if (x <= val if op == "<=" else x >= val) else "NO"
            row.append(desc)
        else:
            row.append("")
        row.append(verdict)
        verdicts[m] = verdict
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append(
        "Ratios are monarch-aio's value divided by the peer's (for µs/s/MB lower is better; "
        "for calls/s, gathers/s, MB/s higher is better)."
    )
    any_err = False
    for n in names:
        if errors[n]:
            if not any_err:
                lines.append("")
                lines.append("## Errors")
                any_err = True
            for e in errors[n]:
                lines.append(f"- {n}: {e}")
    for n in names:
        for m, note in (meta[n].get("notes") or {}).items():
            lines.append(f"- note {n} `{m}`: {note}")
    table = "\n".join(lines) + "\n"

    summary = {
        "stamp": stamp,
        "args": vars(args),
        "medians": med,
        "samples": samples,
        "errors": errors,
        "meta": meta,
        "runs": runs,
        "verdicts": verdicts,
    }
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(run_dir, "summary.md"), "w") as f:
        f.write(table)
    shutil.copyfile(os.path.join(run_dir, "summary.json"), os.path.join(args.out_dir, "latest.json"))
    shutil.copyfile(os.path.join(run_dir, "summary.md"), os.path.join(args.out_dir, "latest.md"))
    print(table)
    print(f"[run_all] raw results in {run_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
