"""The wire protocol: every frame kind, every header key, and one builder per kind.

A frame header (see ``frame``) is a small msgpack map with one-letter keys, kept short because
one travels with every message. This module is the only place that spells them: senders build
headers with the builders below, receivers read them with the key constants. Some kinds are
handled by upper layers only (actors, log forwarding); they are defined here as plain data so
that every layer shares one table (docs/design.md, "Wire protocol", lists it).

The builders run once per message, so they are plain functions returning dict displays.
"""

from __future__ import annotations

from typing import Any

# -- frame kinds ------------------------------------------------------------------------------

#: Call an endpoint of one actor.
MSG_KIND = 1
#: Create one actor of a new mesh in the receiving process.
SPAWN_KIND = 2
#: A value (or exception) sent to a port.
PORT_KIND = 3
#: Stop one actor; its reply port is told once it has.
STOP_ACTOR_KIND = 4
#: Ask a worker process to exit.
STOP_PROC_KIND = 5
#: An actor failed or stopped: told to the actor that owns its mesh.
SUPERVISION_KIND = 6
#: Output lines forwarded by a spawner to the process that asked for them.
LOG_KIND = 7
#: Ask a worker to write a flush marker on its stdout and stderr.
LOG_FLUSH_KIND = 8
#: ``ProcMesh.logging_option`` applied by one worker (and, through its pipes, its spawner).
LOG_OPTION_KIND = 9
#: A client asking a host agent for a session of its job (on the agent's own connection).
HOST_HELLO_KIND = 10
#: Tree multicast: one MSG for several procs of the receiving process's host, which sends it on.
FORWARD_KIND = 11
#: The replies of several ranks to one port, gathered on their host (tree multicast).
PORT_BATCH_KIND = 12
#: ``monarch.rdma``: a request to the runtime of the process that registered a buffer.
RDMA_KIND = 13
#: The first frame on every connection between runtimes: the sender names its own address, so
#: the receiver knows whose replies a connection that drops carried, and after a drop says what
#: it had written on the connection before, so the receiver knows which replies were lost
#: (runtime-internal).
PEER_HELLO_KIND = 14
#: Messages a live peer wrote to the receiver that the receiver never read (a reset discarded
#: them) and the peer no longer kept to send again: where they were going, for the receiver to
#: report their loss to the owners of the actors they were for.
MESSAGES_LOST_KIND = 15
#: "I no longer use these shared-memory files you lent me" (runtime-internal).
SHM_GIVE_BACK_KIND = 64

KINDS = (
    MSG_KIND,
    SPAWN_KIND,
    PORT_KIND,
    STOP_ACTOR_KIND,
    STOP_PROC_KIND,
    SUPERVISION_KIND,
    LOG_KIND,
    LOG_FLUSH_KIND,
    LOG_OPTION_KIND,
    HOST_HELLO_KIND,
    FORWARD_KIND,
    PORT_BATCH_KIND,
    RDMA_KIND,
    PEER_HELLO_KIND,
    MESSAGES_LOST_KIND,
    SHM_GIVE_BACK_KIND,
)

# -- header keys ------------------------------------------------------------------------------
# One letter may mean different things in different kinds; each meaning has its own name.

