"""Who may call the proxy: the client keys, the host a request names, browsers, and the body's type.

A proxy holds an upstream key, so a request it serves spends someone's money. Before any route:

- **Host.** A request naming a host that is not the proxy's is refused (403): DNS rebinding points a
  name the attacker owns at 127.0.0.1, and a page of theirs then reads the proxy as its own origin.
  Allowed: IP literals, `localhost` (and `*.localhost`), the name the proxy listens on, and the names
  given with `--allow-host` (`*`: any).
- **Browsers.** A request a browser sends for a page of another origin says so (`Origin`, or
  `Sec-Fetch-Site: cross-site`/`same-site`); it is refused (403) unless its origin is allowed
  (`--allow-origin`; an allowed origin gets CORS: its preflight answered, its responses readable).
  Agents and SDKs send neither; a person opening a URL sends `Sec-Fetch-Site: none`.
- **JSON only.** A POST with a body must be `Content-Type: application/json` (415): a form, or a
  `no-cors` fetch of `text/plain`, is what a page can send without asking the server first (a POST
  with no body, `.../reset`, carries nothing to type).
- **Keys** (`owner`): with client keys, every route wants one of them (401), and a run belongs to the
  key that opened it; an empty key is refused when the proxy is made (it would let any client in).

The refusals are JSON in the shape of the wire the path belongs to (`shape`), and name the flag that
would allow the request; they never echo a run, a name or a prompt.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

__all__ = ["Access", "Refused", "NO_KEY"]

NO_KEY = "a client key is required: Authorization: Bearer <key> (or x-api-key: <key>)"
FOREIGN_SITES = ("cross-site", "same-site")  # Sec-Fetch-Site of a request made for another origin's page
SINGLE = frozenset({"host", "origin", "content-type", "sec-fetch-site"})  # a request with two of one is refused


class Refused(Exception):
    """A request the proxy will not serve: its status, words and error code."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


