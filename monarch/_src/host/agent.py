"""The host agent, ``python -m monarch.host``: spawns procs on this machine for remote clients.

The agent listens on an address and authenticates every connection with its own secret (the
same mutual HMAC handshake as every monarch connection; the secret comes from a file or an
environment variable, never the command line). A client that got in sends one ``HOST_HELLO``
frame carrying its job secret (sealed with the agent's secret) and a port to answer on. The
agent then starts a *session* for it: one process of the client's job on this host
(``host/session.py``) that spawns the client's procs, forwards their output and reports their
exits. The agent itself runs no actors and decodes nothing but that frame.

The client's connection is the session's lease: when it closes (the client exited, crashed,
was killed, or its host vanished), the agent kills the session, whose procs then exit by
themselves (parent-death watch), and removes the session's files. A session that ends on its
own closes the connection, so the client learns at once that the host is lost. The agent
keeps serving the next clients, unless started with ``--once``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from monarch._src.host.process_exit import when_process_exits
from monarch._src.runtime.bootstrap import read_secret_fd
from monarch._src.transport import auth
from monarch._src.transport.connection import IncomingConnection
from monarch._src.transport.listener import Listener
from monarch._src.wire import protocol

logger = logging.getLogger("monarch.host.agent")

#: Environment variables a secret may come from (``--secret-env`` names another).
SECRET_ENV = "MONARCH_HOST_SECRET"
SECRET_FILE_ENV = "MONARCH_HOST_SECRET_FILE"
#: The secret of ``ca="trust_all_connections"``: public, so any client may attach (Monarch's
#: meaning); the handshake still keeps out whatever does not speak monarch's protocol.
TRUST_ALL_SECRET = b"monarch-aio trust_all_connections"
#: Frames a client may send before its session exists: only the hello, which is small.
MAX_HELLO_BYTES = 64 << 10

SECRET_HINT = (
    "HINT: give the agent and its clients the same secret: a file (--secret-file PATH, or "
    f"{SECRET_FILE_ENV}=PATH) or an environment variable ({SECRET_ENV}); "
    "ca='trust_all_connections' lets any client attach."
)


def read_secret(secret_file: str | None = None, env_name: str = SECRET_ENV) -> bytes | None:
    """The shared secret from ``secret_file``, else ``$MONARCH_HOST_SECRET_FILE``, else the
    environment variable ``env_name``; None where none is set. A file must not be readable by
    other users (the secret lets its holder run code on every host that trusts it)."""
    path = secret_file or os.environ.get(SECRET_FILE_ENV)
    if path:
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())  # of the file read, whatever the path pointed to before
                secret = f.read().strip()
        except OSError as e:
            raise ValueError(f"cannot read the host secret file {path}: {e}\n{SECRET_HINT}") from None
        if st.st_mode & 0o077:
            raise ValueError(
                f"the host secret file {path} has mode {st.st_mode & 0o777:o}: other users can read it\n"
                f"HINT: chmod 600 {path}"
            )
        if st.st_uid not in (os.geteuid(), 0):
            # Its owner knows the secret, and could have chosen it: run as this user anywhere.
            raise ValueError(
                f"the host secret file {path} belongs to uid {st.st_uid}, not to this user "
                f"(uid {os.geteuid()}): its owner could have chosen the secret\n"
                f"HINT: make a secret file of your own (e.g. `head -c 32 /dev/urandom | base64 > "
                f"FILE; chmod 600 FILE`)"
            )
        if not secret:
            raise ValueError(f"the host secret file {path} is empty\n{SECRET_HINT}")
        return secret
    value = os.environ.get(env_name)
    return value.encode() if value else None


class _Session:
    """One client's session: its connection, and the process serving it."""

    def __init__(self, agent: Agent, conn: IncomingConnection) -> None:
        self.agent = agent
        self.conn = conn
        self.proc: subprocess.Popen[bytes] | None = None
        self.socket_dir: str | None = None
        self.death_w = -1
        self.started = False
        self.ended = False

    def hello(self, header: dict, bodies: list) -> None:
        if self.started:
            self.conn.abort(auth.HandshakeError("a second hello on one connection"))
            return
        try:
            job_secret = auth.unseal(self.agent.secret, bytes(header[protocol.NONCE]), bytes(bodies[0]))
            root, reply = str(header[protocol.ROOT]), list(header[protocol.REPLY_PORT])
        except (KeyError, TypeError, ValueError, IndexError) as e:
            self.conn.abort(auth.HandshakeError(f"malformed hello from a client: {e!r}"))
            return
        try:
            self._start(job_secret, root, reply)
        except Exception as e:
            logger.exception("could not start a session")
            self.conn.abort(RuntimeError(f"could not start a session: {e}"))
            self.end()

    def _start(self, job_secret: bytes, root: str, reply: list) -> None:
        from monarch._src.host.spawner import INIT_MODULES, WORKER_MODULE, secret_pipe, worker_environment
        from monarch._src.runtime import job_files
        from monarch._src.transport import address as addresses

        self.socket_dir = job_files.new_job_dir()
        listen, transport_env = self.agent.session_socket(self.socket_dir)
        address = addresses.of_listening_socket(listen)
        child_fds: list[int] = []
        try:
            death_r, self.death_w = os.pipe()
            child_fds.append(death_r)
            child_fds.append(secret_pipe(job_secret))
            env = worker_environment(
                transport_env,
                root,
                {
                    "listen_fd": listen.fileno(),
                    "death_fd": death_r,
                    "secret_fd": child_fds[1],
                    "socket_dir": self.socket_dir,
                    "init_modules": [*INIT_MODULES, "monarch._src.host.session"],
                    "gated": False,
                    "name": "host",
                    "rank": 0,
                    "announce": reply,
                },
                captured=False,
            )
            self.proc = subprocess.Popen(
                [sys.executable, "-m", WORKER_MODULE],
                pass_fds=(listen.fileno(), *child_fds),
                env=env,
                start_new_session=True,
            )
        finally:  # the session has its copies
            listen.close()
            for fd in child_fds:
                os.close(fd)
        self.started = True
        logger.info("session for client %s: pid %d at %s", root, self.proc.pid, address)
        self.agent.watch_exit(self)

    def end(self) -> None:
        """The client went away or the session died: kill it, remove its files."""
        if self.ended:
            return
        self.ended = True
        self.conn.abort(ConnectionResetError("session ended"), log=False)
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()  # its procs follow: their death pipes reach EOF
        if proc is not None:
            proc.wait()
        if self.death_w >= 0:
            os.close(self.death_w)
            self.death_w = -1
        if self.socket_dir is not None:
            from monarch._src.runtime import job_files

            job_files.remove(self.socket_dir)
            self.socket_dir = None
        self.agent.session_ended(self)