#: Every frame: its kind.
KIND = "k"
#: Every frame: the byte length of each body (written by ``frame.encode_frame``).
BODY_LENGTHS = "b"
#: The actor a MSG, SPAWN or STOP_ACTOR frame is for; in SUPERVISION, the owning actor.
ACTOR = "d"
#: The endpoint a MSG frame calls.
ENDPOINT = "e"
#: Where the answer goes, ``[address, port id]`` (or None: no answer expected).
REPLY_PORT = "p"
#: In a PORT frame: the receiving port's id in the destination process.
PORT_ID = "p"
#: The sender's rank in the mesh it addressed (PORT: the rank the value is from).
RANK = "r"
#: The addressed mesh's extent, ``[labels, sizes]``.
EXTENT = "x"
#: The mesh's name (SPAWN, SUPERVISION).
NAME = "n"
#: SPAWN: the addresses of every process of the new mesh.
ADDRESSES = "a"
#: SPAWN: who spawns, ``[name, actor id, description]``.
CREATOR = "c"
#: SPAWN: the owning actor, ``[address, actor key]`` (supervision reports go there).
OWNER = "o"
#: SPAWN: the actor runs a mesh's bootstrap (``setup`` of ``spawn_procs``).
BOOT = "boot"
#: PORT: bit flags, see ``FLAG_EXCEPTION``.
FLAGS = "f"
#: STOP_ACTOR: seconds the actor has to stop.
TIMEOUT = "t"
#: SUPERVISION, MESSAGES_LOST: what happened, for people.
REPORT = "t"
#: SUPERVISION: the failed or stopped actor's mesh key.
MESH = "m"
#: SUPERVISION: present when the actor stopped (rather than failed); ``PROCESS_STOPPING`` when
#: its process was asked to exit and is stopping (see ``process_stopping``).
STOPPED = "s"
#: LOG: the client's id of the mesh the lines come from.
LOG_MESH = "m"
#: LOG: 1 for stdout, 2 for stderr.
STREAM = "s"
#: LOG: who wrote the lines, for messages about them.
LABEL = "l"
#: LOG: the prefix of each line (the worker's rank).
PREFIX = "x"
#: LOG: present when the worker's stream ended.
END_OF_STREAM = "e"
#: LOG_OPTION: the options, built by ``log_options``.
LOG_OPTIONS = "o"
#: HOST_HELLO: the client's root address (its workers' controllers live there).
ROOT = "o"
#: HOST_HELLO: the nonce the job secret (the frame's body) is sealed with.
NONCE = "n"
#: FORWARD: the procs to send the message on to, ``[[rank, address, sequence number], ...]``.
TARGETS = "t"
#: FORWARD: the address of the process that sent the multicast (see ``SEQUENCE``); PEER_HELLO:
#: the address of the process whose connection this is.
SENDER = "s"
#: FORWARD: present when the forwarder gathers the replies into one PORT_BATCH frame.
GATHER = "g"
#: PORT_BATCH: ``[[rank, number of bodies], ...]``, the bodies following in that order.
REPLIES = "v"
#: PEER_HELLO: how many frames the sender wrote on its previous connection to the receiver
#: (absent: there was none, or it never got through the handshake).
PREVIOUS_FRAMES = "n"
#: PEER_HELLO: ``[[frame index, port id], ...]``, the PORT and PORT_BATCH frames among those,
#: every one from index ``PREVIOUS_KNOWN_FROM`` on (the sender keeps a bounded record).
PREVIOUS_REPLIES = "v"
#: PEER_HELLO: ``[[frame index, header], ...]``, the SUPERVISION frames (no bodies) among those,
#: likewise: the receiver delivers those it had not read.
PREVIOUS_REPORTS = "r"
#: PEER_HELLO: the first frame index from which ``PREVIOUS_REPLIES`` and ``PREVIOUS_REPORTS``
#: are complete.
PREVIOUS_KNOWN_FROM = "f"
#: PEER_HELLO: the index of the first of those frames the sender keeps and sends again if the
#: receiver did not read them: it waits for the receiver's count (``transport.read_count``).
PREVIOUS_RESENT_FROM = "w"
#: PEER_HELLO: the number of the connection's first frame among all those the sender sent to the
#: receiver, on every connection (0 if absent): the receiver's count is of them all.
FIRST_INDEX = "j"
#: PEER_HELLO: the nonce the sender chose in the handshake of the connection those counts are
#: of (both ends know it): names that connection, which need not be the receiver's latest from
#: the sender (the hello of the one between may never have been read there).
PREVIOUS_CONNECTION = "c"
#: MESSAGES_LOST: ``[[destination, count], ...]``, a destination the key of an actor, the kind
#: of a frame for no actor, or None when the sender did not record where they were going.
LOST = "l"
#: MESSAGES_LOST: present when the messages may have been read (the receiver could not say).
UNCERTAIN = "u"
#: SHM_GIVE_BACK: names of the files given back.
FILE_NAMES = "n"
#: RDMA: what is asked (one of the ``RDMA_*`` operations below).
RDMA_OP = "o"
#: RDMA: the buffer's registration id in the owner's process.
RDMA_BUFFER = "u"
#: RDMA: where in the buffer a chunk starts; for RDMA_RELEASE, the pin's id.
RDMA_OFFSET = "f"
#: RDMA_READ: how many bytes to send back.
RDMA_LENGTH = "l"
#: RDMA_PIN: seconds the pin may last before the owner lets it go.
RDMA_TIMEOUT = "t"
#: Any frame sent between processes: indexes of the bodies that are shared-memory file names.
SHM_MOVED = "shm"
#: ... of those, the bodies to rebuild as ``bytes``.
SHM_AS_BYTES = "shmb"
#: ... of those, the files lent from the sender's pool, as ``[index, size]`` pairs.
SHM_LENT = "shml"
#: ... and the address to give them back to.
SHM_LENDER = "shmo"

