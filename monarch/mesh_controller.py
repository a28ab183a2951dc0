"""Monarch's home of the tensor engine's error type (``monarch.mesh_controller.RemoteException``)."""

from monarch._src.tensor.worker import RemoteException as RemoteException

__all__ = ["RemoteException"]
