"""Faults injected into the GitHub client, against real HTTP(S) servers on loopback: a server that answers one byte
at a time, redirects that lead the token elsewhere, plain http, issues closed without a fix, and answers that are
errors, broken or of the wrong shape. Every answer is a readable state; nothing raises, nothing hangs.
"""

import json
import shutil
import ssl
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from registry import Registry
from registry.github import GitHubClient
from registry.stale import check_entries

ISSUE = "https://github.com/o/r/issues/1"
ISSUE_PATH = "/repos/o/r/issues/1"


# ── real servers on loopback ──


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        self.server.seen.append({"host": self.headers.get("Host", ""), "path": self.path,
                                 "authorization": self.headers.get("Authorization")})  # fmt: skip
        route = self.server.routes.get(self.path) or answer(404, {"message": "Not Found"})
        try:
            route(self)
        except OSError:
            pass  # the client went away (the point of the slow routes)

    def log_message(self, *args):
        pass


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None):
        super().__init__((host, 0), Handler)
        self.tls, self.routes, self.seen = tls, {}, []
        self.url = f"{'https' if tls else 'http'}://{host}:{self.server_address[1]}"

    def finish_request(self, request, client_address):
        if self.tls:  # the handshake happens in the request's thread, not in the accepting one
            try:
                request = self.tls.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError):
                return
        super().finish_request(request, client_address)

    def authorizations(self, host_prefix: str = "") -> list:
        return [seen["authorization"] for seen in self.seen if seen["host"].startswith(host_prefix)]


def answer(status: int, body=None, headers: dict | None = None, raw: bytes | None = None):
    def route(handler):
        payload = raw if raw is not None else json.dumps(body).encode()
        handler.send_response(status)
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

    return route


def redirect(location: str | None, code: int = 302):
    return answer(code, {}, {"Location": location} if location is not None else {})


def one_byte_per_second(data: bytes, headers_first: bool):
    """Headers at once then the body a byte a second, or the whole answer (status line too) a byte a second."""

    def route(handler):
        if headers_first:
            handler.send_response(200)
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            whole = data
        else:
            whole = b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(data) + data
        for byte in whole:
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()
            time.sleep(1)

    return route


def silent(handler):
    time.sleep(30)


def raw_reply(data: bytes):
    def route(handler):
        handler.wfile.write(data)
        handler.close_connection = True

    return route


def _start(server: Server) -> Server:
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def servers(monkeypatch):
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    started = []

    def start(host: str = "127.0.0.1", tls: ssl.SSLContext | None = None) -> Server:
        started.append(_start(Server(host, tls)))
        return started[-1]

    yield start
    for server in started:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def certificate(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1 and localhost."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a certificate for the HTTPS server")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True, timeout=60)  # fmt: skip
    return cert, key


@pytest.fixture
def tls(certificate, monkeypatch) -> ssl.SSLContext:
    """A server context for the certificate, which the client trusts (through SSL_CERT_FILE) for this test."""
    cert, key = certificate
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


def _readable(state: str) -> bool:
    return state.startswith("unknown (") and state.endswith(")") and state.isprintable()


# ── a total deadline per request ──


@pytest.mark.parametrize("use_tls", [False, True], ids=["http", "https"])
@pytest.mark.parametrize(
    "route",
    [
        one_byte_per_second(json.dumps({"state": "open"}).ljust(30).encode(), headers_first=True),
        one_byte_per_second(json.dumps({"state": "open"}).encode(), headers_first=False),
        silent,
    ],
    ids=["slow-body", "slow-status-line", "silent"],
)
def test_a_slow_server_is_given_up_on_after_the_total_timeout(servers, request, route, use_tls):
    server = servers(tls=request.getfixturevalue("tls") if use_tls else None)
    server.routes[ISSUE_PATH] = route
    started = time.monotonic()
    state = GitHubClient(api=server.url, token="", timeout=2).state(ISSUE)["state"]
    elapsed = time.monotonic() - started
    assert state == "unknown (timed out after 2 s)"
    assert elapsed < 3.5, f"took {elapsed:.1f} s"


# ── the token goes only to the API's own origin, and only over https ──


@pytest.mark.parametrize("other", ["http-other-port", "https-other-port", "https-other-host-same-port"])
def test_the_token_never_follows_a_redirect_to_another_origin(servers, tls, other):
    api = servers(tls=tls)
    if other == "https-other-host-same-port":
        target, elsewhere = api, "localhost"  # the same server, reached by another host name
        location = f"https://localhost:{api.server_address[1]}/moved"
    else:
        target, elsewhere = servers(tls=tls if other.startswith("https") else None), ""
        location = f"{target.url}/moved"
    api.routes[ISSUE_PATH] = redirect(location)
    target.routes["/moved"] = answer(200, {"state": "open"})
    state = GitHubClient(api=api.url, token="secret", timeout=5).state(ISSUE)["state"]
    assert state == "open"
    assert [seen["authorization"] for seen in api.seen if seen["path"] == ISSUE_PATH] == ["Bearer secret"]
    moved = [seen for seen in target.seen if seen["path"] == "/moved" and seen["host"].startswith(elsewhere)]
    assert moved and all(seen["authorization"] is None for seen in moved), moved


