"""Exit codes of the CLI and the errors that map onto them."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What failed, as a process exit status."""

    OK = 0
    FAILED = 1  # generic failure
    BAD_INPUT = 2  # a playbook, inventory, topology or argument is invalid
    LAB = 3  # the lab could not be brought up or torn down
    IMPAIRMENT = 4  # a link profile could not be applied or measured as asked
    AGENTS = 5  # agents could not be started or their records fetched
    CONDITIONS_FAILED = 6  # the run finished but some conditions failed or faulted
    MISSING_PRIVILEGE = 7  # needs root / a kernel feature this machine lacks
    REGRESSION = 8  # testbed compare: a metric moved past its tolerance the bad way


class TestbedError(RuntimeError):
    """An error with an exit code and a message meant for the user."""

    exit_code: ExitCode = ExitCode.FAILED

    def __init__(self, message: str, exit_code: ExitCode | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class BadInputError(TestbedError):
    """Invalid user input; the message names the file, key and what was expected."""

    exit_code = ExitCode.BAD_INPUT


class LabError(TestbedError):
    exit_code = ExitCode.LAB


class ImpairmentError(TestbedError):
    exit_code = ExitCode.IMPAIRMENT


class AgentError(TestbedError):
    exit_code = ExitCode.AGENTS


class PrivilegeError(TestbedError):
    exit_code = ExitCode.MISSING_PRIVILEGE


class AgentEnded(AgentError):
    """A process the runner started ended by itself, not with status 0, before the runner
    stopped it (a reference-answer agent, a link probe's sender or responder): a fault of the
    condition, not a failure of the testbed. `exit_status` is a shell's (128 + n for signal
    n; None where there is none); `log_tail`, its last output."""

    def __init__(
        self, message: str, host: str, agent: str, exit_status: int | None, log_tail: str = ""
    ) -> None:
        super().__init__(message)
        self.host, self.agent, self.exit_status, self.log_tail = host, agent, exit_status, log_tail


def shell_status(returncode: int | None) -> int | None:
    """A subprocess's return code as a shell gives it: 128 + n for a process signal n ended
    (Python's -n)."""
    return 128 - returncode if returncode is not None and returncode < 0 else returncode
