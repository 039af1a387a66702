"""A stream's worker processes started in the background (worker_type='auto'): forked in the
middle of an epoch read in-line, on the training loop's thread between two of its batches, so
they start up while it goes on; the stream moves to them at the first epoch boundary at which
each of them answered (kBackgroundStartSeconds, src/tune/worker_kind.h, says what the loop
still pays)."""

from __future__ import annotations

import threading


class BackgroundStart:
    """`workers` (ProcessWorkers) started now; a thread asks each whether it is up (an empty
    call: StreamJobs.call answers it once the worker set itself up and ran worker_init_fn)."""

    def __init__(self, workers, count: int) -> None:
        self.count = count
        self.pool = workers.make_pool()
        self.pool.start()  # the forks, on this thread (the main thread: PR_SET_PDEATHSIG)
        self._up = threading.Event()
        self._thread = threading.Thread(target=self._ask, daemon=True,
                                        name="stoker stream processes starting")
        self._thread.start()

    def _ask(self) -> None:
        # A worker that died starting is started again by its first job, whose reply then
        # says what happened, as it would without the background start: up, either way.
        # An error here (the pool closing) is the first real call's to raise, in its turn.
        try:
            for w in range(self.count):
                if not self.pool.call(w, 0, b"")[0]:
                    break
        except Exception:  # noqa: BLE001
            pass
        finally:
            self._up.set()

    def ready(self, wait: float = 0.0) -> bool:
        """Whether every worker answered (or the pool stopped), waiting up to `wait` s."""
        return self._up.wait(wait) if wait > 0 else self._up.is_set()

    def stop(self) -> None:
        """Never used: the workers are asked to exit (EOF), then reaped (as close())."""
        self.pool.stop()  # a call waiting on a worker returns at once
        self._thread.join()
        self.pool.finish()