def test_the_token_follows_a_redirect_within_the_api(servers, tls):
    api = servers(tls=tls)
    api.routes[ISSUE_PATH] = redirect("/repositories/9/issues/1", code=301)  # a transferred issue
    api.routes["/repositories/9/issues/1"] = answer(200, {"state": "open"})
    assert GitHubClient(api=api.url, token="secret", timeout=5).state(ISSUE)["state"] == "open"
    assert api.authorizations() == ["Bearer secret", "Bearer secret"]


def test_the_token_is_sent_over_https(servers, tls):
    api = servers(tls=tls)
    api.routes[ISSUE_PATH] = answer(200, {"state": "open"})
    assert GitHubClient(api=api.url, token="secret").state(ISSUE)["state"] == "open"
    assert api.authorizations() == ["Bearer secret"]


def test_the_token_is_never_sent_over_plain_http(servers):
    api = servers()
    api.routes[ISSUE_PATH] = answer(200, {"state": "open"})
    assert GitHubClient(api=api.url, token="secret").state(ISSUE)["state"] == "open"
    assert api.authorizations() == [None]


# ── closed without a fix is not a fix ──

CLOSED = {
    "issues/10": ({"state": "closed", "state_reason": "not_planned"}, "closed (not planned)"),
    "issues/11": ({"state": "closed", "state_reason": "duplicate"}, "closed (duplicate)"),
    "issues/12": ({"state": "closed", "pull_request": {"merged_at": None}}, "closed (not merged)"),  # a PR, as an issue
    "pulls/13": ({"state": "closed", "merged": False, "merged_at": None}, "closed (not merged)"),
    "issues/14": ({"state": "closed", "state_reason": "completed"}, "closed"),
    "issues/15": ({"state": "closed", "state_reason": None}, "closed"),
    "issues/16": ({"state": "closed", "pull_request": {"merged_at": "2026-01-01T00:00:00Z"}}, "merged"),
    "issues/17": ({"state": "open", "state_reason": "reopened"}, "open"),
}


@pytest.fixture
def closed_server(servers):
    server = servers()
    for path, (body, _) in CLOSED.items():
        server.routes[f"/repos/o/r/{path}"] = answer(200, body)
    return server


def _link(path: str) -> str:
    kind, number = path.split("/")
    return f"https://github.com/o/r/{'pull' if kind == 'pulls' else 'issues'}/{number}"


@pytest.mark.parametrize("path", list(CLOSED))
def test_how_an_issue_or_pull_request_was_closed_is_part_of_its_state(closed_server, path):
    assert GitHubClient(api=closed_server.url, token="").state(_link(path))["state"] == CLOSED[path][1]


@pytest.mark.parametrize(
    "path, verdict, stale",
    [
        ("issues/10", "upstream closed without a fix (not planned)", False),
        ("issues/11", "upstream closed without a fix (duplicate)", False),
        ("issues/12", "upstream closed without a fix (not merged)", False),
        ("pulls/13", "upstream closed without a fix (not merged)", False),
        ("issues/14", "upstream closed", True),
        ("issues/16", "upstream merged", True),
        ("issues/17", "still needed", False),
    ],
)
def test_an_upstream_closed_without_a_fix_does_not_make_an_entry_stale(closed_server, tmp_path, path, verdict, stale):
    registry_file = tmp_path / "known_issues.toml"
    entry = f'[[EXPORT_SKIPS]]\nmodel = "BertModel"\nscope = "onnx"\nreason = "r"\nurl = "{_link(path)}"\n'
    registry_file.write_text(entry)
    registry = Registry.load(registry_file)
    github = GitHubClient(api=closed_server.url, token="")
    (finding,) = check_entries(registry, registry.entries, {"BertModel"}, {}, github)
    assert (finding.verdict, finding.stale) == (verdict, stale)


# ── errors, broken answers and answers of the wrong shape: unknown, with a reason ──


