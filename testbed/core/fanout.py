"""The one way to do something on several hosts (or links) at once: `fan_out`, with results
in Fabric's own shape (`GroupResult`, `GroupException`): a partial failure keeps the successes
and each failure with its host.

    results = raise_failures("probing", fan_out(probe, devices))
    try:
        results = hc.run_all("uname -r")
    except GroupError as err:
        results = err.result            # still holds every host that answered
        for host, exc in err.result.failed.items(): ...

Keys are host names (Fabric's are Connections): each host runs its own command line (its
working directory, its environment), which Fabric's groups cannot express.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from operator import attrgetter
from typing import TypeVar

from fabric import GroupResult as FabricGroupResult
from fabric.exceptions import GroupException

from testbed.core.errors import AgentError, TestbedError

T = TypeVar("T")
K = TypeVar("K")


class GroupResult(FabricGroupResult):
    """Host name -> result or the exception that stopped it; `.succeeded` / `.failed`."""

    def reasons(self) -> dict[str, str]:
        """Host name -> why it failed (each message names its host)."""
        return {
            key: text if text.startswith(f"{key}:") else f"{key}: {text}"
            for key, text in ((key, str(exc)) for key, exc in self.failed.items())
        }


class GroupError(AgentError, GroupException):
    """Some hosts failed; `.result` is the whole GroupResult (successes included). Its exit
    code is the failures' own where they agree (a link that cannot be impaired anywhere is
    an impairment error), else the agents' one."""

    def __init__(self, what: str, result: GroupResult) -> None:
        failed = result.reasons()
        AgentError.__init__(
            self,
            f"{what} failed on {len(failed)} of {len(result)} host(s): "
            + "; ".join(failed.values()),
        )
        codes = {getattr(exc, "exit_code", None) for exc in result.failed.values()}
        if len(codes) == 1 and None not in codes:
            self.exit_code = codes.pop()
        self.result = result


def fan_out(
    fn: Callable[[K], T],
    items: Iterable[K],
    key: Callable[[K], str] = attrgetter("name"),
    max_workers: int = 32,
    sequential: bool = False,
) -> GroupResult:
    """`fn(item)` for every item in threads (one after the other if `sequential`: a dry run,
    whose printed commands then come host by host); a GroupResult keyed by `key(item)`
    (default: its `.name`, a host's), in item order.

    An exception other than AgentError is wrapped in one naming the key, so every failure
    says which host it was.
    """
    items = list(items)
    result = GroupResult()
    if not items:
        return result
    workers = 1 if sequential else max(1, min(max_workers, len(items)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [(key(item), pool.submit(fn, item)) for item in items]
        for name, fut in futures:
            try:
                result[name] = fut.result()
            except TestbedError as exc:  # says what failed; its exit code is kept
                result[name] = exc
            except Exception as exc:
                wrapped = AgentError(f"{name}: {exc}")
                wrapped.__cause__ = exc
                result[name] = wrapped
    return result


def raise_failures(what: str, result: GroupResult) -> GroupResult:
    """`result` itself, or GroupError if any host failed."""
    if result.failed:
        raise GroupError(what, result)
    return result
