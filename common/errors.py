"""The project's user-input errors, importable without torch: the CLI catches them before any heavy import.

Failure policy (README, "When things go wrong"): a ``ConfigError`` or ``DataError`` is the user's to fix;
it is found before a run directory is created, printed as one line, and exits with status 2. ``Stopped``
is a process told to stop (SIGINT, SIGTERM): not a failure of the run, exit status 128 + the signal."""
import signal
import threading
from contextlib import contextmanager


def error_line(err: BaseException) -> str:
    """``<Type>: <first line of the message>``, as a record's ``error`` and the one-line messages give it."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


class OneLine:
    """An error whose message is one line. A DataLoader worker sends its error back to the main process as
    text and PyTorch rebuilds it from "Caught DataError in DataLoader worker process N. Original Traceback
    (...)": the message is the traceback's last line, which is kept."""

    def __init__(self, message: str = ""):
        if message.startswith("Caught ") and "\nOriginal Traceback" in message:
            message = message.rstrip().splitlines()[-1].split(": ", 1)[-1]
        super().__init__(message)


class ConfigError(OneLine, ValueError):
    """A config the runner cannot use."""


class DataError(OneLine, Exception):
    """Bad or missing input data."""


class Stopped(BaseException):
    """Raised inside ``Stopped.on_signals`` when the process gets SIGINT or SIGTERM (a scheduler preempting it,
    Ctrl-C). A BaseException, so that no ``except Exception`` of a run records it as a crash, and not a
    KeyboardInterrupt, which Lightning turns into ``sys.exit(1)``. ``detail`` says what became of the run."""

    def __init__(self, signum: int, detail: str = ""):
        super().__init__(signum, detail)
        self.signum, self.detail = signum, detail
        self.name, self.exit_code = signal.Signals(signum).name, 128 + signum

    def __str__(self) -> str:
        return f"stopped by {self.name}" + (f": {self.detail}" if self.detail else "")

    @classmethod
    @contextmanager
    def on_signals(cls):
        """SIGINT and SIGTERM raise ``Stopped`` inside the block (Lightning calls the SIGTERM handler it finds
        after its own), and the handlers before it come back after. Only the first signal raises: a second one
        (a launcher passing on the SIGTERM its process group already got) must not cut short the recording of
        the first. Ignoring signals is not enough for that, because Lightning's teardown puts back the handler
        it found when fitting began, which is this one. Signals reach only the main thread."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        first: list[int] = []

        def handler(signum: int, frame) -> None:
            if first:
                return
            first.append(signum)
            raise cls(signum)

        before = {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for signum, earlier in before.items():
                signal.signal(signum, earlier)
