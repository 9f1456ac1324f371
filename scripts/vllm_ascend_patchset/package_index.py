"""The package indexes pip is configured with, read as pip reads them: their simple API pages (PEP 691 JSON
or PEP 503 HTML), their credentials, and which of them list a file.

``index_url()`` (``PIP_INDEX_URL``, pip.conf, else PyPI) is read first, then each of
``extra_index_urls()`` (``PIP_EXTRA_INDEX_URL``, pip.conf) for the files it lacks. A message
never shows an index's credentials, and a request sends them only to the scheme, host and
port of the index they belong to, never on through a redirect.
"""

from __future__ import annotations

import base64
import hashlib
import html.parser
import http.client
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from .paths import cache_dir


class PinError(RuntimeError):
    """A pinned input cannot be had or does not verify (pin.py's error; here, where reading an index raises it)."""


def index_url() -> str:
    """``PIP_INDEX_URL``, else the index pip is configured with (pip.conf), else PyPI's."""
    url = os.environ.get("PIP_INDEX_URL") or _pip_setting("install.index-url", "global.index-url")
    if not url:
        from pip._internal.models.index import PyPI  # pip's own default index

        url = PyPI.simple_url
    return url.rstrip("/")


def extra_index_urls() -> list[str]:
    """``PIP_EXTRA_INDEX_URL`` (separated by whitespace; empty counts as unset, as in pip), else the
    extra-index-url of pip's configuration: the indexes pip reads besides ``index_url()``."""
    urls = os.environ.get("PIP_EXTRA_INDEX_URL", "").split()
    urls = urls or (_pip_setting("install.extra-index-url", "global.extra-index-url") or "").split()
    first = index_url()
    extras = [url.rstrip("/") for url in urls]
    return [url for i, url in enumerate(extras) if url != first and url not in extras[:i]]


def _pip_setting(*keys: str) -> str | None:
    """The first of ``keys`` set in pip's configuration (its pip.conf files), else None."""
    try:
        from pip._internal.configuration import Configuration

        config = Configuration(isolated=False)
        config.load()
    except Exception:  # pip's configuration is pip's internals: without it, nothing is configured
        return None
    return next((value for key in keys if (value := _configured(config, key))), None)


def _configured(config, key: str) -> str | None:
    try:
        return config.get_value(key)
    except Exception:  # not set there
        return None


