"""Monarch's getting-started guide, run against monarch-aio, in the guide's order.

"Multiple Hosts" runs on the hosts that ``MONARCH_HOSTS`` names (see docs/hosts.md); unset, the
example sets it to ``local:2``: two host agents on this machine, started as subprocesses and
torn down when the script exits.

Run: python examples/getting_started.py
"""

# --- Defining an Actor -------------------------------------------------------------------------
from monarch.actor import Actor, endpoint, this_proc


class Counter(Actor):
    def __init__(self, initial_value: int):
        self.value = initial_value

    @endpoint
    def increment(self) -> None:
        self.value += 1

    @endpoint
    def get_value(self) -> int:
        return self.value


# --- Spawning An Actor In The Local Process ----------------------------------------------------
counter: Counter = this_proc().spawn("counter", Counter, initial_value=0)

# --- Sending A Simple Message -----------------------------------------------------------------
from monarch.actor import Future

fut: Future[int] = counter.get_value.call_one()
value: int = fut.get()
print(f"Counter value: {value}")

# --- Multiple Actors at Once ------------------------------------------------------------------
from monarch.actor import ProcMesh, this_host

procs: ProcMesh = this_host().spawn_procs(per_host={"gpus": 8})
counters: Counter = procs.spawn("counters", Counter, 0)

# --- Broadcasting Messages --------------------------------------------------------------------
counters.increment.broadcast()

# --- Slicing Meshes ----------------------------------------------------------------------------
counters.slice(gpus=slice(0, 4)).increment.broadcast()

print(counters.get_value.call().get())

# --- Multiple Hosts ----------------------------------------------------------------------------
import os

os.environ.setdefault("MONARCH_HOSTS", "local:2")  # (monarch-aio) no cluster named: two local agents

from monarch.actor import HostMesh, context, hosts_from_config

hosts: HostMesh = hosts_from_config("MONARCH_HOSTS")
print(hosts.extent)
# An extent is the logical shape of a mesh. It is an ordered map, specifying the size of
# each dimension in the mesh.


class Trainer(Actor):
    @endpoint
    def step(self):
        my_point = context().message_rank
        return f"Trainer {my_point} taking a step."


trainer_procs: ProcMesh = hosts.spawn_procs(per_host={"gpus": 4})
print(f"Process mesh extent: {trainer_procs.extent}")

trainers = trainer_procs.spawn("trainer", Trainer)

print(trainers.step.call().get())

# --- Logging -----------------------------------------------------------------------------------
# Worker output reaches this terminal by default. Streaming it to the client with a window
# collapses similar lines (here: for 3 seconds) into one summary line.
import asyncio

asyncio.run(procs.logging_option(stream_to_client=True, aggregate_window_sec=3))


# (monarch-aio addition) see the aggregation: eight workers print the same kind of line, and
# one "[8 similar log lines] hello from gpus=..." line reaches the terminal.
class Greeter(Actor):
    @endpoint
    def greet(self) -> None:
        print(f"hello from gpus={context().message_rank['gpus']}")


procs.spawn("greeters", Greeter).greet.call().get()

# --- Actor and Process References -------------------------------------------------------------


class DataLoader(Actor):
    def __init__(self):
        self.i = 0

    @endpoint
    def example(self):
        self.i += 1
        return f"<data {self.i}>"


class Trainer(Actor):
    def __init__(self, dataloader: DataLoader):
        my_rank = context().actor_instance.rank
        # select or single corresponding data loader to work with.
        self.dataloader = dataloader.slice(**my_rank)

    @endpoint
    def step(self, input=None):
        data = self.dataloader.example.call_one().get()
        return f"Step with data {data} and input = {input}"


dataloaders = trainer_procs.spawn("dataloader", DataLoader)
dtrainers = trainer_procs.spawn("dtrainers", Trainer, dataloaders)

print(dtrainers.step.call().get())

# --- The Supervision Tree ---------------------------------------------------------------------


class Errorful(Actor):
    @endpoint
    def say_hello(self):
        raise Exception("I don't want to")


e = this_proc().spawn("errorful", Errorful)
try:
    e.say_hello.call_one().get()
except Exception:
    print("It didn't say hello")

# --- Broadcasting Without Response -------------------------------------------------------------
if False:
    e.say_hello.broadcast()  # do not expect a response

# --- Fine-grained Supervision ------------------------------------------------------------------
from monarch.actor import MeshFailure


class SupervisorActor(Actor):
    def __supervise__(self, failure: MeshFailure):
        # The failure message will include the id of the actor that failed and
        # the reason why.
        print(f"Failure received: {failure}")
        # Returning a truthy value marks the failure handled: it goes no further up.
        return True


import monarch.actor


def my_unhandled_fault_hook(failure: MeshFailure) -> None:
    # Log it, add metrics, etc.
    print(f"Mesh failure was not handled: {failure}")


monarch.actor.unhandled_fault_hook = my_unhandled_fault_hook

# (monarch-aio addition) see both at work: a supervisor owns a mesh whose broadcast fails, and
# an unsupervised broadcast failure reaches the replaced hook instead of ending the script.


class Parent(SupervisorActor):
    @endpoint
    def start_child(self) -> None:
        self.child = this_proc().spawn("child", Errorful)
        self.child.say_hello.broadcast()
        try:  # answered after the failure above was reported to this supervisor
            self.child.say_hello.call_one().get()
        except Exception:
            pass

    @endpoint
    def ping(self) -> str:
        return "parent still running"


parent = this_proc().spawn("parent", Parent)
parent.start_child.call_one().get()
e.say_hello.broadcast()
try:  # answered after the broadcast's failure reached the hook
    e.say_hello.call_one().get()
except Exception:
    pass
