"""The supervision tree: every actor failure reaches the owner of its mesh.

Whoever calls ``spawn`` owns the new mesh (the client's root actor for top-level meshes).
A failure (an exception nobody can receive, ``__init__`` raising, a ``BaseException``, the
process dying) becomes a ``MeshFailure`` for the owner: its ``__supervise__`` may handle it
(truthy return); otherwise the owner itself fails, and the failure moves one level up. At the
root, ``monarch.actor.unhandled_fault_hook`` decides; by default the client's main thread is
interrupted with a ``KeyboardInterrupt`` (``UnhandledFaultInterrupt``): the script may catch it
to shut down gracefully; uncaught, it ends the client with exit code 1 after atexit handlers ran.

Process deaths are noticed by the spawner (exit status) or, in other processes, by the socket
closing; each owning process turns them into failures of the meshes it owns on that process.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any

from monarch._src.actor.errors import SupervisionError
from monarch._src.actor.process_state import runtime, this_process
from monarch._src.wire import protocol
from monarch._src.wire.protocol import ACTOR, MESH, NAME, PROCESS_STOPPING, RANK, REPORT, STOPPED

if TYPE_CHECKING:
    from monarch._src.actor.instance import ActorInstance

logger = logging.getLogger("monarch.supervision")


class MeshFailure:
    """A failure of one or more ranks of a mesh, as delivered to ``__supervise__``."""

    def __init__(self, mesh_name: str, crashed_ranks: list[int], report: str) -> None:
        self.mesh_name = mesh_name
        self.crashed_ranks = crashed_ranks
        self.mesh = None
        self._report = report

    def report(self) -> str:
        """The text of what failed and why (exit code, signal or traceback), to log or pass on."""
        return self._report

    def __repr__(self) -> str:
        return f"MeshFailure(mesh_name={self.mesh_name}, crashed_ranks={self.crashed_ranks}, event={self._report})"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("MeshFailure is not picklable; send str(failure) or failure.report() instead")


def unhandled_fault_hook(failure: MeshFailure) -> None:
    """Called in the client with every failure no ``__supervise__`` handled.

    Returning (any value) drops the failure; raising (any exception, ``SystemExit``
    included) leaves it unhandled: the report goes to stderr and the main thread is
    interrupted with a ``KeyboardInterrupt``, which ends the client with exit code 1 (atexit
    handlers run) unless the script catches it. The default raises ``SystemExit(1)``. Replace
    it with ``monarch.actor.unhandled_fault_hook = my_hook``.
    """
    sys.exit(1)


class UnhandledFaultInterrupt(KeyboardInterrupt):
    """Raised in the client's main thread when a failure reached ``unhandled_fault_hook`` unhandled.

    A ``KeyboardInterrupt``, so ``except KeyboardInterrupt:`` sees it, as Monarch's guide
    promises. Not the exact type, so if nothing catches it the interpreter ends with the usual
    traceback and exit code 1 instead of dying by SIGINT (what an uncaught Ctrl-C does).
    """


class _OwnedMesh:
    __slots__ = ("name", "addresses", "owner_key", "done", "handles_gone")

    def __init__(self, name: str, addresses: tuple[str, ...], owner_key: str) -> None:
        self.name = name
        self.addresses = addresses
        self.owner_key = owner_key
        #: ranks already reported failed or stopped: each is reported at most once.
        self.done: set[int] = set()
        #: No handle of the mesh is left here: forget it once every rank is done.
        self.handles_gone = False


class MeshHandles:
    """Shared by every handle (``ActorMesh``) of one mesh in this process. While any exists, the
    mesh's stop and failure records stay, so that calls through it fail at once; when the last
    is collected, they go (a long-lived client must not keep one entry per mesh it ever made).
    ``keep`` holds what those calls still need, e.g. the process group the mesh runs on."""

    __slots__ = ("keep", "__weakref__")

    def __init__(self) -> None:
        self.keep: Any = None


_handles: weakref.WeakValueDictionary[str, MeshHandles] = weakref.WeakValueDictionary()


_lock = threading.RLock()
#: mesh key -> meshes spawned by an actor (or the root) of this process. Iterate over a copy
#: (``dict.copy`` allocates nothing per item): a collected handle's finalizer, run by the garbage
#: collector in the middle of an iteration on the lock's own thread, may remove an entry.
_owned: dict[str, _OwnedMesh] = {}
#: mesh key -> {address: report} for failed ranks; mesh key -> reason for stopped meshes.
_failed: dict[str, dict[str, str]] = {}
_stopped: dict[str, str] = {}
#: process addresses known dead -> report; calls to them fail at once.
dead_processes: dict[str, str] = {}
#: addresses of processes spawned here: their spawner reports their exit, with the reason.
locally_spawned: set[str] = set()
#: Addresses of processes asked to exit (``ProcMesh.stop``), as their actors told this process,
#: which owns meshes there: their deaths are expected, even by a kill, until reported.
stopping_processes: set[str] = set()
#: Processes spawned here whose records were dropped (``forget_processes``), most recent last:
#: their connections may still report the loss after that, which must not record them anew.
#: Bounded, since each is only late news for a short while; a set in insertion order.
_forgotten: dict[str, None] = {}
_FORGOTTEN_KEPT = 4096


def mesh_handles(mesh_key: str) -> MeshHandles:
    """The ``MeshHandles`` of ``mesh_key`` in this process, made with its first handle."""
    with _lock:
        handles = _handles.get(mesh_key)
        if handles is None:
            handles = _handles[mesh_key] = MeshHandles()
            weakref.finalize(handles, _handles_gone, mesh_key)
        return handles


def _handles_gone(mesh_key: str) -> None:
    with _lock:
        _failed.pop(mesh_key, None)
        _stopped.pop(mesh_key, None)
        owned = _owned.get(mesh_key)
        if owned is not None:
            owned.handles_gone = True
            _forget_if_finished(mesh_key, owned)


def _rank_done(mesh_key: str, owned: _OwnedMesh, rank: int) -> None:
    """(under _lock) ``rank`` of an owned mesh stopped or failed, and was reported."""
    owned.done.add(rank)
    _forget_if_finished(mesh_key, owned)


def _forget_if_finished(mesh_key: str, owned: _OwnedMesh) -> None:
    """(under _lock) Nothing is left to supervise, nor a handle to fail calls through."""
    if owned.handles_gone and len(owned.done) == len(owned.addresses):
        del _owned[mesh_key]


def forget_processes(addresses: tuple[str, ...]) -> None:
    """Processes spawned here exited and nothing can address them any more (their process
    group, kept by every handle of a mesh on them, was collected): drop their records."""
    with _lock:
        for address in addresses:
            dead_processes.pop(address, None)
            locally_spawned.discard(address)
            stopping_processes.discard(address)
            _forgotten[address] = None
        while len(_forgotten) > _FORGOTTEN_KEPT:
            del _forgotten[next(iter(_forgotten))]


def record_spawn(owner_key: str, mesh_key: str, name: str, addresses: tuple[str, ...]) -> None:
    with _lock:
        _owned[mesh_key] = _OwnedMesh(name, addresses, owner_key)
        dead = [(i, dead_processes[a]) for i, a in enumerate(addresses) if a in dead_processes]
    for rank, report in dead:
        _deliver(mesh_key, rank, report)


def any_trouble() -> bool:
    """Whether any mesh or process is known stopped or failed in this process."""
    return bool(_stopped or _failed or dead_processes)


def trouble_for(mesh_key: str, addresses: list[str]) -> bool:
    """Whether this mesh is known stopped or failed, or one of these processes dead: a call's
    fast path checks only its own mesh, so that a mesh stopped elsewhere costs it nothing."""
    return mesh_key in _stopped or mesh_key in _failed or not dead_processes.keys().isdisjoint(addresses)


def mesh_error(mesh_key: str, mesh_name: str, endpoint: str, addresses: list[str]) -> SupervisionError | None:
    """Why a call on these ranks of a mesh must fail at once (or None if it may proceed)."""
    if mesh_key in _stopped:
        return SupervisionError(
            f"Endpoint call {mesh_name}.{endpoint}() failed, actor mesh {mesh_name} has been stopped"
        )
    failed = _failed.get(mesh_key)
    for a in addresses:
        report = (failed and failed.get(a)) or dead_processes.get(a)
        if report:
            return SupervisionError(f"Endpoint call {mesh_name}.{endpoint}() failed, {report}")
    return None


def owned_meshes(owner_key: str) -> list[tuple[str, str, list[str]]]:
    """(mesh key, name, addresses of live ranks) of every mesh ``owner_key`` spawned."""
    with _lock:
        return [
            (key, m.name, [a for i, a in enumerate(m.addresses) if i not in m.done])
            for key, m in _owned.copy().items()
            if m.owner_key == owner_key
        ]


def mark_stopped(mesh_key: str, reason: str) -> None:
    """Calls through handles of ``mesh_key`` fail from now on (none left: nothing to record)."""
    with _lock:
        if mesh_key in _handles:
            _stopped[mesh_key] = reason


# -- the failing side ---------------------------------------------------------------------------


def actor_failed(inst: ActorInstance, report: str) -> None:
    """Tell the owner of ``inst``'s mesh that this rank failed."""
    _notify_owner(inst, report, stopped=False)


