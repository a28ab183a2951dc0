"""``@endpoint``, ``@concurrent_endpoint`` and the adverbs on a mesh's endpoint.

The decorator only marks a method and records its options; ``ActorEndpoint`` is what
``mesh.method`` returns on a spawned mesh, and turns ``call``/``call_one``/``choose``/``stream``/
``broadcast`` into one message per destination process plus a reply collector (one message
per host where a mesh spans hosts run by agents: ``multicast``).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, overload

from monarch._src.actor import multicast, supervision
from monarch._src.actor.collectors import GatherCollector, OnceCollector, StreamCollector
from monarch._src.actor.context import current_instance
from monarch._src.actor.coroutines import is_coroutine_function
from monarch._src.actor.errors import SupervisionError, add_note
from monarch._src.actor.future import Future, forbid_waiting, read_by_waiting_thread
from monarch._src.actor.port import Port, PortHandler, port_receiver
from monarch._src.actor.process_state import runtime, this_process
from monarch._src.wire import payload
from monarch._src.wire.frame import HeaderTemplate
from monarch._src.wire.protocol import ACTOR, REPLY_PORT, message

if TYPE_CHECKING:
    import inspect

    from monarch._src.actor.actor_mesh import ActorMesh, MeshRef
    from monarch._src.actor.instance import ActorInstance
    from monarch._src.runtime.runtime import Runtime

R = TypeVar("R")
Selection = Literal["all", "choose"]
Propagator = Any

#: Set by the tensor layer (``monarch._src.tensor.hooks``): runs ``endpoint.rref(...)`` as
#: ``rref_handler(mesh, endpoint name, propagate, args, kwargs)``; None without a tensor layer.
rref_handler: Callable[..., Any] | None = None

#: While a call's arguments are pickled: the key of the actors it goes to and its destinations,
#: (message rank, process address) pairs. An argument that lends the callee something of its
#: own process for the call (a distributed tensor: its shard) lends it only where it goes.
pickling_for: ContextVar[tuple[str, list[tuple[int, str]]] | None] = ContextVar("pickling_for", default=None)

_NO_EXTENT: list[Any] = [[], []]
#: The payload of a call without arguments, pickled once.
_NO_ARGS = payload.dumps(((), {}))


def _current_task() -> object | None:
    """The running asyncio task, if any (asyncio is loaded wherever an async actor runs)."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        return None
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop in this thread
        return None


def _futures_of(collector: PortHandler) -> list[Future[Any]]:
    """The futures the replies to ``collector`` resolve (one, or a stream's)."""
    if type(collector) is StreamCollector:
        return collector.futures
    return [collector.future]  # type: ignore[attr-defined]


def _deliver_here(rt: Runtime, header: dict, call: tuple[tuple, dict]) -> None:
    """A message with immutable arguments to an actor of this process: straight into its
    mailbox from this thread, as the router would put it there (so this thread's messages keep
    their order whatever the adverb), with ``call`` as it is instead of pickled bodies."""
    inst = this_process.lookup(header[ACTOR])
    if inst is not None:
        inst.post_message(header, call)
    else:  # not here (any more): the router answers for it, with pickled bodies as ever
        rt.send(rt.address, header, payload.dumps(call))


class EndpointProperty(Generic[R]):
    """Marks an actor method as an endpoint; holds its options."""

    def __init__(
        self,
        method: Callable[..., Any],
        propagate: Propagator = None,
        explicit_response_port: bool = False,
        instrument: bool = True,
        concurrent: bool = False,
    ) -> None:
        #: The decorated function; dispatch calls it (with ``explicit_response_port``, a port first).
        self.method = method
        self._propagator = propagate
        self.explicit_response_port = explicit_response_port
        self._instrument = instrument
        self.concurrent = concurrent
        self.is_async = is_coroutine_function(method)
        self._signature: inspect.Signature | None = None
        #: (min, max) positional count when the signature is plain, to check without bind().
        self._arity: tuple[int, int] | None = None
        self.__doc__ = method.__doc__
        self.__name__ = getattr(method, "__name__", "endpoint")

    @property
    def propagator(self) -> Propagator:
        """``@endpoint(propagate=...)``: computes the shape of ``rref`` results from the arguments'."""
        return self._propagator

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return self.method.__get__(obj, objtype)

    def check_args(self, args: tuple, kwargs: dict) -> None:
        """Raise TypeError at the call site if the arguments do not fit the method."""
        arity = self._arity
        if arity is not None and not kwargs and arity[0] <= len(args) <= arity[1]:
            return
        sig = self._signature
        if sig is None:
            import inspect

            try:
                sig = self._signature = inspect.signature(self.method)
            except (TypeError, ValueError):
                return
            self._arity = _plain_arity(sig, 2 if self.explicit_response_port else 1)
        lead = (None, None) if self.explicit_response_port else (None,)
        try:
            sig.bind(*lead, *args, **kwargs)
        except TypeError as e:
            raise TypeError(
                f"wrong arguments for endpoint {self.__name__}{_public_signature(sig, self.explicit_response_port)}: {e}"
            ) from None


