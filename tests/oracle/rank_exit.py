"""How an oracle's rank process ends (torch.multiprocessing.spawn, Gloo).

Note [Oracle ranks end with os._exit]: a rank that returns from its spawn
function leaves its ProcessGroupGloo to interpreter shutdown whenever
something still holds the group (FSDP2's state does), and the group's
worker thread may still be dropping its last collective's work then: that
drops tensors with Python objects, which takes the GIL, which a finalizing
interpreter refuses with pthread_exit, which unwinds through a noexcept
frame: "terminate called without an active exception", SIGABRT, and spawn
reports the rank dead although every result was written. Seen in CI
(tests/oracle/fsdp_oracle.py on the CUDA 2.14.1 build) and reproduced here
in 4 of 12 runs beside the launcher tests, the stack in
ProcessGroupGloo::runLoop -> decref_pyobject; destroy_process_group does not
stop Gloo's worker threads (its shutdown does nothing), and pytorch#190489
and the abandoned pytorch#179291 describe related exits. So a rank that has
written its results waits for its peers, destroys its group and leaves at
once, skipping interpreter shutdown: no value is affected, only how the
process ends.
"""
import os
import sys

import torch.distributed as dist


def end_rank():
    """Ends this rank's process with exit status 0 after every rank got here.

    Call last in the spawn function, after the results are written and
    closed: nothing after it runs (no atexit handlers, no finally blocks).
    """
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