def actor_stopped(inst: ActorInstance, unfinished: str | None = None) -> None:
    """Tell the owner that ``inst`` stopped; ``unfinished`` says what it stopped without doing
    (broadcasts it never ran, a ``__cleanup__`` that did not run), for the owner to report."""
    report_stopped(inst.owner, inst.key, inst.name, inst.rank.rank, unfinished)


def report_stopped(owner: Any, mesh_key: str, name: str, rank: int, unfinished: str | None) -> None:
    _notify(owner, mesh_key, name, rank, unfinished or "stopped", stopped=True)


def process_stopping(inst: ActorInstance) -> None:
    """Tell the owner of ``inst``'s mesh that its process was asked to exit: if it is killed
    before its actors report themselves stopped, the owner takes the death as expected."""
    owner = inst.owner
    if owner is None:
        return
    header = protocol.process_stopping(owner[1], inst.key, inst.name, inst.rank.rank)
    try:
        runtime().send(owner[0], header, [], keep=True)
    except Exception:
        logger.exception("could not tell the owner at %s that an actor's process stops", owner[0])


def _notify_owner(inst: ActorInstance, report: str, stopped: bool) -> None:
    _notify(inst.owner, inst.key, inst.name, inst.rank.rank, report, stopped)


def _notify(owner: Any, mesh_key: str, name: str, rank: int, report: str, stopped: bool) -> None:
    if owner is None:
        if report != "stopped":
            sys.stderr.write(f"monarch: {report}\n")
        return
    try:
        header = protocol.supervision(owner[1], mesh_key, name, rank, report, stopped)
        runtime().send(owner[0], header, [], keep=True)  # nobody waits for it: never lose it
    except Exception:
        logger.exception("could not report a failure to the owner at %s", owner[0])
        sys.stderr.write(f"monarch: {report}\n")