def _plain_arity(sig: inspect.Signature, lead: int) -> tuple[int, int] | None:
    import inspect

    params = list(sig.parameters.values())[lead:]
    if any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params):
        return None
    required = sum(1 for p in params if p.default is inspect.Parameter.empty)
    return required, len(params)


def _public_signature(sig: inspect.Signature, explicit_port: bool) -> str:
    params = list(sig.parameters.values())[2 if explicit_port else 1 :]
    return str(sig.replace(parameters=params))


@overload
def endpoint(method: Callable[..., Any]) -> EndpointProperty[Any]: ...
@overload
def endpoint(
    *, propagate: Propagator = None, explicit_response_port: bool = False, instrument: bool = True
) -> Callable[[Callable[..., Any]], EndpointProperty[Any]]: ...


def endpoint(
    method: Callable[..., Any] | None = None,
    *,
    propagate: Propagator = None,
    explicit_response_port: bool = False,
    instrument: bool = True,
) -> Any:
    """Mark an actor method as callable remotely through a mesh (``@endpoint`` or ``@endpoint(...)``)."""
    return _decorate(method, False, propagate, explicit_response_port, instrument)


def concurrent_endpoint(
    method: Callable[..., Any] | None = None,
    *,
    propagate: Propagator = None,
    explicit_response_port: bool = False,
    instrument: bool = True,
) -> Any:
    """An async endpoint whose invocations may overlap with the actor's other messages."""
    return _decorate(method, True, propagate, explicit_response_port, instrument)


def _decorate(
    method: Callable[..., Any] | None,
    concurrent: bool,
    propagate: Propagator,
    explicit_response_port: bool,
    instrument: bool,
) -> Any:
    """``@decorator`` (``method`` given: mark it now) or ``@decorator(...)`` (return what marks it)."""

    def wrap(m: Callable[..., Any]) -> EndpointProperty[Any]:
        if isinstance(m, EndpointProperty):
            if concurrent:
                raise ValueError(
                    "concurrent_endpoint does not wrap @endpoint; pass endpoint options to @concurrent_endpoint"
                )
            return m
        if concurrent and not is_coroutine_function(m):
            raise ValueError("concurrent_endpoint can only wrap async endpoints")
        return EndpointProperty(m, propagate, explicit_response_port, instrument, concurrent)

    return wrap(method) if method is not None else wrap


