"""One error base class for everything a user can cause or fix.

Every error carries a short title and a one-line message that names what is wrong and, where
there is one, the fix. The UI and the CLI show `str(error)`; nothing below them prints.
"""

from __future__ import annotations


class SpecconsoleError(Exception):
    """Base of every error shown to a user: `title` is a few words, `str()` one line."""

    title = "specconsole error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ProfileError(SpecconsoleError):
    """A profile that cannot be used; the message names file, line (when known) and key path."""

    title = "profile error"

    def __init__(self, path: str, message: str, key: str = "", line: int | None = None,
                 column: int | None = None) -> None:
        where = path
        if line is not None:
            where += f":{line}"
            if column is not None:
                where += f":{column}"
        text = f"{where}: {key}: {message}" if key else f"{where}: {message}"
        super().__init__(text)
        self.path = path
        self.key = key
        self.line = line
        self.column = column


class SessionError(SpecconsoleError):
    """A session to a host failed; the message names the host and the fix."""

    title = "connection error"

    def __init__(self, host: str, message: str) -> None:
        super().__init__(f"{host}: {message}")
        self.host = host


class AuthRefused(SessionError):
    title = "authentication refused"


class HostUnreachable(SessionError):
    title = "host unreachable"


class HostKeyUnknown(SessionError):
    title = "host key unknown"


class HostKeyChanged(SessionError):
    title = "host key changed"


class ConnectionLost(SessionError):
    title = "connection lost"


class RemotePythonMissing(SessionError):
    title = "remote Python missing"


class RemoteModuleMissing(SessionError):
    title = "remote Python lacks a module"


class AgentError(SessionError):
    """The agent on the host reported an error or broke the protocol."""

    title = "agent error"


class PreflightFailed(SpecconsoleError):
    """Preflight refused the launch; the message lists the failed checks."""

    title = "preflight refused the launch"


class JobNeverStarts(PreflightFailed):
    """A Slurm job waits on what will not change without someone acting (held, a dependency
    that can never be satisfied, a request over its partition's limits): refused like a
    preflight (`wait` exits 6)."""

    title = "the scheduler will not start the job"


class RunNotFound(SpecconsoleError):
    title = "no run"
