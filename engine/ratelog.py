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
    def __init__(self, logger: logging.Logger, interval_s: float = DEFAULT_INTERVAL_S):
        self.logger = logger
        self.interval_s = interval_s
        self._lock = lock("log.rate_limit")
        self._seen: dict[str, tuple[float, int]] = {}  # key -> (last logged at, repeats held back)

    def log(self, level: int, key: str, message: str, *args) -> bool:
        """Log ``message % args`` unless ``key`` was logged less than ``interval_s`` ago;
        True when it was logged."""
        now = time.monotonic()
        with self._lock:
            logged_at, held = self._seen.get(key, (None, 0))
            if logged_at is not None and now - logged_at < self.interval_s:
                self._seen[key] = (logged_at, held + 1)
                return False
            self._seen[key] = (now, 0)
        if held:
            message += " (and %d more times in the last %.0f s)"
            args = (*args, held, now - logged_at)
        self.logger.log(level, message, *args)
        return True

    def warning(self, key: str, message: str, *args) -> bool:
        return self.log(logging.WARNING, key, message, *args)

    def error(self, key: str, message: str, *args) -> bool:
        return self.log(logging.ERROR, key, message, *args)