print(parent.ping.call_one().get())

# --- Point-to-Point RDMA -----------------------------------------------------------------------
import torch

from monarch.rdma import RDMABuffer


class ParameterServer(Actor):
    def __init__(self):
        self.weights = torch.rand(1000, 1000)  # Large model weights
        # RDMABuffer does not copy the data. It just
        # creates a view of the data that can be passed to
        # other processes.
        self.weight_buffer = RDMABuffer(self.weights.view(torch.uint8).flatten())

    @endpoint
    def get_weights(self) -> RDMABuffer:
        return self.weight_buffer  # Small message: just a reference!

    @endpoint
    def checksum(self) -> float:  # (monarch-aio addition) to show that the bytes arrived
        return float(self.weights.sum())


class Worker(Actor):
    def __init__(self):
        self.local_weights = torch.zeros(1000, 1000)

    @endpoint
    def sync_weights(self, server: ParameterServer):
        # Control plane: get lightweight reference
        weight_ref = server.get_weights.call_one().get()
        # Data plane: explicit bulk transfer when needed
        weight_ref.read_into(self.local_weights.view(torch.uint8).flatten()).get()

    @endpoint
    def checksum(self) -> float:  # (monarch-aio addition)
        return float(self.local_weights.sum())


server_proc = this_host().spawn_procs(per_host={"gpus": 1})
worker_proc = this_host().spawn_procs(per_host={"gpus": 1})

server = server_proc.spawn("server", ParameterServer)
worker = worker_proc.spawn("worker", Worker)

worker.sync_weights.call_one(server).get()
print(f"RDMA weights synced: {worker.checksum.call_one().get() == server.checksum.call_one().get()}")
# --- end of Point-to-Point RDMA ----------------------------------------------------------------

# --- Actor Context -----------------------------------------------------------------------------


class ContextAwareActor(Actor):
    @endpoint
    def get_context_info(self):
        actor_instance = context().actor_instance
        message_rank = context().message_rank
        return f"Actor rank: {actor_instance.rank}, message rank: {message_rank}"


c = trainer_procs.spawn("context_actor", ContextAwareActor)
print(c.get_context_info.call().get())

# --- Channels and Low-level messaging ----------------------------------------------------------
from monarch.actor import Channel, Port

port, recv = Channel.open()

port.send(3)
print(recv.recv().get())

# The guide sends a remote function here (covered later); an endpoint of the 4 actors on the
# second host answers the same way, once per actor.
from monarch.actor import send

send(c.slice(hosts=1).get_context_info, args=(), kwargs={}, port=port)

for _ in range(4):
    print(recv.recv().get())

# === Tensor engine (the guide's "Distributed Tensors", "Free Remote Functions", and the remote
# === function of "Channels and Low-level messaging"), on the 8 procs of the two hosts above ====

# --- Distributed Tensors -----------------------------------------------------------------------
with trainer_procs.activate():
    t = torch.rand(3, 4)
    print(t)

from monarch import fetch_shard

print("one", fetch_shard(t, hosts=0, gpus=0).get())
print("two", fetch_shard(t, hosts=0, gpus=1).get())

with trainer_procs.activate():
    dist_compute = t @ t.T
    print("dist", fetch_shard(dist_compute, hosts=0, gpus=0).get())

print(dtrainers.step.call(dist_compute[0]).get())


class LinearActor(Actor):
    def __init__(self):
        self.w = torch.rand(3, 3)

    # The propagation function is like a type signature: it computes the shape of the output,
    # given an input of a particular shape.
    @endpoint(propagate=lambda x: x)
    def forward(self, input):
        return input @ self.w


linear = trainer_procs.spawn("linear", LinearActor)
o = torch.relu(linear.forward.rref(t))

# (monarch-aio) the guide's t is 3x4 and w 3x3, so forward fails on every proc; the error (with
# the remote traceback) surfaces when o, or anything computed from it, is fetched.
from monarch import RemoteException

try:
    fetch_shard(o).get()
except RemoteException as error:
    print("forward failed remotely:", str(error).splitlines()[0])
o = torch.relu(linear.forward.rref(dist_compute))  # 3x3: fits
print("relu(linear)", fetch_shard(o, hosts=1, gpus=3).get())

# --- Free Remote Functions ---------------------------------------------------------------------
from monarch import remote


@remote
def check_memory():
    import psutil

    return psutil.Process().memory_info()


with trainer_procs.activate():
    print(check_memory.call().get())

# --- Channels and Low-level messaging: send() to a remote function -----------------------------
with trainer_procs.activate():
    send(check_memory, args=(), kwargs={}, port=port)

for _ in range(len(trainer_procs)):  # one reply from each proc
    print("sent:", recv.recv().get())

# === end of the tensor engine sections ==========================================================

# --- Responding Out of Order -------------------------------------------------------------------
import threading
import time
from queue import Queue


class InferenceEngine(Actor):
    def __init__(self):
        self.q = Queue()
        self.new_weights = None
        self.worker = threading.Thread(target=self.run)
        self.worker.start()

    @endpoint
    def update_weights(self, new_weights):
        self.new_weights = new_weights

    @endpoint(explicit_response_port=True)
    def infer(self, port: Port[int]):
        self.q.put(port)

    def run(self):
        while True:
            request = self.q.get()
            # always use the most recent weight version we have:
            result = f"inferred with: {self.new_weights}"
            # pretend to take time
            time.sleep(1)
            # process request, send response
            request.send(result)


engine = this_proc().spawn("engine", InferenceEngine)
engine.update_weights.broadcast(0)
first = engine.infer.call_one()
second = engine.infer.call_one()
engine.update_weights.broadcast(1)
print(first.get())
print(second.get())  # still uses newest weights
