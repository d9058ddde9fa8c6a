"""Results of one action on several hosts, in Fabric's own shape (`GroupResult`,
`GroupException`): a partial failure keeps the successes and each failure with its host.

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

from testbed.errors import AgentError

T = TypeVar("T")
K = TypeVar("K")


class GroupResult(FabricGroupResult):
    """Host name -> result or the exception that stopped it; `.succeeded` / `.failed`."""

    def reasons(self) -> dict[str, str]:
        """Host name -> why it failed (each message names its host)."""
        return {key: str(exc) for key, exc in self.failed.items()}


class GroupError(AgentError, GroupException):
    """Some hosts failed; `.result` is the whole GroupResult (successes included)."""

    def __init__(self, what: str, result: GroupResult) -> None:
        failed = result.reasons()
        AgentError.__init__(
            self,
            f"{what} failed on {len(failed)} of {len(result)} host(s): "
            + "; ".join(failed.values()),
        )
        self.result = result


def run_in_threads(
    fn: Callable[[K], T],
    items: Iterable[K],
    key: Callable[[K], str] = attrgetter("name"),
    max_workers: int = 32,
) -> GroupResult:
    """`fn(item)` for every item in threads; a GroupResult keyed by `key(item)` (default: its
    `.name`, a host's), in item order.

    An exception other than AgentError is wrapped in one naming the key, so every failure
    says which host it was.
    """
    items = list(items)
    result = GroupResult()
    if not items:
        return result
    with ThreadPoolExecutor(max_workers=min(max_workers, len(items))) as pool:
        futures = [(key(item), pool.submit(fn, item)) for item in items]
        for name, fut in futures:
            try:
                result[name] = fut.result()
            except AgentError as exc:
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
