"""Log lines that repeat at most once per interval, with a count of what was held back.

A fault that every request meets (too few drives for a write, say) would otherwise write one line
per request: the first occurrence of a message key is logged at once; repeats within
``interval_s`` are only counted, and the first one after the interval is logged with that count."""

from __future__ import annotations

import logging
import threading
import time

from engine.base.ordered_lock import lock

DEFAULT_INTERVAL_S = 60.0


class RateLimitedLog:
    """Keys must come from a small set (an operation, an error class, a fault's name), never
    from a client's bytes; the table is bounded anyway against a caller's mistake."""

    MAX_KEYS = 4096

    def __init__(self, logger: logging.Logger, interval_s: float = DEFAULT_INTERVAL_S):
        self.logger = logger
        self.interval_s = interval_s
        self._lock = lock("log.rate_limit")
        # key -> (last logged at, repeats held back)
        self._seen: dict[object, tuple[float, int]] = {}

    def log(
        self, level: int, key: object, message: str, *args: object, exc_info: bool = False
    ) -> bool:
        """Log ``message % args`` unless ``key`` was logged less than ``interval_s`` ago;
        True when it was logged."""
        if not self.logger.isEnabledFor(level):
            return False
        now = time.monotonic()
        with self._lock:
            logged_at, held = self._seen.get(key, (None, 0))
            if logged_at is not None and now - logged_at < self.interval_s:
                self._seen[key] = (logged_at, held + 1)
                return False
            if len(self._seen) >= self.MAX_KEYS:
                self._seen.clear()
            self._seen[key] = (now, 0)
        if held and logged_at is not None:
            message += " (and %d more times in the last %.0f s)"
            args = (*args, held, now - logged_at)
        self.logger.log(level, message, *args, exc_info=exc_info)
        return True

    def warning(self, key: object, message: str, *args: object) -> bool:
        return self.log(logging.WARNING, key, message, *args)

    def error(self, key: object, message: str, *args: object) -> bool:
        return self.log(logging.ERROR, key, message, *args)


class OutageLog:
    """An outage of something every thread depends on (the catalog's database), told in a few
    lines however many threads meet it and however often they retry.

    The first failure logs one line with its reason; while the outage lasts, the failures are
    counted and at most one line per ``interval_s`` says how many there were since the last
    line, and which threads met them; a success logs one line with how long it lasted, once
    no attempt has failed for ``settle_s`` since the first success (a server starting up takes
    some connections and refuses others for a moment: one outage, not several). No traceback:
    the failure is the dependency's, not a bug of the caller, and a caller that meets it logs
    nothing of its own (it was counted here)."""

    MAX_THREADS = 64  # thread names kept per interval (a name per job heartbeat, say)
    SETTLE_S = 2.0

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        interval_s: float = DEFAULT_INTERVAL_S,
        settle_s: float = SETTLE_S,
    ):
        self.logger = logger
        self.what = what
        self.interval_s = interval_s
        self.settle_s = settle_s
        # a leaf like RateLimitedLog's: nothing is taken or logged while it is held
        self._lock = lock("log.rate_limit")
        self.down_since: float | None = None  # monotonic time of the first failure; None: up
        self._up_since: float | None = None  # the first success since the last failure
        self.failures = 0  # in the current outage
        self._told_at = 0.0  # when the last line was logged
        self._untold = 0  # failures since that line
        self._threads: dict[str, int] = {}  # thread name -> failures since that line

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def failed(self, reason: str) -> None:
        """One attempt failed because ``what`` is unreachable (``reason``: one line)."""
        now = time.monotonic()
        thread = threading.current_thread().name
        with self._lock:
            self.failures += 1
            if self.down_since is None:
                self.down_since = self._told_at = now
                self.failures, self._untold = 1, 0
                self._threads.clear()
                message = "%s unreachable: %s (met by %s; further failures are counted)"
                args: tuple = (self.what, reason, thread)
            else:
                self._untold += 1
                self._up_since = None
                if len(self._threads) < self.MAX_THREADS or thread in self._threads:
                    self._threads[thread] = self._threads.get(thread, 0) + 1
                if now - self._told_at < self.interval_s:
                    return
                message = "%s unreachable: %d failures in the last %.0f s (%s)"
                args = (self.what, self._untold, now - self._told_at, self._by_thread())
                self._told_at, self._untold = now, 0
                self._threads.clear()
        self.logger.warning(message, *args)

    def recovered(self) -> None:
        """An attempt succeeded: the end of the outage, if there is one and it holds (one read
        when there is none)."""
        if self.down_since is None:
            return
        now = time.monotonic()
        with self._lock:
            if self.down_since is None:
                return  # another thread told it
            if self._up_since is None:
                self._up_since = now
            if now - self._up_since < self.settle_s:
                return  # told once it holds
            lasted = self._up_since - self.down_since
            failures = self.failures
            self.down_since = self._up_since = None
            self._untold = 0
            self._threads.clear()
        self.logger.warning(
            "%s reachable again after %.1f s (%d failures in all)", self.what, lasted, failures
        )

    def _by_thread(self) -> str:
        """The threads that met the failures of this interval, most first (a few names)."""
        ranked = sorted(self._threads.items(), key=lambda item: -item[1])
        shown = ", ".join(f"{name} {count}" for name, count in ranked[:5])
        return shown + (f" and {len(ranked) - 5} more threads" if len(ranked) > 5 else "")
