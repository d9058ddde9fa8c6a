"""The network's share of a BALANCE user's deadline, and the timers both ends keep.

A user's deadline counts on its device, from the first send of its request to the arrival of
its last token. The server sees the request after it crossed the uplink and must send the last
tokens back over the downlink, so the time it has is the deadline less:

    taken   = the request's age when it arrived (retries included) + half the RTT (the uplink)
    to_come = half the RTT (the downlink) + loss^copies x the repair of a lost final answer

With per-direction loss p and `copies` copies of each answer, all copies of the final answer
are lost with p^copies; the device notices when no answer has come for its retry timeout
plus two `ANSWER_EVERY_S` (the server answers a user in service at least that often), asks
again, and the server sends the answer again: about REPAIR_RTTS round trips (the retry
timeout and the re-ask's round trip) plus two ANSWER_EVERY_S. The server takes the link as
its device measured it (`srtt_ms`, `loss` in the request: no oracle), and the controller's
simulator predicts with the same function from the link's profile
(`testbed.balance.over_link`).
"""

from __future__ import annotations

ANSWER_EVERY_S = 0.1  # a user in service hears from the server at least this often
RETRY_RTTS = 1.5  # a device's retry timeout, in RTTs (SRTT + 4 RTTVAR on a steady link)
REPAIR_RTTS = RETRY_RTTS + 1  # a lost final answer: the retry timeout and the re-ask


def network_time_s(srtt_s: float, loss: float, copies: int = 1) -> float:
    """The link's time in a user's deadline besides its request's age: an RTT (half up,
    half down) and the expected wait to repair a lost final answer."""
    lost = min(max(loss, 0.0), 1.0) ** max(copies, 1)
    return srtt_s + lost * (REPAIR_RTTS * srtt_s + 2 * ANSWER_EVERY_S)


def server_deadline_s(
    deadline_s: float, age_s: float, srtt_s: float, loss: float, copies: int = 1
) -> float:
    """What is left of a user's deadline for the server, from when its request arrived."""
    return deadline_s - age_s - network_time_s(srtt_s, loss, copies)
