"""Store URLs: which Redis deployment a controller talks to, parsed and validated before any connection.

Accepted forms (credentials percent-encoded; `[...]` optional):

    redis://[[user]:password@]host[:port][/db]                 one server (port 6379, db 0 by default)
    rediss://...                                               the same over TLS
    unix://[[user]:password@]/path/to/redis.sock[?db=N]        one server on a unix socket
    redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service_name[/db]
                                                               the master of `service_name` as announced by
                                                               the sentinels (port 26379 by default); follows
                                                               failovers
    rediss+sentinel://...                                      the same over TLS (sentinels and servers)
    redis+cluster://[[user]:password@]host[:port][,host[:port]...]
                                                               a Redis Cluster from these startup nodes
                                                               (db 0 only)
    rediss+cluster://...                                       the same over TLS

The user and password in the URL authenticate with the data servers. Query parameters (all optional):
`db` (instead of the path's db), `ssl_ca_certs`, `ssl_certfile`, `ssl_keyfile` (file paths),
`ssl_cert_reqs` (none | optional | required), `ssl_check_hostname` (true | false) — TLS forms only — and
`sentinel_username`, `sentinel_password` (sentinel forms only: the sentinels' own credentials when they
differ from the servers'). Anything else is refused with an error that names it.

Pure: no I/O, no redis import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qsl, unquote, urlsplit

Topology = Literal["single", "sentinel", "cluster"]

DEFAULT_PORT = 6379
DEFAULT_SENTINEL_PORT = 26379
_SCHEMES: dict[str, tuple[Topology, bool]] = {
    "redis": ("single", False),
    "rediss": ("single", True),
    "unix": ("single", False),
    "redis+sentinel": ("sentinel", False),
    "rediss+sentinel": ("sentinel", True),
    "redis+cluster": ("cluster", False),
    "rediss+cluster": ("cluster", True),
}
_TLS_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "ssl_check_hostname")
_SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password")
_CERT_REQS = ("none", "optional", "required")
_BOOLEANS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


@dataclass(frozen=True, slots=True)
class StoreAddress:
    """Where the store's Redis is, as parsed from a URL (see the module docstring for the forms).

    Attributes:
        topology: "single" (one server), "sentinel" (a master found through sentinels) or "cluster".
        nodes: (host, port) of the server, of every sentinel or of every cluster startup node; empty for a
            unix socket.
        unix_socket_path: the socket of a unix:// URL, else "".
        service_name: the sentinel service ("" unless topology is "sentinel").
        db: the database number (always 0 on a cluster).
        username, password: credentials for the data servers ("" when none).
        tls: whether connections use TLS.
        tls_options: redis-py SSL keyword arguments from the query (ssl_ca_certs, ...), as (name, value).
        sentinel_username, sentinel_password: the sentinels' credentials ("": the sentinels need none).
    """

    topology: Topology
    nodes: tuple[tuple[str, int], ...]
    unix_socket_path: str = ""
    service_name: str = ""
    db: int = 0
    username: str = ""
    password: str = ""
    tls: bool = False
    tls_options: tuple[tuple[str, str | bool], ...] = ()
    sentinel_username: str = ""
    sentinel_password: str = ""

    def redacted(self) -> str:
        """A description for logs, without the passwords."""
        where = self.unix_socket_path or ",".join(f"{host}:{port}" for host, port in self.nodes)
        tls = " tls" if self.tls else ""
        service = f" service {self.service_name}" if self.service_name else ""
        return f"{self.topology}{tls} {where}{service} db {self.db}"


def parse_store_url(url: str) -> StoreAddress:
    """The address in a store URL.

    Raises:
        ValueError: naming what is wrong: an unknown scheme, a missing or malformed host or port, a
            missing sentinel service name, a db that is not a non-negative int (or not 0 on a cluster),
            an unknown, repeated or misplaced query parameter.
    """
    if not isinstance(url, str) or not url:
        raise ValueError("the Redis URL is empty")
    scheme, sep, _ = url.partition("://")
    if not sep or scheme.lower() not in _SCHEMES:
        raise ValueError(f"Redis URL {_shown(url)!r}: the scheme must be one of {', '.join(_SCHEMES)}://")
    scheme = scheme.lower()
    topology, tls = _SCHEMES[scheme]
    parts = urlsplit(url)
    if parts.fragment:
        raise ValueError(f"Redis URL {_shown(url)!r}: a fragment (#...) is not allowed")
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    username, password = _credentials(userinfo)
    options = _query(url, parts.query)
    db_option = options.pop("db", None)

    unix_socket_path = ""
    service_name = ""
    db = 0
    path = parts.path
    if scheme == "unix":
        if hostlist:
            raise ValueError(f"Redis URL {_shown(url)!r}: unix:// takes no host, write unix:///path/to/redis.sock")
        if not path.startswith("/") or path == "/":
            raise ValueError(f"Redis URL {_shown(url)!r}: unix:// needs an absolute socket path")
        unix_socket_path = unquote(path)
        nodes: tuple[tuple[str, int], ...] = ()
    else:
        default_port = DEFAULT_SENTINEL_PORT if topology == "sentinel" else DEFAULT_PORT
        nodes = _nodes(url, hostlist, default_port=default_port, allow_many=topology != "single")
        segments = [unquote(s) for s in path.strip("/").split("/")] if path.strip("/") else []
        if topology == "sentinel":
            if not segments or not segments[0]:
                raise ValueError(f"Redis URL {_shown(url)!r}: a sentinel URL needs the service name, "
                                 "redis+sentinel://host:port/<service_name>[/db]")
            service_name = segments.pop(0)
        if len(segments) > 1:
            raise ValueError(f"Redis URL {_shown(url)!r}: unexpected path {path!r}")
        if segments:
            db = _db(url, segments[0])
    if db_option is not None:
        db = _db(url, db_option)
    if topology == "cluster" and db != 0:
        raise ValueError(f"Redis URL {_shown(url)!r}: a Redis Cluster has only db 0, got {db}")

    tls_options = tuple((name, _tls_value(url, name, options.pop(name))) for name in _TLS_OPTIONS
                        if name in options)
    if tls_options and not tls:
        raise ValueError(f"Redis URL {_shown(url)!r}: {tls_options[0][0]} needs a TLS scheme (rediss...)")
    sentinel_credentials = {name: options.pop(name) for name in _SENTINEL_OPTIONS if name in options}
    if sentinel_credentials and topology != "sentinel":
        raise ValueError(f"Redis URL {_shown(url)!r}: {next(iter(sentinel_credentials))} is for sentinel URLs only")
    if options:
        raise ValueError(f"Redis URL {_shown(url)!r}: unknown query parameter {next(iter(options))!r} "
                         f"(known: db, {', '.join(_TLS_OPTIONS + _SENTINEL_OPTIONS)})")
    return StoreAddress(
        topology=topology, nodes=nodes, unix_socket_path=unix_socket_path, service_name=service_name, db=db,
        username=username, password=password, tls=tls, tls_options=tls_options,
        sentinel_username=sentinel_credentials.get("sentinel_username", ""),
        sentinel_password=sentinel_credentials.get("sentinel_password", ""),
    )


def _shown(url: str) -> str:
    """The URL with any password replaced by "***", for error messages."""
    scheme, sep, rest = url.partition("://")
    netloc, slash, tail = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        userinfo = userinfo.split(":", 1)[0] + ":***"
    return f"{scheme}{sep}{userinfo}{at}{hosts}{slash}{tail}"


def _credentials(userinfo: str) -> tuple[str, str]:
    if not userinfo:
        return "", ""
    user, _, password = userinfo.partition(":")
    return unquote(user), unquote(password)


def _query(url: str, query: str) -> dict[str, str]:
    options: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name in options:
            raise ValueError(f"Redis URL {_shown(url)!r}: query parameter {name!r} given twice")
        options[name] = value
    return options


def _nodes(url: str, hostlist: str, *, default_port: int, allow_many: bool) -> tuple[tuple[str, int], ...]:
    if not hostlist:
        raise ValueError(f"Redis URL {_shown(url)!r}: no host")
    entries = hostlist.split(",")
    if len(entries) > 1 and not allow_many:
        raise ValueError(f"Redis URL {_shown(url)!r}: one host only (use redis+sentinel:// or redis+cluster:// "
                         "for several)")
    nodes = []
    for entry in entries:
        if entry.startswith("["):
            host, bracket, rest = entry[1:].partition("]")
            if not bracket or (rest and not rest.startswith(":")):
                raise ValueError(f"Redis URL {_shown(url)!r}: malformed IPv6 host {entry!r}")
            port_text = rest[1:]
        else:
            host, _, port_text = entry.partition(":")
        if not host:
            raise ValueError(f"Redis URL {_shown(url)!r}: empty host in {hostlist!r}")
        port = default_port
        if port_text:
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                raise ValueError(f"Redis URL {_shown(url)!r}: port must be in 1..65535, got {port_text!r}")
            port = int(port_text)
        nodes.append((unquote(host), port))
    return tuple(nodes)


def _db(url: str, text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"Redis URL {_shown(url)!r}: db must be a non-negative integer, got {text!r}")
    return int(text)


def _tls_value(url: str, name: str, value: str) -> str | bool:
    if name == "ssl_cert_reqs":
        if value.lower() not in _CERT_REQS:
            raise ValueError(f"Redis URL {_shown(url)!r}: ssl_cert_reqs must be one of {', '.join(_CERT_REQS)}, "
                             f"got {value!r}")
        return value.lower()
    if name == "ssl_check_hostname":
        if value.lower() not in _BOOLEANS:
            raise ValueError(f"Redis URL {_shown(url)!r}: ssl_check_hostname must be true or false, got {value!r}")
        return _BOOLEANS[value.lower()]
    if not value:
        raise ValueError(f"Redis URL {_shown(url)!r}: {name} needs a file path")
    return value