#: MSG or STOP_ACTOR to a proc that tree multicast reaches too: ``[sender address, n]``, the
#: n-th such frame from that sender to that proc (the receiver restores the sender's order).
SEQUENCE = "q"

#: SUPERVISION: the ``STOPPED`` value of ``process_stopping``.
PROCESS_STOPPING = 2

#: PORT flag: the payload is an exception for the receiver to raise.
FLAG_EXCEPTION = 1

# RDMA operations (``RDMA_OP``); each but RDMA_RELEASE is answered on ``REPLY_PORT``.
#: Keep the buffer's memory registered while the asker copies it itself; answers
#: ``(pin id, pid, address)``.
RDMA_PIN = 1
#: The pin ``RDMA_OFFSET`` is no longer needed (one-way).
RDMA_RELEASE = 2
#: Send ``RDMA_LENGTH`` bytes from ``RDMA_OFFSET``: the answer's second body.
RDMA_READ = 3
#: Copy the frame's second body to ``RDMA_OFFSET``.
RDMA_WRITE = 4
#: Unregister the buffer once no pin holds it.
RDMA_DROP = 5

# Keys of the log options map (``LOG_OPTIONS``); a spawner reads them from a control line.
#: Forward output to the client.
OPT_STREAM = "s"
#: The client's address.
OPT_DEST = "d"
#: The client's id of the mesh.
OPT_MESH = "m"
#: Logging records below this level are disabled in the worker.
OPT_LEVEL = "v"
#: Prefix of each forwarded line.
OPT_PREFIX = "x"

