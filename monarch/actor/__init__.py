"""Monarch's actor API: actors, meshes, adverbs, futures, ports and supervision.

Implementations live in ``monarch._src``; this facade re-exports them explicitly.
"""

from monarch._src.actor import config as config
from monarch._src.actor.actor import Actor as Actor
from monarch._src.actor.actor_mesh import ActorMesh as ActorMesh
from monarch._src.actor.context import Context as Context
from monarch._src.actor.context import context as context
from monarch._src.actor.context import current_actor_name as current_actor_name
from monarch._src.actor.context import current_rank as current_rank
from monarch._src.actor.context import current_size as current_size
from monarch._src.actor.endpoint import ActorEndpoint as Endpoint
from monarch._src.actor.endpoint import as_endpoint as as_endpoint
from monarch._src.actor.endpoint import concurrent_endpoint as concurrent_endpoint
from monarch._src.actor.endpoint import endpoint as endpoint
from monarch._src.actor.errors import ActorError as ActorError
from monarch._src.actor.errors import SupervisionError as SupervisionError
from monarch._src.actor.future import Future as Future
from monarch._src.actor.instance import ActorInstance as Instance
from monarch._src.actor.messaging import Accumulator as Accumulator
from monarch._src.actor.messaging import send as send
from monarch._src.actor.port import Channel as Channel
from monarch._src.actor.port import Port as Port
from monarch._src.actor.port import PortReceiver as PortReceiver
from monarch._src.actor.proc_mesh import ProcMesh as ProcMesh
from monarch._src.actor.proc_mesh import get_or_spawn_controller as get_or_spawn_controller
from monarch._src.actor.proc_mesh import this_proc as this_proc
from monarch._src.actor.supervision import MeshFailure as MeshFailure
from monarch._src.actor.supervision import unhandled_fault_hook as unhandled_fault_hook
from monarch._src.host.host_mesh import HostMesh as HostMesh
from monarch._src.host.host_mesh import shutdown_context as shutdown_context
from monarch._src.host.host_mesh import this_host as this_host
from monarch._src.host.hosts_config import hosts_from_config as hosts_from_config
from monarch._src.host.workers import attach_to_workers as attach_to_workers
from monarch._src.host.workers import run_worker_loop_forever as run_worker_loop_forever
from monarch._src.mesh.extent import Extent as Extent
from monarch._src.mesh.point import Point as Point
from monarch._src.mesh.shape import Shape as Shape
from monarch._src.mesh.value_mesh import ValueMesh as ValueMesh
from monarch._src.runtime.transport_choice import enable_transport as enable_transport
from monarch._src.tensor import hooks as _tensor_hooks  # noqa: F401  (ProcMesh.activate, endpoint.rref)

__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorMesh",
    "Channel",
    "Context",
    "Endpoint",
    "Extent",
    "Future",
    "HostMesh",
    "Instance",
    "MeshFailure",
    "Point",
    "Port",
    "PortReceiver",
    "ProcMesh",
    "Shape",
    "SupervisionError",
    "ValueMesh",
    "as_endpoint",
    "attach_to_workers",
    "concurrent_endpoint",
    "config",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "enable_transport",
    "endpoint",
    "get_or_spawn_controller",
    "hosts_from_config",
    "run_worker_loop_forever",
    "send",
    "shutdown_context",
    "this_host",
    "this_proc",
    "unhandled_fault_hook",
]

# Pickles, reprs and tracebacks name the public path: pickle finds a class or function by
# ``__module__`` plus ``__qualname__``, so a name exported under another name (``Instance`` is
# ``ActorInstance``) takes its public name too, or it would not pickle at all.
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) or callable(_obj):
        try:
            _obj.__module__ = __name__
            _obj.__qualname__ = _obj.__name__ = _name
        except (AttributeError, TypeError):
            pass
del _name, _obj