class Agent:
    """Accepts clients on ``sock`` and runs one session per client (see the module docstring)."""

    def __init__(self, sock: socket.socket, secret: bytes, once: bool = False) -> None:
        from monarch._src.transport import address as addresses

        self.sock = sock
        self.secret = secret
        self.once = once
        self.address = addresses.of_listening_socket(sock)
        self.sessions: set[_Session] = set()
        self.done: asyncio.Future[None] | None = None

    def session_socket(self, socket_dir: str) -> tuple[socket.socket, dict[str, str]]:
        """A listening socket for a new session, reachable where the agent is (a TCP agent's
        sessions, and the procs they spawn, listen on the agent's interface), and what the
        session's environment needs to listen the same way."""
        from monarch._src.transport import address as addresses

        if addresses.is_unix(self.address):
            return addresses.listen_unix(os.path.join(socket_dir, "host.sock")), {}
        host = self.sock.getsockname()[0]
        return addresses.listen_tcp(host), {"MONARCH_TRANSPORT": "tcp", "MONARCH_TCP_BIND_HOST": host}

    async def serve(self) -> None:
        from monarch._src.runtime.config import CONFIG
        from monarch._src.transport import tls

        loop = asyncio.get_running_loop()
        self.done = loop.create_future()
        contexts = tls.contexts(CONFIG.tls_cert, CONFIG.tls_key, CONFIG.tls_ca)
        listener = Listener(loop, self.sock, self._new_connection, contexts.server if contexts else None)
        listener.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        try:
            await self.done
        finally:
            listener.close()
            for session in list(self.sessions):
                session.end()

    def stop(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(None)

    def _new_connection(self) -> IncomingConnection:
        session: _Session

        def on_frame(header: dict, bodies: list) -> None:
            if header.get(protocol.KIND) == protocol.HOST_HELLO_KIND and bodies:
                session.hello(header, bodies)
            else:
                conn.abort(auth.HandshakeError(f"unexpected frame kind {header.get(protocol.KIND)!r}"))

        def on_close(c: IncomingConnection, reason: BaseException | None) -> None:
            if session.started and not session.ended:
                logger.info("client connection closed (%s): ending its session", reason)
            session.end()

        def on_reject(header: dict, error: BaseException) -> None:
            conn.abort(error)

        conn = IncomingConnection(
            secret=self.secret,
            max_frame_bytes=MAX_HELLO_BYTES,
            on_frame=on_frame,
            on_reject=on_reject,
            on_close=on_close,
            name=f"client of host agent {self.address}",
        )
        session = _Session(self, conn)
        self.sessions.add(session)
        return conn

    def watch_exit(self, session: _Session) -> None:
        """End ``session`` when its process exits on its own."""
        proc = session.proc
        assert proc is not None

        def exited() -> None:
            if session.proc is proc:
                logger.warning("session pid %d exited with %s", proc.pid, proc.wait())
                session.end()

        when_process_exits(asyncio.get_running_loop(), proc, exited)

    def session_ended(self, session: _Session) -> None:
        self.sessions.discard(session)
        if self.once and session.started:
            self.stop()


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m monarch.host",
        description=(
            "Run a monarch host agent: clients that hold its secret attach to it "
            "(hosts_from_config, attach_to_workers) and spawn processes on this machine. Each "
            "client gets a session; when its connection closes, every process spawned for it "
            "is killed. The agent keeps serving later clients unless --once is given."
        ),
        epilog=(
            f"The secret comes from --secret-file, else ${SECRET_FILE_ENV} (a file path), else "
            f"the environment variable named by --secret-env (default {SECRET_ENV}); never from "
            "the command line, which every user can read in /proc. Exit status: 0 after "
            "SIGTERM/SIGINT or --once, 2 on bad arguments or a bad secret."
        ),
    )
    parser.add_argument(
        "--listen",
        metavar="ADDRESS",
        help=(
            "address to listen on: tcp:HOST:PORT (an interface's address; 0.0.0.0 for every one) or "
            "unix:/path/to/socket (Monarch's tcp://HOST:PORT and ipc:///path are accepted too)"
        ),
    )
    parser.add_argument(
        "--listen-fd", type=int, metavar="FD", help="adopt this already bound, listening socket (launchers)"
    )
    parser.add_argument("--secret-file", metavar="PATH", help="file holding the shared secret (mode 600)")
    parser.add_argument(
        "--secret-env",
        metavar="NAME",
        default=SECRET_ENV,
        help=f"environment variable with the secret (default {SECRET_ENV})",
    )
    parser.add_argument(
        "--secret-fd", type=int, metavar="FD", help="read the secret from this inherited pipe (launchers)"
    )
    parser.add_argument(
        "--trust-all-connections",
        action="store_true",
        help="no secret: any client that reaches the address may attach (Monarch's ca='trust_all_connections')",
    )
    parser.add_argument("--once", action="store_true", help="exit after the first client has gone")
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="what the agent logs to stderr",
    )
    parser.add_argument(
        "--exit-with-parent", action="store_true", help="exit when the process that started the agent dies"
    )
    args = parser.parse_args(argv)
    if (args.listen is None) == (args.listen_fd is None):
        parser.error("give exactly one of --listen ADDRESS and --listen-fd FD")
    return args


