"""What one verify call decided (`Verdict`), a verify on its way (`InFlight`), the cloud lost
mid-generation (`CloudLost`), and where a cloud held in two runtimes verifies (`Route`): the values
that pass between the loop, the cloud and the drafters.
Apart from `specdec.core.cloud` so that a drafter never reaches the run settings (config.py takes
the drafters' names from their registry)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from specdec.errors import SpecdecError


class Route(Enum):
    """Where a cloud held in two runtimes (specdec/core/two_runtime.py) verifies a cycle. Its value is
    the name the trace gives a cycle without a draft."""

    STEP = "plain"  # a plain step (one token in, the cloud's next token out) in the plain steps' runtime
    BLOCK = "block"  # the draft block, in the blocks' runtime
    STAY = "stay"  # a plain step in the blocks' runtime, which holds the newest cache

    @property
    def in_blocks(self) -> bool:
        """Verified in the blocks' runtime."""
        return self is not Route.STEP


class CloudLost(SpecdecError):
    """The cloud stopped answering in the middle of a generation (server gone, call timed out)."""


@dataclass
class Verdict:
    """What one verify call decided, and what it cost."""

    accepted: int  # draft tokens kept, in [0, n]
    next_token: int  # correction at position `accepted`, or the bonus when accepted == n
    tokens_in: int  # token ids the cloud consumed: unseen accepted + draft
    sent_features: bool  # the prompt's multimodal features went up with this call
    wire_up_bytes: int = 0  # bytes that really crossed (remote only)
    wire_down_bytes: int = 0
    wait_s: float = 0.0  # edge wall time from sending the block to holding the reply (remote only)
    server_queue_s: float = 0.0  # time the request waited for the server's model (remote only)
    sent_at: float = 0.0  # time.perf_counter() when the block left (set by the link)
    read_at: float = 0.0  # ... and when its verdict was read
    path: tuple[int, ...] = ()  # a tree's accepted nodes, root to leaf (accepted of them); () for a chain


@dataclass(frozen=True)
class InFlight:
    """A block's verify, sent. In process the verdict is decided at once; behind a server it is on
    its way, and the edge may draft meanwhile (specdec/core/drafters/ahead.py)."""

    receive: Callable[[], Verdict | None]  # waits for the verdict; None: not verified (the cloud is lost)
    ready: Callable[[], bool] = lambda: True  # is the verdict in? never blocks
    deadline: float | None = None  # when it is expected (time.perf_counter()); None: nothing to overlap with

    def verdict(self) -> Verdict | None:
        return self.receive()
