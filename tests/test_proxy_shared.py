"""The proxy run for others (issue "the proxy as a shared service, part 1", items 2-5), against the real
`loopfence proxy` process: an empty key refused at start-up; a key's listing paged from its own index on
Redis; a 128-character run name served for its second run too; and browsers: another host (DNS
rebinding), another origin, a form or a `no-cors` text body, refused before any upstream sees them,
down to a page in a real headless Chromium trying both.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopfence.proxy import Proxy as LibraryProxy
from loopfence.testing import text_reply

from _proxy_support import Proxy, ReplyServer, tag
from _redis_support import RedisServer

CHROMIUM = "/usr/bin/chromium"
BODY = {"model": "m", "messages": [{"role": "user", "content": "spend the upstream"}]}


def _reply(body: dict[str, Any]) -> dict[str, Any]:
    if "slow one" in json.dumps(body):
        threading.Event().wait(1.5)  # a first request still at the upstream
    return text_reply("ok")


@pytest.fixture
def upstream() -> Iterator[ReplyServer]:
    with ReplyServer(_reply) as up:
        yield up


# -- 2. an empty key ---------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["", "   "])
def test_an_empty_key_is_refused_at_start_up_naming_the_flag(key: str, tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "loopfence", "proxy", "--port", "0", "--logs", str(tmp_path),
                        "--key", "real", "--key", key], capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 2 and p.stdout == "", (p.stdout, p.stderr)
    assert "loopfence proxy: error: --key: an empty client key would let in any client" in p.stderr
    with pytest.raises(ValueError, match="--key: an empty client key"):
        LibraryProxy(None, keys=[key])


def test_a_client_with_no_key_stays_out(upstream: ReplyServer, tmp_path: Path) -> None:
    with Proxy("--upstream", upstream.base_url, "--logs", str(tmp_path), "--key", "k1", stderr=tmp_path / "err") as p:
        for headers in ({}, {"Authorization": "Bearer"}, {"Authorization": "Bearer k2"}, {"x-api-key": "k"}):
            r = httpx.post(f"{p.base_url}/chat/completions", json=BODY, headers=headers, timeout=30)
            assert r.status_code == 401, (headers, r.text)
        assert httpx.post(f"{p.base_url}/chat/completions", json=BODY, headers={"Authorization": "Bearer k1"},
                          timeout=30).status_code == 200
    assert len(upstream.requests) == 1


def test_the_logs_a_proxy_writes_are_its_owners_alone(upstream: ReplyServer, tmp_path: Path) -> None:
    logs = tmp_path / "new" / "logs"
    with Proxy("--upstream", upstream.base_url, "--logs", str(logs), stderr=tmp_path / "err") as p:
        assert httpx.post(f"{p.base_url}/chat/completions", json=BODY, timeout=30).status_code == 200
    files = [*logs.glob("*.jsonl"), *(logs / ".proxy").glob("*.jsonl")]
    assert len(files) == 2
    umask = os.umask(0)
    os.umask(umask)
    for made, full in [*((f, 0o666) for f in files), (logs, 0o777), (logs / ".proxy", 0o777)]:
        mode = made.stat().st_mode & 0o777
        assert mode & 0o007 == 0, (made, oct(mode))  # never anyone else's to read
        assert mode == full & ~(umask | 0o007), (made, oct(mode), oct(umask))  # the group bits are the umask's


# -- 3. the listing on Redis, per key and paged ------------------------------------------------------
def test_a_keys_listing_on_redis_reads_its_own_index_a_page_at_a_time(upstream: ReplyServer, tmp_path: Path) -> None:
    with RedisServer(tmp_path / "redis") as redis, \
            Proxy("--upstream", upstream.base_url, "--logs", str(tmp_path / "logs"), "--state", redis.url,
                  "--key", "alice", "--key", "bob", stderr=tmp_path / "err") as p:
        root = p.base_url.removesuffix("/v1")
        alice, bob = {"Authorization": "Bearer alice"}, {"Authorization": "Bearer bob"}
        with httpx.Client(timeout=30) as client:
            made = []
            for i in range(250):
                r = client.post(f"{p.base_url}/chat/completions", headers=alice,
                                json={**BODY, "messages": [{"role": "user", "content": f"task {i}"}]})
                assert r.status_code == 200, r.text
                made.append(r.headers["x-loopfence-run"])
            db = redis.client()
            db.config_resetstat()
            empty = client.get(f"{root}/loopfence/runs", headers=bob).json()
            stats = db.info("commandstats")
            assert empty == {"object": "list", "data": [], "has_more": False, "first_id": None, "last_id": None}
            assert "cmdstat_scan" not in stats and "cmdstat_hmget" not in stats, stats  # nothing of alice's read
            listed, after, pages = [], None, 0
            while True:
                page = client.get(f"{root}/loopfence/runs", headers=alice,
                                  params={"limit": 100, **({"after": after} if after else {})}).json()
                listed += [d["id"] for d in page["data"]]
                pages += 1
                if not page["has_more"]:
                    break
                after = page["last_id"]
            assert listed == made and pages == 3  # every run once, oldest first: 100, 100, 50
            # a run at its first request is not listed yet, and stays in the index: listed once it answers
            slow = threading.Thread(target=lambda: client.post(
                f"{p.base_url}/chat/completions", headers=alice,
                json={**BODY, "messages": [{"role": "user", "content": "slow one"}]}))
            slow.start()
            while not any("slow one" in json.dumps(b) for b in upstream.requests):
                threading.Event().wait(0.02)
            during = client.get(f"{root}/loopfence/runs", headers=alice, params={"after": made[-1]}).json()
            slow.join()
            after = client.get(f"{root}/loopfence/runs", headers=alice, params={"after": made[-1]}).json()
            assert during["data"] == [] and len(after["data"]) == 1, (during, after)
            bad = client.get(f"{root}/loopfence/runs", headers=alice, params={"limit": "0"})
            assert bad.status_code == 400 and "limit=" in bad.text
            gone = client.get(f"{root}/loopfence/runs", headers=bob, params={"after": made[0]})
            assert gone.status_code == 400 and "no run" in gone.text  # another key's run is no cursor of bob's


# -- 4. a 128-character name -------------------------------------------------------------------------
@pytest.mark.parametrize("store", ["embedded", "redis"])
@pytest.mark.parametrize("keyed", [False, True])
def test_a_128_character_name_is_served_for_its_next_run_too(store: str, keyed: bool, upstream: ReplyServer,
                                                             tmp_path: Path) -> None:
    name = "n" * 128
    with RedisServer(tmp_path / "redis") as redis:
        args = ["--upstream", upstream.base_url, "--logs", str(tmp_path / "logs"),
                *(["--state", redis.url] if store == "redis" else []), *(["--key", "k1"] if keyed else [])]
        with Proxy(*args, stderr=tmp_path / "err") as p:
            root = p.base_url.removesuffix("/v1")
            auth = {"Authorization": "Bearer k1"} if keyed else {}
            ids = []
            for turn in range(3):
                r = httpx.post(f"{root}/run/{name}/v1/chat/completions", headers=auth, timeout=30,
                               json={**BODY, "messages": [{"role": "user", "content": f"turn {turn}"}]})
                assert r.status_code == 200, r.text
                rid = r.headers["x-loopfence-run"]
                ids.append(rid)
                assert len(rid) <= 128
                seen = httpx.get(f"{root}/loopfence/runs/{rid}", headers=auth, timeout=30)
                assert seen.status_code == 200 and seen.json()["id"] == rid, seen.text
                ended = httpx.post(f"{root}/loopfence/runs/{name}/reset", headers=auth, timeout=30)
                assert ended.status_code == 200, ended.text
    assert len(set(ids)) == 3 and ids[1].endswith("-2") and ids[2].endswith("-3")
    assert ids[0] == (name if not keyed else f"{tag('k1')}.{name}"[:128])


# -- 5. hosts, origins, content types ----------------------------------------------------------------
@pytest.fixture
def proxy(upstream: ReplyServer, tmp_path: Path) -> Iterator[Proxy]:
    with Proxy("--upstream", upstream.base_url, "--logs", str(tmp_path), stderr=tmp_path / "err") as p:
        yield p


def test_a_host_that_is_not_the_proxys_is_refused(proxy: Proxy, upstream: ReplyServer) -> None:
    root = proxy.base_url.removesuffix("/v1")
    port = root.rsplit(":", 1)[1]
    for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1.nip.io"):
        listing = httpx.get(f"{root}/loopfence/runs", headers={"Host": host}, timeout=30)
        assert listing.status_code == 403 and listing.json()["error"]["code"] == "host_not_allowed", listing.text
        assert "--allow-host" in listing.json()["error"]["message"]
        sent = httpx.post(f"{proxy.base_url}/chat/completions", json=BODY, headers={"Host": host}, timeout=30)
        assert sent.status_code == 403
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "[::1]", "10.0.0.7:80", "localhost.", "127.0.0.1."):
        r = httpx.get(f"{root}/loopfence/runs", headers={"Host": host}, timeout=30)
        assert r.status_code == 200, (host, r.text)
    for method, path in (("HEAD", "/loopfence/runs"), ("GET", "/no/such/route"), ("OPTIONS", "/v1/chat/completions")):
        r = httpx.request(method, f"{root}{path}", headers={"Host": "attacker.example"}, timeout=30)
        assert r.status_code == 403, (method, path, r.status_code)  # before any route, a 404 included
    two = httpx.post(f"{proxy.base_url}/chat/completions", content=json.dumps(BODY), timeout=30,
                     headers=[("Content-Type", "application/json"), ("Origin", "http://127.0.0.1:1"),
                              ("origin", "http://127.0.0.1:2")])
    assert two.status_code == 400 and two.json()["error"]["code"] == "duplicate_header"
    assert upstream.requests == []


@pytest.mark.parametrize("headers", [
    {"Origin": "http://127.0.0.1:9999", "Content-Type": "application/json"},
    {"Origin": "null", "Content-Type": "application/json"},
    {"Sec-Fetch-Site": "cross-site", "Content-Type": "application/json"},
    {"Sec-Fetch-Site": "same-site", "Content-Type": "application/json"},
    {"Content-Type": "text/plain"},
    {"Content-Type": "application/x-www-form-urlencoded"},
    {"Content-Type": "multipart/form-data; boundary=x"},
    {},
], ids=["origin", "null-origin", "cross-site", "same-site", "text-plain", "form", "multipart", "no-type"])
def test_what_a_web_page_can_send_never_reaches_the_upstream(headers: dict[str, str], proxy: Proxy,
                                                             upstream: ReplyServer) -> None:
    r = httpx.post(f"{proxy.base_url}/chat/completions", content=json.dumps(BODY), headers=headers, timeout=30)
    assert r.status_code in (403, 415), r.text
    error = r.json()["error"]
    assert error["code"] in ("cross_origin_refused", "unsupported_media_type")
    assert ("--allow-origin" in error["message"]) == (r.status_code == 403)
    anthropic = httpx.post(f"{proxy.base_url.removesuffix('/v1')}/v1/messages", content=json.dumps(BODY),
                           headers=headers, timeout=30)
    assert anthropic.status_code in (403, 415) and anthropic.json()["type"] == "error"  # in its wire's shape
    assert upstream.requests == []


def test_an_allowed_origin_host_and_a_person_opening_a_url_are_served(upstream: ReplyServer,
                                                                      tmp_path: Path) -> None:
    with Proxy("--upstream", upstream.base_url, "--logs", str(tmp_path), "--allow-origin", "https://app.example",
               "--allow-host", "proxy.internal", stderr=tmp_path / "err") as p:
        named = httpx.get(f"{p.base_url.removesuffix('/v1')}/loopfence/runs", headers={"Host": "proxy.internal"},
                          timeout=30)
        assert named.status_code == 200, named.text
        ok = httpx.post(f"{p.base_url}/chat/completions", json=BODY, timeout=30,
                        headers={"Origin": "https://app.example", "Sec-Fetch-Site": "cross-site"})
        assert ok.status_code == 200, ok.text
        assert ok.headers["access-control-allow-origin"] == "https://app.example"  # the page may read it
        assert "X-Loopfence-Run" in ok.headers["access-control-expose-headers"]
        pre = httpx.options(f"{p.base_url}/chat/completions", timeout=30, headers={
            "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert pre.status_code == 204 and pre.headers["access-control-allow-origin"] == "https://app.example"
        assert "authorization" in pre.headers["access-control-allow-headers"]
        other = httpx.post(f"{p.base_url}/chat/completions", json=BODY, timeout=30,
                           headers={"Origin": "https://evil.example"})
        assert other.status_code == 403 and "access-control-allow-origin" not in other.headers
        refused = httpx.options(f"{p.base_url}/chat/completions", timeout=30, headers={
            "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
        assert refused.status_code == 403 and "access-control-allow-origin" not in refused.headers
        typed = httpx.get(f"{p.base_url.removesuffix('/v1')}/loopfence/runs", headers={"Sec-Fetch-Site": "none"},
                          timeout=30)
        assert typed.status_code == 200  # the user's own browser, a URL typed in
        reset = httpx.post(f"{p.base_url.removesuffix('/v1')}/loopfence/runs/nothere/reset", timeout=30)
        assert reset.status_code == 404  # a POST with no body needs no content type
    assert len(upstream.requests) == 1


# -- 5, in a browser ---------------------------------------------------------------------------------
ATTACK = """<!doctype html><html><body>
<iframe name="sink"></iframe>
<form id="f" method="POST" action="{proxy}/chat/completions" enctype="text/plain" target="sink">
<input name='{{"model":"m","messages":[{{"role":"user","content":"form"}}],"x":"' value='"}}'>
</form>
<script>
const body = JSON.stringify({{model: "m", messages: [{{role: "user", content: "fetch"}}]}});
window.done = Promise.allSettled([
  fetch("{proxy}/chat/completions", {{method: "POST", mode: "no-cors", headers: {{"Content-Type": "text/plain"}}, body}}),
  fetch("{proxy}/chat/completions", {{method: "POST", mode: "no-cors", body: new Blob([body])}}),
  fetch("{proxy}/chat/completions", {{method: "POST", headers: {{"Content-Type": "application/json"}}, body}}),
  fetch("{root}/loopfence/runs", {{mode: "no-cors"}}),
]).then(r => r.map(x => x.status));
document.getElementById("f").submit();
</script></body></html>"""


def _serve(page: str) -> tuple[http.server.ThreadingHTTPServer, str]:
    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            data = page.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def test_a_page_of_another_origin_in_chromium_cannot_reach_the_upstream(proxy: Proxy, upstream: ReplyServer) -> None:
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} missing: `make chromium` installs Debian's chromium")
        pytest.skip(f"{CHROMIUM} missing (`make chromium` installs it)")
    sync_api = pytest.importorskip("playwright.sync_api")
    root = proxy.base_url.removesuffix("/v1")
    server, url = _serve(ATTACK.format(proxy=proxy.base_url, root=root))
    sent: list[str] = []
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
            try:
                page = browser.new_page()
                page.on("request", lambda r: sent.append(f"{r.method} {r.url}"))
                page.goto(url)
                page.evaluate("window.done")
                page.wait_for_timeout(1000)  # the form's navigation in its frame
            finally:
                browser.close()
    finally:
        server.shutdown()
    tried = [s for s in sent if s.startswith("POST") and s.endswith("/chat/completions")]
    assert len(tried) >= 3, sent  # the browser did send them: the proxy refused them
    assert upstream.requests == [], upstream.requests
    assert httpx.get(f"{root}/loopfence/runs", timeout=30).json()["data"] == []  # and no run began
