"""The state of a GitHub issue, pull request or discussion, through the REST API, cached with a timestamp.

Every answer is a short readable state: ``open``, ``closed`` (done), ``merged``, closed without a fix
(``closed (not merged)``, ``closed (not planned)``, ``closed (duplicate)``), or ``unknown (<why>)`` — offline,
timed out, not found, rate limited until a time, an HTTP error, a malformed answer. Nothing raises.

1. Each request has a total deadline (``timeout`` seconds, reading the body included), not only a per-read one.
2. The token goes only over https and only to the API's own scheme, host and port: a redirect elsewhere is
   followed without it.
3. A closed issue says how it was closed: closed as not planned, or as a duplicate, is not a fix.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from http import HTTPStatus
from pathlib import Path
from urllib.parse import urlsplit

from harness.store import write_text_atomic

API = "https://api.github.com"
CACHE_TTL = 12 * 3600  # seconds a known state is trusted
MAX_ANSWER = 2 << 20  # bytes: an issue's JSON is a few kB, so more is not an answer about an issue
MAX_REDIRECTS = 5
OPEN, CLOSED, MERGED = "open", "closed", "merged"
NOT_MERGED, NOT_PLANNED, DUPLICATE = "closed (not merged)", "closed (not planned)", "closed (duplicate)"
CLOSED_WITHOUT_A_FIX = (NOT_MERGED, NOT_PLANNED, DUPLICATE)
STATES = (OPEN, CLOSED, MERGED, *CLOSED_WITHOUT_A_FIX)
_ISSUE_CLOSED_AS = {"not_planned": NOT_PLANNED, "duplicate": DUPLICATE}  # any other reason (completed, none): done
_LINK = re.compile(r"^https://github\.com/([\w.-]+)/([\w.-]+)/(issues|pull|discussions)/(\d+)")


def is_fixed(state: str) -> bool:
    """Closed as done, or merged: upstream evidence that an entry waiting on it may be stale."""
    return state in (CLOSED, MERGED)


def is_closed(state: str) -> bool:
    """Closed in any way, with a fix or without one."""
    return is_fixed(state) or state in CLOSED_WITHOUT_A_FIX


class GitHubClient:
    def __init__(self, api: str | None = None, token: str | None = None, cache_file: Path | None = None,
                 offline: bool = False, timeout: float = 10.0):  # fmt: skip
        self.api = (api or os.environ.get("EXPORT_SWEEP_GITHUB_API") or API).rstrip("/")
        self.token = (token if token is not None else os.environ.get("GITHUB_TOKEN") or "").strip()
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
        if _fresh(cached):
            return {**self._answer(cached["state"], cached["checked_at"]), "cached": True}
        if kind == "discussions":
            return self._answer("unknown (discussions have no REST state)")
        if self.rate_limited_until and time.time() < self.rate_limited_until:
            return self._answer(f"unknown (rate limited until {_clock(self.rate_limited_until)})")
        path = f"/repos/{owner}/{repo}/{'pulls' if kind == 'pull' else 'issues'}/{number}"
        answer = self._fetch(path)
        self._remember(url, answer["state"])
        return answer

    def _fetch(self, path: str) -> dict:
        deadline = _Deadline(self.timeout)
        # never over plain http, where anyone on the way reads it
        authorization = f"Bearer {self.token}" if self.token and urlsplit(self.api).scheme == "https" else None
        opener = urllib.request.build_opener(_HTTPHandler(deadline), _HTTPSHandler(deadline),
                                             _RedirectHandler(_origin(self.api), authorization))  # fmt: skip
        request = urllib.request.Request(self.api + path, headers={"Accept": "application/vnd.github+json",
                                                                   "User-Agent": "export-sweep"})  # fmt: skip
        if authorization:
            request.add_unredirected_header("Authorization", authorization)  # urllib copies only the other headers
        try:
            with opener.open(request, timeout=self.timeout) as response:
                body = _read(response)
        except urllib.error.HTTPError as error:
            error.close()
            return self._answer(self._http_error(error))
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as error:
            return self._answer(self._failure(error, deadline))
        finally:
            deadline.cancel()
        if deadline.expired:  # the body may have been cut when the time ran out
            return self._answer(f"unknown (timed out after {self.timeout:g} s)")
        if body is None:
            return self._answer(f"unknown (answer larger than {MAX_ANSWER >> 20} MB: not GitHub's)")
        state = _state_of(body)
        return self._answer(state or "unknown (malformed answer from GitHub)")

    def _failure(self, error: Exception, deadline: _Deadline) -> str:
        reason = getattr(error, "reason", error)
        if deadline.expired or isinstance(reason, TimeoutError):
            return f"unknown (timed out after {self.timeout:g} s)"
        if isinstance(error, http.client.HTTPException):  # described by its type: its text is the server's
            what = {http.client.RemoteDisconnected: "the connection closed without an answer",
                    http.client.IncompleteRead: "the answer was cut short"}.get(type(error), "not HTTP")  # fmt: skip
            return f"unknown (broken answer from the server: {what})"
        if isinstance(error, ValueError):  # named without its text, which may hold the token
            return f"unknown (cannot send a request to {self.api}: check EXPORT_SWEEP_GITHUB_API and GITHUB_TOKEN)"
        return f"unknown (offline: {reason})"

    def _http_error(self, error: urllib.error.HTTPError) -> str:
        headers = error.headers or {}
        retry_after, reset = headers.get("Retry-After", ""), headers.get("X-RateLimit-Reset", "")
        if error.code == 429 or (error.code == 403 and (headers.get("X-RateLimit-Remaining") == "0" or retry_after)):
            now = time.time()
            until = _whole_number(reset) or now + (_whole_number(retry_after) or 60)
            self.rate_limited_until = min(until, now + 24 * 3600)  # a nonsense reset must not silence it for years
            return f"unknown (rate limited until {_clock(self.rate_limited_until)})"
        if error.code == 404:
            return "unknown (not found: private, moved or deleted)"
        if 300 <= error.code < 400:  # a redirect urllib gave up on
            return f"unknown (HTTP {error.code}: redirect not followed: a loop, too many hops, or no http(s) location)"
        return f"unknown (HTTP {error.code}{_phrase(error.code)})"

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
        if self.cache_file is None or state not in STATES:
            return
        self._cache[url] = {"state": state, "time": time.time(),
                            "checked_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}  # fmt: skip
        try:
            write_text_atomic(Path(self.cache_file), json.dumps(self._cache, indent=1, sort_keys=True))
        except OSError:
            pass  # a cache that cannot be written (a full disk) costs a request next time, nothing more


def _fresh(cached) -> bool:
    """Whether a cache entry holds a known state checked less than ``CACHE_TTL`` ago (a hand-edited or older cache
    may hold anything)."""
    return (isinstance(cached, dict) and cached.get("state") in STATES and isinstance(cached.get("checked_at"), str)
            and isinstance(cached.get("time"), (int, float)) and time.time() - cached["time"] < CACHE_TTL)  # fmt: skip


def _state_of(body: bytes) -> str | None:
    """The state in the API's answer about an issue or a pull request; None when the answer is not one."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: arrays nested deeper than the parser goes
        return None
    if not isinstance(data, dict) or data.get("state") not in (OPEN, CLOSED):
        return None
    if data["state"] == OPEN:
        return OPEN
    pull = data.get("pull_request")  # an issue link to a pull request: the issues API tells its merge this way
    if "merged" in data or "merged_at" in data or (isinstance(pull, dict) and "merged_at" in pull):
        merged = data.get("merged") or data.get("merged_at") or (isinstance(pull, dict) and pull.get("merged_at"))
        return MERGED if merged else NOT_MERGED
    reason = data.get("state_reason")
    return _ISSUE_CLOSED_AS.get(reason, CLOSED) if isinstance(reason, str) else CLOSED


