"""Process set-up for training jobs: the local launcher, joining a ``jax.distributed`` job, host memory.

- ``launch``: starts and supervises the processes of a job on this machine (``python -m snnjax.launch``):
  restarts, hang detection, preemption.
- ``distributed``: ``initialize`` joins a multi-process job (explicit coordinator, the launcher's environment,
  SLURM or Open MPI); ``launch_info`` says which attempt of the job this is.
- ``hostmem``: ``keep_freed_memory`` keeps freed host memory in the process for reuse (train.py calls it).
- ``trial_read``: reads an untrusted file first in a child process with a time limit (HDF5: NIR, SHD/SSC).
"""
from snnjax.runtime import distributed, hostmem, launch
from snnjax.runtime.distributed import initialize, launch_info
from snnjax.runtime.hostmem import keep_freed_memory

__all__ = ["distributed", "hostmem", "initialize", "keep_freed_memory", "launch", "launch_info"]