@pytest.mark.parametrize(
    "routes, reason",
    [
        ({ISSUE_PATH: answer(403, {"message": "Forbidden"})}, "HTTP 403"),
        ({ISSUE_PATH: answer(403, {}, {"Retry-After": "60"})}, "rate limited until"),
        ({ISSUE_PATH: answer(404, {"message": "Not Found"})}, "not found"),
        ({ISSUE_PATH: answer(429, {})}, "rate limited until"),
        ({ISSUE_PATH: answer(429, {}, {"X-RateLimit-Reset": "9" * 30})}, "rate limited until"),
        ({ISSUE_PATH: answer(403, {}, {"Retry-After": "\u00b2"})}, "rate limited until"),
        ({ISSUE_PATH: answer(500, {})}, "HTTP 500"),
        ({ISSUE_PATH: answer(502, raw=b"<html>bad gateway</html>")}, "HTTP 502"),
        ({ISSUE_PATH: answer(200, raw=b"{not json")}, "malformed answer"),
        ({ISSUE_PATH: answer(200, raw=b'{"state": "op\xffen"}')}, "malformed answer"),
        ({ISSUE_PATH: answer(200, [])}, "malformed answer"),
        ({ISSUE_PATH: answer(200, "open")}, "malformed answer"),
        ({ISSUE_PATH: answer(200, None)}, "malformed answer"),
        ({ISSUE_PATH: answer(200, {"state": 5})}, "malformed answer"),
        ({ISSUE_PATH: answer(200, {"state": "\x1b[2Jpwned"})}, "malformed answer"),
        ({ISSUE_PATH: answer(200, raw=b"[" * 200_000)}, "malformed answer"),
        ({ISSUE_PATH: answer(200, raw=b" " * (3 << 20) + b'{"state": "open"}')}, "larger than"),
        ({ISSUE_PATH: redirect(ISSUE_PATH)}, "redirect"),
        ({ISSUE_PATH: redirect("/b"), "/b": redirect(ISSUE_PATH)}, "redirect"),
        ({ISSUE_PATH: redirect("/hop/0"), **{f"/hop/{n}": redirect(f"/hop/{n + 1}") for n in range(30)}}, "redirect"),
        ({ISSUE_PATH: redirect(None)}, "redirect"),
        ({ISSUE_PATH: redirect("file:///etc/passwd")}, "redirect"),
        ({ISSUE_PATH: raw_reply(b"NOT HTTP AT ALL\r\n\r\n")}, "broken answer from the server: not HTTP"),
        ({ISSUE_PATH: raw_reply(b"HTTP/1.0 200 OK\r\nContent-Length: 100\r\n\r\n{\"state\"")}, "cut short"),
        ({ISSUE_PATH: raw_reply(b"")}, "closed without an answer"),
    ],
    ids=["403", "403-secondary-limit", "404", "429", "429-absurd-reset", "403-retry-after-not-a-number", "500",
         "502-html", "invalid-json", "invalid-utf8", "list", "string", "null", "state-not-a-string",
         "state-not-a-state", "deeply-nested", "too-large", "redirect-self", "redirect-ping-pong", "redirect-chain",
         "redirect-without-location", "redirect-to-file", "garbage-status", "cut-body", "empty-reply"],  # fmt: skip
)
def test_a_bad_answer_is_unknown_with_a_readable_reason(servers, routes, reason):
    server = servers()
    server.routes.update(routes)
    state = GitHubClient(api=server.url, token="", timeout=5).state(ISSUE)["state"]
    assert _readable(state) and reason in state, state


def test_a_malformed_cache_entry_is_ignored(servers, tmp_path):
    server = servers()
    server.routes[ISSUE_PATH] = answer(200, {"state": "open"})
    cache = tmp_path / "github.json"
    cache.write_text(json.dumps({ISSUE: "closed", "https://github.com/o/r/issues/2": {"state": 5, "time": "now"}}))
    client = GitHubClient(api=server.url, token="", cache_file=cache)
    assert client.state(ISSUE)["state"] == "open"
    assert client.state("https://github.com/o/r/issues/2")["state"].startswith("unknown (not found")


CACHE_SNIPPET = """
import json, resource, signal, sys
from registry.github import GitHubClient
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
print(json.dumps(GitHubClient(api={api!r}, token="", cache_file={cache!r}).state({issue!r})))
"""


def test_a_cache_that_cannot_be_written_leaves_the_old_one_and_the_answer_stands(servers, tmp_path):
    server = servers()
    server.routes[ISSUE_PATH] = answer(200, {"state": "closed"})
    folder = tmp_path / "cache"
    folder.mkdir()
    cache = folder / "github.json"
    previous = {f"https://github.com/o/r/issues/{n}": {"state": "open", "time": time.time(), "checked_at": "then"}
                for n in range(100, 109)}  # fmt: skip
    cache.write_text(json.dumps(previous))
    before = cache.read_bytes()
    assert len(before) < 1024, "the cache fits under the limit, the cache with one more answer does not"
    snippet = CACHE_SNIPPET.format(api=server.url, cache=str(cache), issue=ISSUE)
    result = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=60,
                            cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["state"] == "closed"
    assert cache.read_bytes() == before
    assert sorted(path.name for path in folder.iterdir()) == ["github.json"], "no temporary file left behind"
