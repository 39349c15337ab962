"""The state of a GitHub issue, pull request or discussion, through the REST API, cached with a timestamp.

Every answer is a short readable state: ``open``, ``closed``, ``merged``, ``closed (not merged)``, or
``unknown (<why>)`` — offline, not found, rate limited until a time, a malformed answer. Nothing raises.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

API = "https://api.github.com"
CACHE_TTL = 12 * 3600  # seconds a known state is trusted
_LINK = re.compile(r"^https://github\.com/([\w.-]+)/([\w.-]+)/(issues|pull|discussions)/(\d+)")


def is_closed(state: str) -> bool:
    return state in ("closed", "merged", "closed (not merged)")


class GitHubClient:
    def __init__(self, api: str | None = None, token: str | None = None, cache_file: Path | None = None,
                 offline: bool = False, timeout: float = 10.0):  # fmt: skip
        self.api = (api or os.environ.get("EXPORT_SWEEP_GITHUB_API") or API).rstrip("/")
        self.token = token if token is not None else os.environ.get("GITHUB_TOKEN")
        self.cache_file = cache_file
        self.offline = offline
        self.timeout = timeout
        self._cache = self._load_cache()
        self.rate_limited_until: float | None = None

    def state(self, url: str) -> dict:
        """``{"state": ..., "checked_at": ..., "cached": bool}`` for an issue, PR or discussion link."""
        match = _LINK.match(url)
        if not match:
            return self._answer("unknown (not a GitHub issue or pull request link)")
        owner, repo, kind, number = match.groups()
        if self.offline:
            return self._answer("unknown (offline)")
        cached = self._cache.get(url)
        if cached and time.time() - cached.get("time", 0) < CACHE_TTL and not cached["state"].startswith("unknown"):
            return {**self._answer(cached["state"], cached["checked_at"]), "cached": True}
        if kind == "discussions":
            return self._answer("unknown (discussions have no REST state)")
        if self.rate_limited_until and time.time() < self.rate_limited_until:
            return self._answer(f"unknown (rate limited until {_clock(self.rate_limited_until)})")
        path = f"/repos/{owner}/{repo}/{'pulls' if kind == 'pull' else 'issues'}/{number}"
        answer = self._fetch(path)
        if "state" in answer:
            self._remember(url, answer["state"])
        return answer

    def _fetch(self, path: str) -> dict:
        request = urllib.request.Request(self.api + path, headers={"Accept": "application/vnd.github+json",
                                                                   "User-Agent": "export-sweep"})  # fmt: skip
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as error:
            if error.code in (403, 429) and (error.headers.get("X-RateLimit-Remaining") == "0" or error.code == 429):
                reset = error.headers.get("X-RateLimit-Reset")
                self.rate_limited_until = float(reset) if reset and reset.isdigit() else time.time() + 60
                return self._answer(f"unknown (rate limited until {_clock(self.rate_limited_until)})")
            if error.code == 404:
                return self._answer("unknown (not found: private, moved or deleted)")
            return self._answer(f"unknown (HTTP {error.code})")
        except (urllib.error.URLError, OSError, TimeoutError) as error:
            return self._answer(f"unknown (offline: {getattr(error, 'reason', error)})")
        try:
            data = json.loads(body)
            state = data["state"]
            if not isinstance(state, str):
                raise TypeError(state)
        except (ValueError, KeyError, TypeError):
            return self._answer("unknown (malformed answer from GitHub)")
        if state == "closed" and "merged" in data:  # a pull request
            state = "merged" if data.get("merged") or data.get("merged_at") else "closed (not merged)"
        return {**self._answer(state), "state": state}

    @staticmethod
    def _answer(state: str, checked_at: str | None = None) -> dict:
        return {"state": state, "checked_at": checked_at or datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "cached": False}  # fmt: skip

    # ── cache ──
    def _load_cache(self) -> dict:
        if self.cache_file is None or not Path(self.cache_file).is_file():
            return {}
        try:
            data = json.loads(Path(self.cache_file).read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}  # a broken cache is just empty

    def _remember(self, url: str, state: str) -> None:
        if self.cache_file is None or state.startswith("unknown"):
            return
        self._cache[url] = {"state": state, "time": time.time(),
                            "checked_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}  # fmt: skip
        Path(self.cache_file).parent.mkdir(parents=True, exist_ok=True)
        temporary = Path(f"{self.cache_file}.tmp")
        temporary.write_text(json.dumps(self._cache, indent=1, sort_keys=True))
        temporary.replace(self.cache_file)


def _clock(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).strftime("%H:%M UTC")
