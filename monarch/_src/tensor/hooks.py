"""Plugs the tensor engine into the actor layer, without importing torch.

``ProcMesh.activate``/``rank_tensor`` and ``endpoint.rref`` live in the actor layer, which
must not import this one; ``import monarch.actor`` loads this module, which hands them these
entry points. Each imports the engine (and torch) only when first called.
"""

from __future__ import annotations

from typing import Any

from monarch._src.actor import endpoint as endpoint_module
from monarch._src.actor import proc_mesh as proc_mesh_module


class TensorEngine:
    """What the actor layer calls for the tensor engine's features of a ``ProcMesh``."""

    @staticmethod
    def activate(mesh: Any) -> Any:
        from monarch._src.tensor.tensor import activate  # torch, only once a mesh is activated

        return activate(mesh)

    @staticmethod
    def rank_tensor(mesh: Any, dim: str | list[str]) -> Any:
        from monarch._src.tensor.reduce import rank_tensor  # torch, only once asked

        return rank_tensor(mesh, dim)


def rref(mesh: Any, name: str, propagate: Any, args: tuple, kwargs: dict) -> Any:
    """``endpoint.rref(...)``: the endpoint's results as one distributed tensor."""
    from monarch._src.tensor.remote import endpoint_rref  # torch, only once asked

    return endpoint_rref(mesh, name, propagate, args, kwargs)


proc_mesh_module.tensor_engine = TensorEngine()
endpoint_module.rref_handler = rref
