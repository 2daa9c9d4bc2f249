"""What both trainers' callbacks do, apart from the trainer's API."""

import gpumem_top


class Publishing:
    """Publishes once (``gpumem_top.publish``) with each step's true peaks
    (and, when asked, the memory history a snapshot needs to replay the
    run); writes a snapshot at every CUDA out-of-memory error and, if asked,
    at the end."""

    def __init__(self, interval, step_peaks, history, history_stacks, oom_snapshot, snapshot_at_end):
        self.interval = interval
        self.history_stacks = history_stacks
        self.step_peaks = step_peaks
        self.history = history
        self.oom_snapshot = oom_snapshot
        self.snapshot_at_end = snapshot_at_end
        self.started = False

    def start(self):
        if self.started:
            return
        self.started = True
        gpumem_top.publish(
            interval=self.interval,
            step_peaks=self.step_peaks,
            history=self.history or None,
            history_stacks=self.history_stacks,
        )
        if self.oom_snapshot:
            gpumem_top.snapshot_on_oom(self.oom_snapshot)

    def step(self):
        gpumem_top.step()

    def end(self):
        if self.snapshot_at_end:
            gpumem_top.snapshot(self.snapshot_at_end)


def missing(what, package, error):
    return ImportError(
        "gpumem_top.integrations.%s needs %s (pip install %s): %s" % (what, package, package, error)
    )