def _read(response) -> bytes | None:
    """The whole body, in chunks; None when it is larger than ``MAX_ANSWER``."""
    chunks, size = [], 0
    while chunk := response.read(64 << 10):
        size += len(chunk)
        if size > MAX_ANSWER:
            return None
        chunks.append(chunk)
    if response.length:  # http.client ends a body the server cut short without a word
        raise http.client.IncompleteRead(b"".join(chunks), response.length)
    return b"".join(chunks)


def _origin(url: str) -> tuple:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or {"http": 80, "https": 443}.get(parts.scheme)


def _whole_number(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() else None  # isdigit alone takes "²", which int refuses


def _phrase(code: int) -> str:
    """The standard phrase of a status (the server's own could say anything)."""
    try:
        return f" {HTTPStatus(code).phrase}"
    except ValueError:
        return ""


def _clock(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).strftime("%H:%M UTC")


# ── the request's plumbing: a total deadline, and redirects that keep the token home ──


class _Deadline:
    """A whole request's time limit. A socket timeout bounds each read only, so a server sending a byte every few
    seconds would hold a request for minutes: at the deadline, this shuts the request's connections down."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds
        self.expired = False
        self._watched: list[tuple[threading.Timer, socket.socket]] = []

    def watch(self, connection: socket.socket) -> None:
        # a duplicate of the socket: TLS wraps the original, and shutting a duplicate down ends the connection too
        duplicate = connection.dup()
        timer = threading.Timer(max(0.0, self.end - time.monotonic()), self._expire, (duplicate,))
        timer.daemon = True
        timer.start()
        self._watched.append((timer, duplicate))

    def _expire(self, duplicate: socket.socket) -> None:
        self.expired = True
        try:
            duplicate.shutdown(socket.SHUT_RDWR)  # a blocked read returns at once
        except OSError:
            pass  # already closed

    def cancel(self) -> None:
        for timer, duplicate in self._watched:
            timer.cancel()
            duplicate.close()

    def connection(self, connection_class):
        """A connection factory for urllib's ``do_open``: connections whose sockets this deadline watches."""

        def make(host, **kwargs):
            kwargs["timeout"] = max(self.end - time.monotonic(), 0.001)  # connecting, too, within the time left
            made = connection_class(host, **kwargs)
            made.deadline = self
            return made

        return make


class _WatchedConnection(http.client.HTTPConnection):
    deadline: _Deadline

    def connect(self):
        super().connect()
        self.deadline.watch(self.sock)


class _WatchedHTTPSConnection(http.client.HTTPSConnection, _WatchedConnection):
    """HTTPS whose TCP socket is watched before the TLS handshake, so a slow handshake counts too: in this class
    order, ``HTTPSConnection.connect`` reaches ``_WatchedConnection.connect`` for its TCP connection."""


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline):
        super().__init__()
        self.deadline = deadline

    def http_open(self, req):
        return self.do_open(self.deadline.connection(_WatchedConnection), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline):
        super().__init__()
        self.deadline = deadline

    def https_open(self, req):
        return self.do_open(self.deadline.connection(_WatchedHTTPSConnection), req, context=self._context)


class _RedirectHandler(urllib.request.HTTPRedirectHandler):
    """Follows a redirect to an http(s) address; the token goes along only when it stays at the API's own scheme,
    host and port (urllib's own handler copies every header wherever the redirect points)."""

    max_redirections = MAX_REDIRECTS

    def __init__(self, origin: tuple, authorization: str | None):
        super().__init__()
        self.origin, self.authorization = origin, authorization

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if urlsplit(newurl).scheme not in ("http", "https"):
            return None  # not followed: answered as an HTTP error
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and self.authorization and _origin(newurl) == self.origin:
            new.add_unredirected_header("Authorization", self.authorization)
        return new
