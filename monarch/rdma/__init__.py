"""Monarch's point-to-point RDMA API: ``RDMABuffer`` handles travel in messages, and bytes move
only on an explicit one-sided ``read_into``/``write_from``.

Implementations live in ``monarch._src.rdma``; this facade re-exports them explicitly.
"""

from monarch._src.rdma.buffer import RDMAAction as RDMAAction
from monarch._src.rdma.buffer import RDMABuffer as RDMABuffer
from monarch._src.rdma.buffer import get_rdma_backend as get_rdma_backend
from monarch._src.rdma.buffer import is_ibverbs_available as is_ibverbs_available
from monarch._src.rdma.buffer import is_rdma_available as is_rdma_available
from monarch._src.rdma.notices import RDMAReadTransferWarning as RDMAReadTransferWarning
from monarch._src.rdma.notices import RDMATcpFallbackWarning as RDMATcpFallbackWarning
from monarch._src.rdma.notices import RDMAWriteTransferWarning as RDMAWriteTransferWarning

__all__ = [
    "RDMAAction",
    "RDMABuffer",
    "RDMAReadTransferWarning",
    "RDMATcpFallbackWarning",
    "RDMAWriteTransferWarning",
    "get_rdma_backend",
    "is_ibverbs_available",
    "is_rdma_available",
]
