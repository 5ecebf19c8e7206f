"""Log lines that repeat at most once per interval, with a count of what was held back.

A fault that every request meets (too few drives for a write, say) would otherwise write one line
per request: the first occurrence of a message key is logged at once; repeats within
``interval_s`` are only counted, and the first one after the interval is logged with that count."""

from __future__ import annotations

import logging
import time

from engine.ordered_lock import lock

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