class _Anchors(html.parser.HTMLParser):
    """The links of a PEP 503 simple page: (text, href) of every ``<a>``."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "a":
            self._href, self._text = dict(attrs).get("href"), ""

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self._text += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            self.links.append((self._text.strip(), self._href))
            self._href = None


def _stated_hash(hashes: dict) -> str | None:
    """The hash an index states for a file: its sha256 (hex), else ``algorithm:hex`` of another that
    hashlib always has (PEP 503 allows any, as pip checks any), else None."""
    hashes = {str(k).lower(): str(v).lower() for k, v in hashes.items() if v}
    if "sha256" in hashes:
        return hashes["sha256"]
    other = sorted(set(hashes) & hashlib.algorithms_guaranteed)
    return f"{other[-1]}:{hashes[other[-1]]}" if other else None


def _simple_files(page_url: str, content_type: str, body: bytes) -> dict[str, tuple[str, str | None]]:
    """File name -> (url, stated hash) of a simple-API page: PEP 691 JSON, or the PEP 503 HTML many mirrors serve."""
    if "json" in content_type:
        data = json.loads(body)
        return {f["filename"]: (f["url"], _stated_hash(f.get("hashes") or {})) for f in data["files"]}
    anchors = _Anchors()
    anchors.feed(body.decode("utf-8"))
    files = {}
    for name, href in anchors.links:
        url, _, fragment = urllib.parse.urljoin(page_url, href).partition("#")
        algorithm, _, digest = fragment.partition("=")
        files[name] = (url, _stated_hash({algorithm: digest}))
    return files


class Listing(dict):
    """File name -> (url, hash the index states); ``unread``: the indexes that could not be read (shown)."""

    unread: tuple[str, ...] = ()


_WARNED: set[str] = set()  # indexes already warned of as unreadable (once per process)


def index_links(project: str) -> Listing:
    """File name -> (url, sha256 the index states) from the simple API (PEP 691 JSON, or PEP 503 HTML) of
    ``index_url()``, then of each extra index for the files it lacks. An index without the project (HTTP
    404) lists nothing, as in pip; one that cannot be read is skipped with a warning, unless none can be."""
    indexes = _indexes()
    links, failures = Listing(), []
    for index in indexes:
        try:
            found = _index_links(index, project, indexes)
        except PinError as exc:
            failures.append((_shown(index), exc))
            continue
        for name, link in found.items():
            links.setdefault(name, link)
    advice = (
        "check the network or the index URLs (PIP_INDEX_URL, PIP_EXTRA_INDEX_URL or pip's configuration), "
        f"or work from the cache {cache_dir() / 'downloads'} with PATCHSET_OFFLINE=1"
    )
    if len(failures) == len(indexes):
        raise PinError(f"{'; '.join(str(exc) for _, exc in failures)}; {advice}")
    for shown, exc in failures:
        if shown not in _WARNED:
            _WARNED.add(shown)
            print(f"warning: {exc}; the other indexes are read", file=sys.stderr)
    links.unread = tuple(shown for shown, _ in failures)
    return links


def _index_links(index: str, project: str, indexes: Sequence[str]) -> dict[str, tuple[str, str | None]]:
    url = f"{index}/{project}/"
    accept = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
    shown = f"{_shown(index)}/{project}/"
    try:
        if url.startswith("file:"):
            folder = Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path))
            if folder.is_dir():
                url += "index.html"  # a directory index, as pip reads it
            elif not folder.exists() and folder.parent.is_dir():
                return {}  # the index has no such project: its 404
        req = index_request(url, indexes, Accept=accept)
        shown = req.full_url  # (without credentials: it goes into messages)
        with urllib.request.urlopen(req, timeout=60) as resp:
            return _simple_files(resp.geturl(), resp.headers.get_content_type(), resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:  # the index has no such project: it lists nothing (pip reads it so)
            return {}
        raise PinError(f"cannot read the package index {shown} ({exc})") from exc
    except (OSError, TimeoutError, ValueError, KeyError, TypeError, http.client.HTTPException) as exc:
        raise PinError(f"cannot read the package index {shown} ({exc})") from exc


def _without_credentials(parts: urllib.parse.SplitResult) -> str:
    """The URL of ``parts`` without its ``user:token@``: what a request goes to and a message may show."""
    host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=host))


def _shown(url: str) -> str:
    """``url`` as a message may show it: without credentials, whatever it is (a malformed URL keeps only
    what follows its last '@')."""
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme in ("http", "https", "file"):
            return _without_credentials(parts)
    except ValueError:  # a port that is not a number
        pass
    return url.rsplit("@", 1)[-1]


def shown_index() -> str:
    """``index_url()`` and any extra index, as a message shows them: without credentials."""
    shown = [_shown(url) for url in _indexes()]
    extra = f" (or the extra index{'es' if len(shown) > 2 else ''} {', '.join(shown[1:])})" if shown[1:] else ""
    return shown[0] + extra


def index_request(url: str, indexes: Sequence[str] | None = None, **headers: str) -> urllib.request.Request:
    """A request for ``url``; credentials in it (``https://user:token@host/...``, as pip takes them) go in
    an Authorization header, which urllib does not make of them. A URL without them gets those of the
    index (of ``indexes``, by default pip's) at the same scheme, host and port whose path it shares most
    of. The header never follows a redirect (urllib would pass it on to any host)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https", "file"):
        raise ValueError(f"an index URL must start with http://, https:// or file://, not {_shown(url)!r}")
    if parts.username is None:
        held = [urllib.parse.urlsplit(i) for i in (indexes if indexes is not None else _indexes())]
        origin = _origin(parts)
        same = [i for i in held if i.username is not None and origin is not None and _origin(i) == origin]
        if same:
            index = max(same, key=lambda i: len(os.path.commonprefix([i.path.split("/"), parts.path.split("/")])))
            parts = index._replace(path=parts.path, query=parts.query, fragment="")
    request = urllib.request.Request(_without_credentials(parts), headers=headers)
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username) + ":" + urllib.parse.unquote(parts.password or "")
        request.add_unredirected_header("Authorization", "Basic " + base64.b64encode(user.encode()).decode())
    return request


def _indexes() -> list[str]:
    """Every index pip reads, in its order: ``index_url()``, then the extra ones."""
    return [index_url(), *extra_index_urls()]


def _origin(parts: urllib.parse.SplitResult) -> tuple[str, str | None, int | None] | None:
    """Scheme, host and port (the scheme's own when none is given): where credentials may go (None: nowhere,
    a port that is not a number)."""
    try:
        return parts.scheme, parts.hostname, parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return None


def not_listed(filename: str, links: dict) -> str:
    """Why ``filename`` cannot be had from the indexes ``links`` (``index_links``) came from: which were read
    and do not list it, and which could not be read."""
    unread = getattr(links, "unread", ())
    read = [shown for shown in map(_shown, _indexes()) if shown not in unread]
    also = f" (and {', '.join(unread)} could not be read)" if unread else ""
    return f"{filename}: the package index {', '.join(read)} does not list this file{also}"
