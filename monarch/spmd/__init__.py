"""``monarch.spmd``: torchrun-style SPMD code on actor meshes, and actor meshes from SPMD jobs.

- ``setup_torch_elastic_env(proc_mesh)`` gives every proc of a mesh torchrun's environment for
  its rank (master: the proc at all-zero coordinates), so actors spawned there can call
  ``torch.distributed.init_process_group()``; ``SPMDActor.main`` runs a whole script per proc.
- ``host_mesh_from_store(store)``, called by every rank of a running torchrun or
  ``python -m monarch.launch`` job, gives global rank 0 a HostMesh over all the job's nodes.
"""

from monarch._src.spmd.actor import SPMDActor as SPMDActor
from monarch._src.spmd.actor import setup_torch_elastic_env as setup_torch_elastic_env
from monarch._src.spmd.actor import setup_torch_elastic_env_async as setup_torch_elastic_env_async
from monarch._src.spmd.host_mesh import host_mesh_from_store as host_mesh_from_store

__all__ = ["SPMDActor", "host_mesh_from_store", "setup_torch_elastic_env", "setup_torch_elastic_env_async"]
