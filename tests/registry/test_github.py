"""The GitHub client against a real HTTP server on loopback serving issue JSON."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from registry.github import GitHubClient

RESET = int(time.time()) + 3600


class FakeGitHub(BaseHTTPRequestHandler):
    seen_authorization = []

    def do_GET(self):  # noqa: N802
        self.seen_authorization.append(self.headers.get("Authorization"))
        routes = {
            "/repos/o/r/issues/1": (200, {}, json.dumps({"state": "open"})),
            "/repos/o/r/issues/2": (200, {}, json.dumps({"state": "closed"})),
            "/repos/o/r/pulls/3": (200, {}, json.dumps({"state": "closed", "merged": True, "merged_at": "2026-01-01"})),
            "/repos/o/r/pulls/4": (200, {}, json.dumps({"state": "closed", "merged": False, "merged_at": None})),
            "/repos/o/r/issues/5": (403, {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(RESET)}, "{}"),
            "/repos/o/r/issues/6": (200, {}, "{not json"),
            "/repos/o/r/issues/7": (200, {}, json.dumps({"title": "no state"})),
        }
        status, headers, body = routes.get(self.path, (404, {}, json.dumps({"message": "Not Found"})))
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeGitHub)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.mark.parametrize(
    "url, state",
    [
        ("https://github.com/o/r/issues/1", "open"),
        ("https://github.com/o/r/issues/2", "closed"),
        ("https://github.com/o/r/pull/3", "merged"),
        ("https://github.com/o/r/pull/4", "closed (not merged)"),
        ("https://github.com/o/r/issues/404", "unknown (not found: private, moved or deleted)"),
        ("https://github.com/o/r/issues/6", "unknown (malformed answer from GitHub)"),
        ("https://github.com/o/r/issues/7", "unknown (malformed answer from GitHub)"),
        ("https://github.com/o/r/discussions/8", "unknown (discussions have no REST state)"),
    ],
)
def test_states(server, url, state):
    assert GitHubClient(api=server, token="").state(url)["state"] == state


def test_rate_limit_is_reported_and_respected(server):
    client = GitHubClient(api=server, token="")
    first = client.state("https://github.com/o/r/issues/5")["state"]
    assert first.startswith("unknown (rate limited until ") and first.endswith("UTC)")
    FakeGitHub.seen_authorization.clear()
    again = client.state("https://github.com/o/r/issues/1")["state"]
    assert again.startswith("unknown (rate limited"), "no request while the limit holds"
    assert FakeGitHub.seen_authorization == []


def test_token_is_not_sent_over_plain_http(server):
    # over https it is: tests/reliability/test_github_faults.py serves the API over TLS
    FakeGitHub.seen_authorization.clear()
    assert GitHubClient(api=server, token="secret").state("https://github.com/o/r/issues/1")["state"] == "open"
    assert FakeGitHub.seen_authorization == [None]


def test_answers_are_cached_with_a_timestamp(server, tmp_path):
    cache = tmp_path / "github.json"
    assert GitHubClient(api=server, token="", cache_file=cache).state("https://github.com/o/r/issues/2")["state"] == "closed"
    stored = json.loads(cache.read_text())["https://github.com/o/r/issues/2"]
    assert stored["state"] == "closed" and stored["checked_at"] and stored["time"] > 0
    unreachable = GitHubClient(api="http://127.0.0.1:9", token="", cache_file=cache)
    answer = unreachable.state("https://github.com/o/r/issues/2")
    assert answer == {**answer, "state": "closed", "cached": True}


def test_offline_says_so(tmp_path):
    assert GitHubClient(offline=True).state("https://github.com/o/r/issues/1")["state"] == "unknown (offline)"
    refused = GitHubClient(api="http://127.0.0.1:9", token="").state("https://github.com/o/r/issues/1")["state"]
    assert refused.startswith("unknown (offline: ")
    (tmp_path / "broken.json").write_text("{oops")
    assert GitHubClient(offline=True, cache_file=tmp_path / "broken.json").state("https://github.com/o/r/issues/1")