def listen_on(address: str) -> socket.socket:
    """A socket listening at ``address`` (a stale socket file nobody answers on is replaced);
    ValueError saying why where it cannot be."""
    from monarch._src.host.workers import host_address
    from monarch._src.transport import address as addresses

    parsed = addresses.parse(host_address(address))
    try:
        if isinstance(parsed, addresses.TcpAddress):
            return addresses.listen_tcp(parsed.host, parsed.port)
        path = parsed.path
        if os.path.exists(path):  # a stale socket of an agent that is gone: nobody answers on it
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)
            else:
                raise ValueError(f"another process already listens at {address}")
            finally:
                probe.close()
        return addresses.listen_unix(path)
    except OSError as e:
        raise ValueError(f"cannot listen at {address}: {e}") from None


def _secret_from(args: argparse.Namespace) -> bytes:
    if args.trust_all_connections:
        return TRUST_ALL_SECRET
    if args.secret_fd is not None:
        return read_secret_fd(args.secret_fd)
    secret = read_secret(args.secret_file, args.secret_env)
    if secret is None:
        raise ValueError(f"no secret given\n{SECRET_HINT}")
    return secret


def serve(sock: socket.socket, secret: bytes, once: bool = False, exit_with_parent: bool = False) -> None:
    """Run an agent on ``sock`` until SIGTERM/SIGINT (or, with ``once``, its first client left)."""
    from monarch._src.runtime.loop_thread import new_event_loop

    loop = new_event_loop()
    agent = Agent(sock, secret, once)
    logger.info("listening on %s (pid %d)", agent.address, os.getpid())
    if exit_with_parent:
        from monarch._src.runtime import parent_death

        def parent_died() -> None:
            loop.call_soon_threadsafe(agent.stop)

        parent_death.call_on_parent_death(parent_died)
    try:
        loop.run_until_complete(agent.serve())
    finally:
        loop.close()


def log_to_stderr(level: str = "info") -> None:
    """The agent's own log on stderr: where it listens, each client's session starting and ending."""
    logging.basicConfig(
        level=getattr(logging, level.upper()), format="monarch host agent: %(message)s", stream=sys.stderr
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the host agent CLI on ``argv`` (default ``sys.argv``); returns the exit status."""
    args = _parse(argv)
    log_to_stderr(args.log_level)
    try:
        secret = _secret_from(args)
        sock = socket.socket(fileno=args.listen_fd) if args.listen_fd is not None else listen_on(args.listen)
    except ValueError as e:
        sys.stderr.write(f"monarch host agent: {e}\n")
        return 2
    serve(sock, secret, args.once, args.exit_with_parent)
    return 0


def run(argv: Any = None) -> None:
    """``python -m monarch.host``: exit with ``main``'s status."""
    sys.exit(main(argv))