def handle_supervision_frame(header: dict, bodies: list) -> None:
    mesh_key, rank = header[MESH], header[RANK]
    if header.get(STOPPED) == PROCESS_STOPPING:
        with _lock:
            owned = _owned.get(mesh_key)
            if owned is not None and owned.addresses[rank] not in dead_processes:
                stopping_processes.add(owned.addresses[rank])
        return
    if header.get(STOPPED):
        with _lock:
            owned = _owned.get(mesh_key)
            if owned is not None:
                _rank_done(mesh_key, owned, rank)
        report = header[REPORT]
        if report != "stopped":  # it stopped without doing everything it was sent
            logger.warning("%s", report)
            sys.stderr.write(f"monarch: {report}\n")
        return
    _deliver(mesh_key, rank, header[REPORT], header.get(NAME), header.get(ACTOR))


def process_exited(address: str, how: str, expected: bool = False) -> None:
    """The process at ``address`` is gone: fail pending calls and report owned ranks there.

    ``expected`` (it was asked to stop, here or, as its actors said, by whoever stopped it)
    fails what still waits on it but reports no failure.
    """
    from monarch._src.actor.port import fail_waiting_on  # ports ask supervision which peers died

    with _lock:
        if address in stopping_processes:
            stopping_processes.discard(address)
            expected = True
    if expected:
        report = f"the process {address} this actor was running on was stopped"
    else:
        report = f"the process {address} this actor was running on failed: {how}"
    with _lock:
        if address in dead_processes:
            return
        dead_processes[address] = report
        hits = [
            (key, i) for key, m in _owned.copy().items() for i, a in enumerate(m.addresses) if a == address
        ]
        if expected:
            for key, rank in hits:
                m = _owned.get(key)
                if m is not None:
                    _rank_done(key, m, rank)
            hits = []
    fail_waiting_on(address, lambda h: SupervisionError(f"Endpoint call {h.label}() failed, {report}"))
    for key, rank in hits:
        m = _owned.get(key)
        name = m.name if m else key
        _deliver(key, rank, f"The actor {name}[{rank}] and all its descendants have failed: {report}")


#: A lost connection is reported after this delay, so that the "stopped" notices the peer
#: sent before a graceful exit (on its own connection to us) are processed first.
PEER_LOST_GRACE_S = 0.2


def peer_lost(address: str, reason: BaseException) -> None:
    from monarch._src.transport.outgoing import PeerUnreachableError  # (loop thread) loaded by now

    if address in _forgotten:
        return  # its exit was reported, and its records dropped, already
    if address in locally_spawned and not isinstance(reason, PeerUnreachableError):
        return  # the spawner's exit watch reports it, with the exit status
    runtime().loop.call_later(PEER_LOST_GRACE_S, process_exited, address, f"became unreachable ({reason})")