#: The header keys of each kind, besides ``KIND``, ``BODY_LENGTHS``, ``SEQUENCE`` and the
#: ``SHM_*`` keys.
FIELDS: dict[int, tuple[str, ...]] = {
    MSG_KIND: (ACTOR, ENDPOINT, REPLY_PORT, RANK, EXTENT),
    SPAWN_KIND: (ACTOR, NAME, RANK, EXTENT, ADDRESSES, CREATOR, OWNER, BOOT),
    PORT_KIND: (PORT_ID, RANK, FLAGS),
    STOP_ACTOR_KIND: (ACTOR, REPLY_PORT, RANK, TIMEOUT),
    STOP_PROC_KIND: (),
    SUPERVISION_KIND: (ACTOR, MESH, NAME, RANK, REPORT, STOPPED),
    LOG_KIND: (LOG_MESH, STREAM, LABEL, PREFIX, END_OF_STREAM),
    LOG_FLUSH_KIND: (REPLY_PORT, RANK),
    LOG_OPTION_KIND: (REPLY_PORT, RANK, LOG_OPTIONS),
    HOST_HELLO_KIND: (REPLY_PORT, ROOT, NONCE),
    FORWARD_KIND: (ACTOR, ENDPOINT, REPLY_PORT, EXTENT, TARGETS, SENDER, GATHER),
    PORT_BATCH_KIND: (PORT_ID, REPLIES),
    RDMA_KIND: (RDMA_OP, RDMA_BUFFER, REPLY_PORT, RDMA_OFFSET, RDMA_LENGTH, RDMA_TIMEOUT),
    PEER_HELLO_KIND: (
        SENDER,
        PREVIOUS_FRAMES,
        PREVIOUS_REPLIES,
        PREVIOUS_REPORTS,
        PREVIOUS_KNOWN_FROM,
        PREVIOUS_RESENT_FROM,
        FIRST_INDEX,
        PREVIOUS_CONNECTION,
    ),
    MESSAGES_LOST_KIND: (SENDER, LOST, REPORT, UNCERTAIN),
    SHM_GIVE_BACK_KIND: (FILE_NAMES,),
}

# -- builders -----------------------------------------------------------------------------------


def message(actor: str, endpoint: str, reply: list | None, rank: int, extent: list) -> dict[str, Any]:
    return {KIND: MSG_KIND, ACTOR: actor, ENDPOINT: endpoint, REPLY_PORT: reply, RANK: rank, EXTENT: extent}


def spawn(
    actor: str,
    name: str,
    rank: int,
    extent: list,
    addresses: tuple[str, ...],
    creator: list,
    owner: list | None,
    boot: bool = False,
) -> dict[str, Any]:
    header = {
        KIND: SPAWN_KIND,
        ACTOR: actor,
        NAME: name,
        RANK: rank,
        EXTENT: extent,
        ADDRESSES: addresses,
        CREATOR: creator,
        OWNER: owner,
    }
    if boot:
        header[BOOT] = 1
    return header


def port_value(port_id: int, rank: int | None, flags: int) -> dict[str, Any]:
    header: dict[str, Any] = {KIND: PORT_KIND, PORT_ID: port_id}
    if rank is not None:
        header[RANK] = rank
    if flags:
        header[FLAGS] = flags
    return header


def stop_actor(actor: str, reply: list, rank: int, timeout: float) -> dict[str, Any]:
    return {KIND: STOP_ACTOR_KIND, ACTOR: actor, REPLY_PORT: reply, RANK: rank, TIMEOUT: timeout}


def stop_proc() -> dict[str, Any]:
    return {KIND: STOP_PROC_KIND}


def supervision(
    owner_actor: str, mesh: str, name: str, rank: int, report: str, stopped: bool
) -> dict[str, Any]:
    header: dict[str, Any] = {
        KIND: SUPERVISION_KIND,
        ACTOR: owner_actor,
        MESH: mesh,
        NAME: name,
        RANK: rank,
        REPORT: report,
    }
    if stopped:
        header[STOPPED] = 1
    return header


def process_stopping(owner_actor: str, mesh: str, name: str, rank: int) -> dict[str, Any]:
    """SUPERVISION: the actor's process was asked to exit: its death is expected, not a failure."""
    return {
        KIND: SUPERVISION_KIND,
        ACTOR: owner_actor,
        MESH: mesh,
        NAME: name,
        RANK: rank,
        REPORT: "stopping",
        STOPPED: PROCESS_STOPPING,
    }


def log_lines(mesh: Any, stream: int, label: str, prefix: str, last: bool) -> dict[str, Any]:
    header: dict[str, Any] = {KIND: LOG_KIND, LOG_MESH: mesh, STREAM: stream, LABEL: label}
    if prefix:
        header[PREFIX] = prefix
    if last:
        header[END_OF_STREAM] = 1
    return header


