"""Armed in the pilot's worker server, imported there first and nowhere else.

With the ``forkserver`` start method (:func:`probeselect.pilot.worker_context`) pilot workers are
children of a server process, not of the pilot, and the server outlives the pilot for as long as any
worker runs (each worker holds the server's "alive" pipe open). A pilot killed with SIGKILL (the OOM
killer, ``kill -9``) would then leave its workers training and writing into the pilot folder, which
a re-run may already be writing. On Linux this module, the first entry of
:data:`probeselect.pilot.WORKER_PRELOAD`, asks the kernel to send the server SIGTERM when the pilot
process dies (``PR_SET_PDEATHSIG``); every worker asks the same of the server
(:func:`probeselect.pilot._worker_init`), so the chain ends with the pilot. Elsewhere it does nothing.
"""

from __future__ import annotations

import os
import signal
import sys


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - no libc/prctl: nothing to arm
        return
    if os.getppid() == 1:  # the pilot died before the signal was armed
        os._exit(0)


_die_with_parent()
