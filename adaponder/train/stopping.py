"""Stopping a run cleanly: its exit codes, the exception that carries a stop to the entry point, SIGTERM/SIGINT
handlers, and the watch on the launcher processes above a rank.

A stop sets a flag; the training loops (:mod:`adaponder.train.trainer`, :mod:`adaponder.palbert.finetune`)
all-reduce it with the step's statistics, so every rank saves the checkpoint together and exits with 128+signal.
"""

from __future__ import annotations

import os
import signal
import threading

try:
    import psutil
except ImportError:  # (a DeepSpeed dependency, not one of adaponder's; without it there is nothing to watch with)
    psutil = None

from . import metrics as M

EXIT_OK, EXIT_ERROR, EXIT_NONFINITE = 0, 2, 3


class TrainingStopped(RuntimeError):
    """The run stopped before its last step for a reason the user must see (exit code attached)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class StopSignals(dict):
    """The handlers replaced by :func:`install_stop_signals` (signal → handler) and its launcher watch."""

    watch: LauncherWatch | None = None


#: Exit code of a run stopped at once by a second Ctrl-C (128 + SIGINT), without a checkpoint of its step.
EXIT_INTERRUPTED = 128 + signal.SIGINT


def install_stop_signals(on_stop, on_gone=None, saving=None) -> StopSignals:
    """SIGTERM and SIGINT call ``on_stop(signum)``: the loop saves a checkpoint at its next safe point and
    exits. A second SIGINT raises ``KeyboardInterrupt`` at once (no checkpoint), except while ``saving()`` is true:
    then one line says that the save is being waited for, and only a third one interrupts it (a checkpoint cut off
    midway is a temporary folder that the next save removes; the last complete one stays). In a rank started by a
    launcher (``deepspeed``, ``torchrun``) the death of any launcher process above it calls ``on_gone()`` (default
    ``on_stop(SIGTERM)``; :class:`LauncherWatch`): a scheduler that signals only the ``deepspeed`` runner kills
    it, and the ranks would otherwise train on, orphaned. Returns the previous handlers, for
    :func:`restore_signals`."""
    sigints, waited = [0], [False]

    def handler(signum, frame):
        if signum == signal.SIGINT:
            sigints[0] += 1
            if sigints[0] > 1 and saving is not None and saving() and not waited[0]:
                waited[0] = True  # a second Ctrl-C while the checkpoint is written: let it finish
                _say("a checkpoint is being saved: waiting for it to finish, then stopping (Ctrl-C once more stops "
                     "at once, without it)")
                return
            if sigints[0] > 1:
                raise KeyboardInterrupt  # a second Ctrl-C: stop now, without a checkpoint
        on_stop(signum)

    old = StopSignals({s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)})
    chain = launcher_chain()
    if chain:
        old.watch = LauncherWatch(chain, on_gone or (lambda: on_stop(signal.SIGTERM)))
        old.watch.start()
    return old


def _say(line: str) -> None:
    """One console line from a signal handler (rank 0). The handler may run while the main code writes to stderr;
    a reentrant write there raises, so the line then goes straight to file descriptor 2."""
    if int(os.environ.get("RANK", "0")) != 0:
        return
    try:
        M.write_console(line)
    except RuntimeError:
        os.write(2, (line + "\n").encode())


def interrupted(step: int, last_saved, last_path) -> TrainingStopped:
    """The :class:`TrainingStopped` (exit 130) of a run stopped at once by Ctrl-C (a second one, or one before the
    stop handlers were installed): what was saved, in one line, instead of a ``KeyboardInterrupt`` traceback."""
    if last_path is not None and last_saved == step:
        said = (f"stopped by Ctrl-C at step {step}, whose checkpoint {last_path} is complete; continue with "
                "--resume auto")
    elif last_path is not None:
        said = (f"stopped at once by Ctrl-C at step {step}, without saving it: the last checkpoint is {last_path} "
                f"(step {last_saved}); continue with --resume auto")
    else:
        said = f"stopped at once by Ctrl-C at step {step}, without saving it: no checkpoint of this run was saved"
    return TrainingStopped(said, EXIT_INTERRUPTED)


def stop_cause(own_signal: int | None, any_launcher_gone: bool) -> str:
    """What rank 0's stop message says stopped the ranks: its own signal, else a launcher process gone on any rank
    (all-reduced: the rank whose watch saw it first may be another), else a signal on another rank."""
    if own_signal is not None:
        return f"received {signal.Signals(own_signal).name}"
    return "a launcher process is gone" if any_launcher_gone else "received a signal on another rank"


def signal_stop(message: str, step: int, own_signal: int | None, launcher_gone: bool, log, **fields) -> TrainingStopped:
    """The ``stopped_by_signal`` event (``log``: the metrics sink's) and the :class:`TrainingStopped` to raise, exit
    128+signal (SIGTERM's when this rank received none). ``message`` follows :func:`stop_cause`; ``fields`` add to
    the event (the fine-tuning phase)."""
    name = signal.Signals(own_signal).name if own_signal else None  # None: another rank's signal, or a launcher gone
    log({"kind": "event", "step": step, "event": "stopped_by_signal", "signal": name, "launcher_gone": launcher_gone,
         **fields, "message": message})
    return TrainingStopped(message, 128 + (own_signal or signal.SIGTERM))


def saved_and_stopped(path, step: int, own_signal: int | None, launcher_gone: bool, log) -> TrainingStopped:
    """:func:`signal_stop` for a training loop that has just saved ``path`` at ``step``."""
    msg = f"{stop_cause(own_signal, launcher_gone)}: saved {path} at step {step}; continue with --resume auto"
    return signal_stop(msg, step, own_signal, launcher_gone, log)


def stop_at_step(path, step: int, log) -> TrainingStopped:
    """The ``stopped_at`` event and the :class:`TrainingStopped` (exit 0) of a run that reached ``train.stop_at``
    and saved ``path``."""
    msg = f"stopped at step {step} (train.stop_at): saved {path}; continue with --resume auto"
    log({"kind": "event", "step": step, "event": "stopped_at", "message": msg})
    return TrainingStopped(msg, EXIT_OK)


def restore_signals(old_handlers: dict) -> None:
    for s, h in old_handlers.items():
        signal.signal(s, h)
    watch = getattr(old_handlers, "watch", None)
    if watch is not None:
        watch.stop()


# Launchers whose processes stand between a scheduler and the ranks: a module name or a script's file name
# within the first arguments of their command line.
_LAUNCHER_MODULES = ("deepspeed.launcher.launch", "deepspeed.launcher.runner", "torch.distributed.run",
                     "torch.distributed.launch")
_LAUNCHER_SCRIPTS = ("deepspeed", "ds", "torchrun")


def launcher_chain() -> list:
    """The launcher processes above this one (``psutil.Process``; parent first): the parent and its ancestors as
    long as each is a DeepSpeed / torch launcher. Empty for a process not started by one (``python ...``), which
    must not stop when its shell goes away (``nohup``)."""
    if psutil is None:  # (see the import)
        return []
    chain = []
    try:
        proc = psutil.Process().parent()
        while proc is not None and proc.pid > 1:
            head = proc.cmdline()[:4]
            if not any(a in _LAUNCHER_MODULES or os.path.basename(a) in _LAUNCHER_SCRIPTS for a in head):
                break
            chain.append(proc)
            proc = proc.parent()
    except psutil.Error:
        pass
    return chain


class LauncherWatch:
    """A daemon thread that calls ``on_gone()`` once when a process of ``chain`` exits (or is a zombie), or this
    process is re-parented, checked every ``interval`` seconds. Portable (psutil), unlike ``PR_SET_PDEATHSIG``,
    which is Linux-only, fires on the death of the parent *thread*, and sees the parent only."""

    def __init__(self, chain: list, on_gone, interval: float = 1.0):
        self.chain, self.on_gone, self.interval = chain, on_gone, interval
        self._names = {}
        for proc in chain:
            try:
                self._names[proc.pid] = proc.name()
            except Exception:  # (psutil.Error: it is gone already; the first check will see that)
                self._names[proc.pid] = "?"
        self._ppid = os.getppid()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="adaponder-launcher-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _gone(self):
        if os.getppid() != self._ppid:
            return self.chain[0]
        for proc in self.chain:
            try:
                if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
                    return proc
            except psutil.Error:
                return proc
        return None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            gone = self._gone()
            if gone is not None:
                if int(os.environ.get("RANK", "0")) == 0:
                    M.write_console(f"the launcher process {gone.pid} ({self._names.get(gone.pid, '?')}) is gone: "
                                    "stopping as on SIGTERM (a checkpoint at the end of this step)")
                self.on_gone()
                return


__all__ = ["EXIT_OK", "EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_NONFINITE", "TrainingStopped", "StopSignals",
           "install_stop_signals", "interrupted",
           "stop_cause", "signal_stop", "saved_and_stopped", "stop_at_step", "restore_signals", "launcher_chain",
           "LauncherWatch"]
