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
    """Raised by ``Stopped.handler`` when the process gets SIGINT or SIGTERM (a scheduler preempting it,
    Ctrl-C). A BaseException, so that no ``except Exception`` of a run records it as a crash, and not a
    KeyboardInterrupt, which Lightning turns into ``sys.exit(1)``. ``detail`` says what became of the run."""

    def __init__(self, signum: int, detail: str = ""):
        super().__init__(signum, detail)
        self.signum, self.detail = signum, detail

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def __str__(self) -> str:
        return f"stopped by {self.name}" + (f": {self.detail}" if self.detail else "")

    @classmethod
    @contextmanager
    def on_signals(cls):
        """SIGINT and SIGTERM raise ``Stopped`` inside the block (Lightning calls the SIGTERM handler it finds
        after its own), and the handlers before it come back after. Signals reach only the main thread."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        before = {signum: signal.signal(signum, cls.handler) for signum in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for signum, handler in before.items():
                signal.signal(signum, handler)

    @classmethod
    def handler(cls, signum: int, frame) -> None:
        """The signal handler. Further SIGINTs and SIGTERMs are ignored from here on (``on_signals`` puts the
        earlier handlers back), so a second signal cannot cut short the recording of the first."""
        for other in (signal.SIGINT, signal.SIGTERM):
            signal.signal(other, signal.SIG_IGN)
        raise cls(signum)