class Access:
    """The checks above for one proxy. `keys`: client keys (none: any client); `hosts`: the names a
    request may give in `Host` besides IP literals and localhost (None: any); `origins`: the browser
    origins allowed (`scheme://host[:port]`, or `*`)."""

    def __init__(self, keys: Iterable[str] = (), hosts: Iterable[str] | None = (),
                 origins: Iterable[str] = ()) -> None:
        keys = list(keys)
        if any(not k.strip() for k in keys):
            raise ValueError("--key: an empty client key would let in any client that sends no key; give a "
                             "key of at least one character (or no --key: any client)")
        self.keys = [k.strip().encode() for k in keys]
        self.hosts = None if hosts is None else {_hostname(h) for h in hosts}  # "name:port" is "name"
        self.origins = {o.rstrip("/").lower() for o in origins}

    # -- every request ------------------------------------------------------------------------------
    def check(self, method: str, headers: Any) -> None:
        """Refused unless the request's Host, origin and (for a POST) content type are allowed."""
        host = _hostname(headers.get("host", ""))
        if host and self.hosts is not None and "*" not in self.hosts and not _local(host) \
                and not self._named(host):
            raise Refused(403, f"this proxy does not serve the host {host[:100]!r} (the Host header); start it with "
                          f"--allow-host {host[:100]} if clients reach it by that name", "host_not_allowed")
        origin = headers.get("origin")
        site = headers.get("sec-fetch-site", "")
        if (origin is not None or site in FOREIGN_SITES) and not self._allowed(origin):
            who = f"the origin {origin[:100]!r}" if origin is not None else f"a {site} page"
            raise Refused(403, f"a browser request for {who} is refused: a web page may not spend this proxy's "
                          "upstream; start it with --allow-origin ORIGIN to allow one", "cross_origin_refused")
        body = headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
        if method == "POST" and body and not _json(headers.get("content-type")):
            given = headers.get("content-type")
            raise Refused(415, f"the proxy takes Content-Type: application/json (got "
                          f"{given[:60]!r})" if given else "the proxy takes Content-Type: application/json (none "
                          "was sent; curl: -H 'Content-Type: application/json')", "unsupported_media_type")

    def _named(self, host: str) -> bool:
        """`host` is an --allow-host name, or under one given as `.suffix` (`.svc.cluster.local`)."""
        return host in self.hosts or any(h.startswith(".") and host.endswith(h) for h in self.hosts or ())

    def _allowed(self, origin: str | None) -> bool:
        return origin is not None and ("*" in self.origins or origin.rstrip("/").lower() in self.origins)

    def owner(self, request: Request) -> str | None:
        """The client's key digest (who owns a run), or None without keys; Refused (401) without one."""
        if not self.keys:
            return None
        given = request.headers.get("authorization", "")
        token = (given[7:] if given[:7].lower() == "bearer " else  # Anthropic's clients: x-api-key; Google's:
                 request.headers.get("x-api-key") or request.headers.get("x-goog-api-key")  # x-goog-api-key, ?key=
                 or request.query_params.get("key") or "").strip().encode()
        if not token or not any(hmac.compare_digest(token, k) for k in self.keys):
            raise Refused(401, NO_KEY, "invalid_api_key")
        return hashlib.sha256(token).hexdigest()[:16]

    def middleware(self, app: Any, shape: Callable[[str, int, str, str], JSONResponse]) -> Any:
        """`app` behind `check`: a refused request gets `shape(path, status, message, code)`. A request
        of an allowed origin gets CORS: its preflight answered, its response readable by that page."""
        async def guarded(scope: dict[str, Any], receive: Callable[[], Awaitable[Any]],
                          send: Callable[[Any], Awaitable[None]]) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            headers: dict[str, str] = {}
            try:
                for k, v in scope["headers"]:
                    name = k.decode("latin-1").lower()
                    if name in SINGLE and name in headers:  # two Hosts, two Origins: read one way everywhere
                        raise Refused(400, f"the request has more than one {name} header", "duplicate_header")
                    headers[name] = v.decode("latin-1")
                origin = headers.get("origin")
                if scope["method"] == "OPTIONS" and origin is not None and self._allowed(origin):
                    await JSONResponse(None, 204, headers=_cors(origin, preflight=True))(scope, receive, send)
                    return
                self.check(scope["method"], headers)
            except Refused as no:
                await shape(scope["path"], no.status, no.message, no.code)(scope, receive, send)
                return
            if origin is None:
                await app(scope, receive, send)
                return

            async def with_cors(message: Any) -> None:  # an allowed page may read the answer
                if message["type"] == "http.response.start":
                    extra = [(k.lower().encode(), v.encode()) for k, v in _cors(origin, preflight=False).items()]
                    message = {**message, "headers": [*message.get("headers", []), *extra]}
                await send(message)
            await app(scope, receive, with_cors)
        return guarded


def _hostname(host: str) -> str:
    """The name in a Host header, without its port or a final dot ("[::1]:8080" -> "::1", "name.:80" -> "name")."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host[1:]
    return (host.rsplit(":", 1)[0] if host.count(":") == 1 else host).rstrip(".") or host


def _cors(origin: str, *, preflight: bool) -> dict[str, str]:
    """The CORS headers for an allowed origin: what a page of it may send (preflight) and read."""
    out = {"Access-Control-Allow-Origin": origin, "Vary": "Origin",
           "Access-Control-Expose-Headers": "X-Loopfence-Run, X-Loopfence-Stop"}
    if preflight:
        out |= {"Access-Control-Allow-Methods": "GET, POST", "Access-Control-Max-Age": "600",
                "Access-Control-Allow-Headers": "authorization, content-type, x-api-key, x-goog-api-key, "
                "anthropic-version, anthropic-beta, x-loopfence-run, x-session-id, session-id"}
    return out


def _local(host: str) -> bool:
    """An IP literal (DNS rebinding needs a name) or a loopback name."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _json(content_type: str | None) -> bool:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))