def log_flush(reply: list, rank: int) -> dict[str, Any]:
    return {KIND: LOG_FLUSH_KIND, REPLY_PORT: reply, RANK: rank}


def log_option(reply: list, rank: int, options: dict[str, Any]) -> dict[str, Any]:
    return {KIND: LOG_OPTION_KIND, REPLY_PORT: reply, RANK: rank, LOG_OPTIONS: options}


def log_options(stream: bool, dest: str, mesh: Any, level: int, prefix: str | None) -> dict[str, Any]:
    """The ``LOG_OPTIONS`` of a LOG_OPTION frame."""
    options: dict[str, Any] = {OPT_STREAM: stream, OPT_DEST: dest, OPT_MESH: mesh, OPT_LEVEL: level}
    if prefix is not None:
        options[OPT_PREFIX] = prefix
    return options


def host_hello(reply: list, root: str, nonce: bytes) -> dict[str, Any]:
    """Sent once on a client's connection to a host agent; the body is the sealed job secret."""
    return {KIND: HOST_HELLO_KIND, REPLY_PORT: reply, ROOT: root, NONCE: nonce}


def forward(
    actor: str,
    endpoint: str,
    reply: list | None,
    extent: list,
    targets: list[list[Any]],
    sender: str,
    gather: bool,
) -> dict[str, Any]:
    """A MSG for the procs in ``targets``, all on the receiver's host, to send on."""
    header = {
        KIND: FORWARD_KIND,
        ACTOR: actor,
        ENDPOINT: endpoint,
        REPLY_PORT: reply,
        EXTENT: extent,
        TARGETS: targets,
        SENDER: sender,
    }
    if gather:
        header[GATHER] = 1
    return header


def port_batch(port_id: int, replies: list[list[int]]) -> dict[str, Any]:
    return {KIND: PORT_BATCH_KIND, PORT_ID: port_id, REPLIES: replies}


def peer_hello(
    sender: str,
    previous: tuple[int, int, list, list, int | None] | None = None,
    first_index: int = 0,
    of: bytes = b"",
) -> dict[str, Any]:
    """``previous``: ``(frames, known from, replies, reports, resent from)`` of the sender's
    connection ``of`` (its handshake's nonce); ``first_index``: the number of the new one's
    first frame."""
    if previous is None:
        return {KIND: PEER_HELLO_KIND, SENDER: sender}
    frames, known_from, replies, reports, resent_from = previous
    hello = {
        KIND: PEER_HELLO_KIND,
        SENDER: sender,
        PREVIOUS_FRAMES: frames,
        PREVIOUS_KNOWN_FROM: known_from,
        PREVIOUS_REPLIES: replies,
        PREVIOUS_REPORTS: reports,
        PREVIOUS_CONNECTION: of,
    }
    if resent_from is not None:
        hello[PREVIOUS_RESENT_FROM] = resent_from
    if first_index:
        hello[FIRST_INDEX] = first_index
    return hello


def messages_lost(sender: str, lost: list[list[Any]], report: str, uncertain: bool) -> dict[str, Any]:
    header = {KIND: MESSAGES_LOST_KIND, SENDER: sender, LOST: lost, REPORT: report}
    if uncertain:
        header[UNCERTAIN] = True
    return header


def shm_give_back(names: list[str]) -> dict[str, Any]:
    return {KIND: SHM_GIVE_BACK_KIND, FILE_NAMES: names}


def rdma(
    op: int, buffer: int, reply: list | None, offset: int = 0, length: int = 0, timeout: float = 0
) -> dict[str, Any]:
    return {
        KIND: RDMA_KIND,
        RDMA_OP: op,
        RDMA_BUFFER: buffer,
        REPLY_PORT: reply,
        RDMA_OFFSET: offset,
        RDMA_LENGTH: length,
        RDMA_TIMEOUT: timeout,
    }
