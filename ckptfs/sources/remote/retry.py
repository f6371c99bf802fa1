"""Retries of transient failures: exponential backoff with full jitter, a bounded number of attempts."""

from __future__ import annotations

import logging
import random
import time
from typing import Callable

from ckptfs.counts import counted
from ckptfs.errors import NoSuchObjectError, SourceError

log = logging.getLogger("ckptfs.sources.remote")
log.addHandler(logging.NullHandler())  # retries go to the daemon's log; a command's own stderr stays one line


class TransientError(Exception):
    """A failure worth another attempt: 5xx and throttling, resets, timeouts, short bodies."""


class PermanentError(Exception):
    """A failure another attempt would repeat: 4xx, a server ignoring ranges, a wrong Content-Range."""


class MissingError(PermanentError):
    """No object to read there (403, 404): a URL without its trailing slash may name a directory instead."""


class RetryPolicy:
    def __init__(self, attempts: int = 6, base: float = 0.05, cap: float = 2.0) -> None:
        self.attempts = attempts
        self.base = base
        self.cap = cap

    def delay(self, attempt: int) -> float:
        """Full jitter (AWS's recommendation): uniform in [0, min(cap, base * 2**attempt)]."""
        return random.uniform(0, min(self.cap, self.base * 2**attempt))

    def run(self, attempt: Callable[[], object], name: str) -> None:
        """Runs ``attempt`` until it succeeds; a SourceError naming ``name`` once it fails for good."""
        for number in range(self.attempts):
            try:
                attempt()
                return
            except TransientError as exc:
                if number + 1 == self.attempts:
                    raise SourceError(f"{exc} (gave up after {counted(self.attempts, 'attempt')})", name) from None
                log.warning("%s: %s; retrying (attempt %d of %d)", name, exc, number + 2, self.attempts)
                time.sleep(self.delay(number))
            except MissingError as exc:
                raise NoSuchObjectError(str(exc), name) from None
            except PermanentError as exc:
                raise SourceError(str(exc), name) from None