class ActorEndpoint(Generic[R]):
    """``mesh.method`` on a spawned mesh: the adverbs that send it."""

    __slots__ = ("_mesh", "_ref", "_name", "_prop", "_size", "_label_text", "_templates", "_plan")

    def __init__(self, mesh: ActorMesh[Any], ref: MeshRef, name: str, prop: EndpointProperty[R]) -> None:
        self._mesh = mesh
        self._ref = ref
        self._name = name
        self._prop = prop
        #: The number of actors called; a mesh reference's shape never changes.
        self._size = len(ref.shape)
        self._label_text = f"{ref.name}.{name}"
        #: See ``_header_templates``.
        self._templates: list[HeaderTemplate] | None = None
        #: What ``call_one`` and ``call`` to actors of other processes reuse from call to call
        #: (made on the first one); False where an actor of the mesh is in this process.
        self._plan: _Remote | Literal[False] | None = None

    def send_to_port(self, args: tuple, kwargs: dict, port: Port[Any] | None, selection: Selection) -> None:
        """Internal, for ``monarch.actor.send``: send with every reply going to ``port`` (if any),
        whose receiver here learns which processes to expect replies from."""
        self._ref.check_usable(self._name)
        sent = self._send(args, kwargs, port=port, selection=selection)
        receiver = port_receiver(port) if port is not None else None
        if receiver is not None:  # a receiver here must not wait forever on a sender that died
            receiver.label = self._label()
            receiver.expect_from(a for _, a in sent)

    def _label(self) -> str:
        """``mesh.endpoint``, naming the calls in errors of the replies."""
        return self._label_text

    def _send(
        self,
        args: tuple,
        kwargs: dict,
        port: Port[Any] | None = None,
        selection: Selection = "all",
        reply: PortHandler | None = None,
        gather: bool = False,
    ) -> list[tuple[int, str]]:
        """Send one message per destination (one per host where the destinations span hosts,
        see ``multicast``; ``gather``: their replies come back one frame per host too);
        return the destinations, (message rank, process address) pairs.

        With a ``reply`` handler, it is told which processes to expect replies from before
        anything is sent, so a reply (or a process death) can never arrive unaccounted for.
        """
        self._prop.check_args(args, kwargs)
        ref = self._ref
        rt = runtime()
        dests = ref.destinations()
        if selection == "choose":
            from random import randrange

            dests = [dests[randrange(len(dests))]]
            extent: list[Any] = _NO_EXTENT
        else:
            extent = ref.wire_extent
        # To actors of this process, immutable arguments go as they are (a copy could not be
        # told apart from them); anything else travels pickled, so the callee gets a copy.
        as_is = (
            len(dests) == 1
            and dests[0][1] == rt.address  # never behind a forwarder: no sequence number to stamp
            and payload.call_needs_no_copy(args, kwargs)
        )
        bodies: list[Any] | None = None  # None: the arguments go as they are (_deliver_here)
        if not as_is:
            bodies = _NO_ARGS if not args and not kwargs else payload.dumps_plain_call(args, kwargs)
            if bodies is None:  # not a few scalars: cloudpickle, which may pickle references
                pickling = pickling_for.set((ref.key, dests))
                try:
                    bodies = payload.dumps((args, kwargs))
                except Exception as e:  # raised here, as Monarch does, with what to do about it
                    add_note(
                        e,
                        f"(pickling the arguments of a call to {self._label_text}: nothing was sent)\n"
                        "HINT: an endpoint's arguments must be picklable by cloudpickle; pass plain "
                        "data, not locks, sockets, open files or generators.",
                    )
                    raise
                finally:
                    pickling_for.reset(pickling)
        port_spec: list[Any] | None
        if reply is not None:
            if len(dests) == 1:  # call_one
                remote = [dests[0][1]] if dests[0][1] != rt.address else []
            else:  # every rank of the mesh: its addresses are listed once (not to be changed)
                addresses = ref.dest_addresses()
                remote = (
                    addresses if rt.address not in addresses else [a for a in addresses if a != rt.address]
                )
            # Replies from other processes come to the address of the loop the call is made on,
            # which reads them itself (``loop_replies``), or that of the thread for a call with
            # one destination and no large buffers (``thread_replies``); actors here reply
            # without a socket.
            thread_reads = len(dests) == 1 and bodies is not None and len(bodies) == 1
            port_spec = [rt.reply_address(thread_reads) if remote else rt.address, reply.port_id]
            if remote:  # this process cannot die without the caller; others can
                if multicast.forwarders:  # a message (or its replies) may pass through them
                    remote = remote + multicast.forwarders_of(remote)
                reply.expect_from(remote)
                if port_spec[0] != rt.address:  # to this loop's or this thread's own address
                    for f in _futures_of(reply):
                        read_by_waiting_thread(f)
        elif port is not None:
            port_spec = port.reply_to()
        else:
            port_spec = None
        key, name = ref.key, self._name
        if bodies is None:
            header = message(key, name, port_spec, dests[0][0], extent)
            _deliver_here(rt, header, (args, dict(kwargs) if kwargs else kwargs))
        elif multicast.forwarders:  # some procs of this job are on hosts run by agents
            multicast.send(dests, key, name, port_spec, extent, bodies, gather)
        elif extent is _NO_EXTENT:
            for rank, address in dests:
                rt.send(address, message(key, name, port_spec, rank, extent), bodies)
        else:
            templates = self._header_templates()
            if len(dests) == 1:
                rt.send_templated(dests[0][1], templates[0], port_spec, bodies)
            else:
                rt.send_templated_each(ref.dest_addresses(), templates, port_spec, bodies)
        return dests

    def _header_templates(self) -> list[HeaderTemplate]:
        """The header of a call to each rank of the mesh (all of it: not ``choose``), with all
        but its reply port packed once (made on the first call: most endpoints are never called)."""
        templates = self._templates
        if templates is None:
            ref = self._ref
            templates = self._templates = [
                HeaderTemplate(message(ref.key, self._name, None, rank, ref.wire_extent), REPLY_PORT)
                for rank, _ in ref.destinations()
            ]
        return templates

    def _collect(
        self,
        collector: PortHandler,
        args: tuple,
        kwargs: dict,
        selection: Selection = "all",
        gather: bool = False,
    ) -> None:
        """Send with ``collector`` as the reply port; a known-failed mesh fails it at once."""
        collector.label = self._label_text
        try:
            self._ref.check_usable(self._name)
            sent = self._send(args, kwargs, selection=selection, reply=collector, gather=gather)
            inst = current_instance.get()
            if inst is not None and inst.key == self._ref.key:
                self._guard_self_call(inst, collector, [a for _, a in sent])
        except SupervisionError as e:
            collector.fail(e)
        except BaseException:
            collector.stop_expecting()
            collector.close()
            raise

    def _guard_self_call(self, inst: ActorInstance, collector: PortHandler, sent_to: list[str]) -> None:
        """An actor calling its own endpoint: waiting for the reply inside the endpoint running
        now would deadlock (one message at a time), so that ``get()`` or ``await`` raises instead.
        An async actor may wait from a ``@concurrent_endpoint``, which runs beside its mailbox."""
        if runtime().address not in sent_to:
            return
        waiter: object
        if inst.thread_ident is not None:
            waiter = threading.get_ident()
            if waiter != inst.thread_ident:
                return
            wait, fix = "Future.get()", f"make the actor async and {self._name} a @concurrent_endpoint"
        else:
            waiter = _current_task()
            if waiter is None or waiter is not inst.mailbox_task:
                return
            wait, fix = "await", f"make {inst.running_endpoint} a @concurrent_endpoint"
        why = (
            f"{wait} would deadlock: actor {inst.name} waits, inside endpoint "
            f"{inst.running_endpoint}(), for the reply of its own endpoint {self._name}(), which it can "
            "only run after the running one returns (an actor handles one message at a time).\n"
            f"HINT: call the method directly (self.{self._name}(...)), or {fix}."
        )
        for f in _futures_of(collector):
            forbid_waiting(f, waiter, why)

    def call_one(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call the endpoint on the mesh's single actor and get its reply; ``ValueError`` on a mesh
        of more than one actor, which ``call`` or ``choose`` serve."""
        n = self._size
        if n != 1:
            raise ValueError(f"call_one requires exactly 1 actor, but mesh has {n}")
        if self._plan is not False:  # (False: the actor is in this process)
            future = self._call_remote(args, kwargs, False)
            if future is not None:
                return future
        collector = OnceCollector()
        self._collect(collector, args, kwargs)
        return collector.future

    def _call_remote(self, args: tuple, kwargs: dict, gather: bool) -> Future[Any] | None:
        """``call_one`` (``gather`` False) or ``call`` in their common case, which ``_collect``
        and ``_send`` serve in more steps: to actors of other processes (no forwarder between),
        a few scalar arguments that fit the method, the mesh not known stopped or failed and none
        of its processes known dead (other meshes' troubles do not matter). None, having done
        nothing, in any other case."""
        plan = self._plan
        if plan is None:
            plan = self._plan = _Remote.of(self)
        if (
            plan is False
            or plan.rt.closed
            or multicast.forwarders
            or supervision.trouble_for(plan.key, plan.addresses)
        ):
            return None
        arity = self._prop._arity
        if kwargs or arity is None or not arity[0] <= len(args) <= arity[1]:
            return None  # (``check_args`` makes ``_arity`` on the first call)
        bodies = payload.dumps_plain_call(args, kwargs) if args else _NO_ARGS
        if bodies is None:
            return None
        rt = plan.rt
        # The replies to several processes come to the runtime's loop, which wakes a waiting
        # thread once for all of them (see ``_send``).
        reply_to = rt.reply_address(len(plan.addresses) == 1)
        collector: OnceCollector | GatherCollector
        if gather:
            collector = GatherCollector(self._ref.shape_renumbered(), self._size, self._label_text)
        else:
            collector = OnceCollector(self._label_text)
        future = collector.future
        # As ``expect_from`` does: listed before the look for dead processes, so that a death
        # recorded at any point is seen by one or the other (``port.fail_waiting_on``).
        collector._addresses = plan.addresses
        if supervision.dead_processes:
            collector.expect_from(plan.addresses)
        if reply_to != rt.address:  # to this thread's or this loop's own reply address
            read_by_waiting_thread(future)
        try:
            if gather:
                rt.send_templated_each(plan.addresses, plan.templates, [reply_to, collector.port_id], bodies)
            else:
                rt.send_templated(plan.addresses[0], plan.templates[0], [reply_to, collector.port_id], bodies)
        except BaseException:
            collector.stop_expecting()
            collector.close()
            raise
        return future

    def choose(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call the endpoint on one actor of the mesh, picked at random to spread load, and get its reply."""
        collector = OnceCollector()
        self._collect(collector, args, kwargs, "choose")
        return collector.future

    def call(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """Call the endpoint on every actor of the mesh; the Future gives a ``ValueMesh`` of the replies,
        or raises the first ``ActorError``/``SupervisionError`` if any call fails."""
        if self._plan is not False:  # (False: an actor of the mesh is in this process)
            future = self._call_remote(args, kwargs, True)
            if future is not None:
                return future
        collector = GatherCollector(self._ref.shape_renumbered(), self._size)
        self._collect(collector, args, kwargs, gather=True)
        return collector.future

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Future[R]]:
        """Call the endpoint on every actor; yields one Future per actor, each the next reply to arrive,
        to act on fast replies without waiting for slow ones."""
        collector = StreamCollector(self._size)
        self._collect(collector, args, kwargs)
        return iter(collector.futures)

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Send the call to every actor and return at once, with no reply: an exception it raises
        stops that actor and reaches its owner through supervision, as no caller waits to see it."""
        self._ref.check_usable(self._name)
        self._send(args, kwargs)

    def rref(self, *args: Any, **kwargs: Any) -> Any:
        """Call the endpoint on every actor, under an active mesh, and get its results as one
        distributed tensor (shaped by the endpoint's ``propagate``), without waiting."""
        if rref_handler is None:
            raise RuntimeError("rref needs the tensor engine\nHINT: import monarch.actor, which installs it.")
        self._ref.check_usable(self._name)
        return rref_handler(self._mesh, self._name, self._prop.propagator, args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"endpoint {self._name} of a mesh is not called directly.\n"
            f"HINT: use an adverb: .{self._name}.call(...), .call_one(...), .choose(...), "
            ".stream(...) or .broadcast(...)."
        )

    def __repr__(self) -> str:
        return f"<endpoint {self._ref.class_name}.{self._name} of {self._mesh!r}>"


class _Remote:
    """The processes of a mesh none of whose actors is in this process, and how calls are sent
    to them (``ActorEndpoint._call_remote``)."""

    __slots__ = ("rt", "key", "addresses", "templates")

    def __init__(self, rt: Runtime, key: str, addresses: list[str], templates: list[HeaderTemplate]) -> None:
        self.rt = rt
        self.key = key
        #: The process of each rank (``MeshRef.dest_addresses``): the destinations, and those a
        #: reply is expected from (``PortHandler.expect_from``); never changed.
        self.addresses = addresses
        self.templates = templates

    @staticmethod
    def of(endpoint: ActorEndpoint[Any]) -> _Remote | Literal[False]:
        """The plan of ``endpoint``; False if an actor of its mesh is in this process."""
        rt = runtime()
        addresses = endpoint._ref.dest_addresses()
        if rt.address in addresses:
            return False
        return _Remote(rt, endpoint._ref.key, addresses, endpoint._header_templates())


class NotAnEndpoint:
    """What ``mesh.method`` returns for a method that lacks ``@endpoint``."""

    def __init__(self, mesh: ActorMesh[Any], ref: MeshRef, name: str) -> None:
        self._mesh = mesh
        self._ref = ref
        self._name = name

    def _fail(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"Actor {self._ref.class_name}.{self._name} is not annotated as an endpoint. To call "
            f"it as one, add a @endpoint decorator to it, or directly wrap it in one "
            f"as_endpoint(obj.method).call(...)"
        )

    call = call_one = choose = stream = broadcast = __call__ = _fail

    def as_endpoint(self, propagate: Propagator, explicit_response_port: bool) -> ActorEndpoint[Any]:
        """This method as an endpoint (see ``as_endpoint``)."""
        method = getattr(self._ref.cls, self._name)
        return ActorEndpoint(
            self._mesh, self._ref, self._name, EndpointProperty(method, propagate, explicit_response_port)
        )


def as_endpoint(
    not_an_endpoint: Any, *, propagate: Propagator = None, explicit_response_port: bool = False
) -> ActorEndpoint[Any]:
    """Turn a non-decorated method of a spawned mesh into an endpoint."""
    if not isinstance(not_an_endpoint, NotAnEndpoint):
        raise ValueError("expected an method of a spawned actor")
    return not_an_endpoint.as_endpoint(propagate, explicit_response_port)
