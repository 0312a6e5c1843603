"""Multi-process training over MPI: collectives on tensors and a data-parallel gradient averager.

Launch a script with `mpirun -n N python script.py`; each process is one rank. See docs/distributed.md.

>>> from fusegrad import Tensor, distributed as dist
>>> dist.init() is not None and dist.rank() < dist.world_size()
True
"""
from fusegrad.distributed.data_parallel import DataParallel
from fusegrad.distributed.mpi import DistributedError, allreduce, barrier, broadcast, init, rank, world_size

__all__ = ["DataParallel", "DistributedError", "allreduce", "barrier", "broadcast", "init", "rank", "world_size"]