# -- the owning side ------------------------------------------------------------------------------


def _deliver(
    mesh_key: str, rank: int, report: str, name: str | None = None, owner_key: str | None = None
) -> None:
    with _lock:
        owned = _owned.get(mesh_key)
        if owned is not None:
            if rank in owned.done:
                return
            name, owner_key = owned.name, owned.owner_key
            if mesh_key in _handles:
                _failed.setdefault(mesh_key, {})[owned.addresses[rank]] = report
            _rank_done(mesh_key, owned, rank)
    failure = MeshFailure(name or mesh_key, [rank], report)
    owner = this_process.lookup(owner_key) if owner_key and owner_key != "root" else None
    if owner is not None and not owner.stopped:
        owner.supervise(failure)
    elif owner_key == "root" or owner_key is None or _is_root_process():
        root_unhandled(failure)
    else:
        sys.stderr.write(f"monarch: failure of a mesh whose owner is gone: {report}\n")


def _is_root_process() -> bool:
    return not os.environ.get("MONARCH_ROOT_ADDRESS")


_hook_lock = threading.Lock()
#: The first unhandled failure interrupts the main thread; later ones are only reported, so
#: that the failures of one incident (every rank of a mesh, every mesh of a dead process) do
#: not interrupt the cleanup the script does after the first.
_main_interrupted = False
#: The SIGINT this module sent is on its way to the main thread (see ``install_sigint_wrapper``).
_fault_interrupt_pending: MeshFailure | None = None


def root_unhandled(failure: MeshFailure) -> None:
    """A failure reached the client's root: run ``monarch.actor.unhandled_fault_hook``."""
    public = sys.modules.get("monarch.actor")
    hook = getattr(public, "unhandled_fault_hook", unhandled_fault_hook)
    with _hook_lock:
        try:
            hook(failure)
            return
        except BaseException:  # noqa: B036 - raising (SystemExit included) means unhandled
            pass
    _report_unhandled(failure)
    _interrupt_main_thread(failure)


def _report_unhandled(failure: MeshFailure) -> None:
    import datetime
    import socket

    now = datetime.datetime.now().isoformat(sep=" ", timespec="seconds")
    sys.stderr.write(
        f"Unhandled monarch error on the root actor, hostname={socket.gethostname()}, "
        f"PID={os.getpid()} at time {now}:\n{failure.report()}\n"
    )
    sys.stderr.flush()


def _interrupt_main_thread(failure: MeshFailure) -> None:
    """Raise ``UnhandledFaultInterrupt`` in the main thread, once per process.

    A real SIGINT wakes a main thread blocked in a system call (``Future.get``, ``sleep``),
    which ``_thread.interrupt_main`` would not; the wrapper installed at client start turns
    it into ``UnhandledFaultInterrupt``. Without the wrapper (the client started off the main
    thread, or a notebook kernel swapped SIGINT handlers) whatever SIGINT handler Python has
    runs: a plain ``KeyboardInterrupt`` under the default one.
    """
    global _main_interrupted, _fault_interrupt_pending
    with _hook_lock:
        if _main_interrupted:
            return
        _main_interrupted = True
        _fault_interrupt_pending = failure
    if callable(signal.getsignal(signal.SIGINT)):
        os.kill(os.getpid(), signal.SIGINT)
    else:  # SIG_DFL would kill the client before atexit; SIG_IGN: nothing can interrupt it
        import _thread

        _thread.interrupt_main()


_sigint_wrapper_installed = False


def install_sigint_wrapper() -> None:
    """Let an unhandled fault raise ``UnhandledFaultInterrupt`` in the main thread.

    Only the main thread can install a signal handler; the previous handler keeps serving
    every ordinary Ctrl-C.
    """
    global _sigint_wrapper_installed
    if _sigint_wrapper_installed or threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(signum: int, frame: Any) -> Any:
        global _fault_interrupt_pending
        failure = _fault_interrupt_pending
        if failure is not None:
            _fault_interrupt_pending = None
            raise UnhandledFaultInterrupt(
                f"unhandled monarch failure of mesh {failure.mesh_name} (its report is above); "
                "catch KeyboardInterrupt to shut down gracefully, or handle failures in "
                "__supervise__ or monarch.actor.unhandled_fault_hook"
            )
        if previous == signal.SIG_IGN:
            return None
        if callable(previous):
            return previous(signum, frame)
        raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGINT, on_sigint)
    except ValueError:
        return
    _sigint_wrapper_installed = True
