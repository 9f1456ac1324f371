"""The pinned upstream release: which files, their hashes, and a verified local cache.

Every artefact the build reads is named in ``pin.json`` with its sha256. Files are
downloaded from the package indexes that pip is configured with (``PIP_INDEX_URL`` or
pip's default, then each ``PIP_EXTRA_INDEX_URL``) into a cache folder that git ignores,
and refused when the hash differs.
"""

from __future__ import annotations

import base64
import hashlib
import html.parser
import http.client
import json
import os
import shutil
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .atomic import remove_stale, scratch_dir
from .paths import PIN_FILE, cache_dir
from .wheel_target import WheelTarget

DOWNLOAD_SCRATCH = ".download-"


class PinError(RuntimeError):
    """A pinned input cannot be had or does not verify."""


@dataclass(frozen=True)
class Pin:
    project: str
    version: str
    git_tag: str
    git_commit: str
    vllm_version: str
    local_version: str
    wheels: dict[str, str]
    sdist: dict[str, str]

    @classmethod
    def load(cls, path: Path = PIN_FILE) -> Pin:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise PinError(f"{path}: pin file missing; restore it from git") from exc
        except json.JSONDecodeError as exc:
            raise PinError(f"{path}: not valid JSON ({exc}); fix the syntax") from exc
        keys = ("project", "version", "git_tag", "git_commit", "vllm_version", "local_version", "wheels", "sdist")
        missing = [k for k in keys if k not in data]
        if missing:
            raise PinError(f"{path}: missing key(s) {', '.join(missing)}")
        return cls(**{k: data[k] for k in keys})

    @property
    def dist_name(self) -> str:
        return self.project.replace("-", "_")

    def targets(self) -> list[WheelTarget]:
        out = []
        for name in sorted(self.wheels):
            # vllm_ascend-0.23.0-cp311-cp311-manylinux_2_34_x86_64.whl
            parts = name[: -len(".whl")].split("-")
            out.append(WheelTarget(parts[2], parts[4].removeprefix("manylinux_2_34_")))
        return out

    def wheel_name(self, target: WheelTarget) -> str:
        name = f"{self.dist_name}-{self.version}-{target.py}-{target.py}-{target.platform_tag}.whl"
        if name not in self.wheels:
            known = ", ".join(f"PY={t.py} ARCH={t.arch}" for t in self.targets())
            raise PinError(f"no pinned wheel for {target.name}; pinned targets: {known}")
        return name

    def all_files(self) -> dict[str, str]:
        return {**self.wheels, **self.sdist}


def sha256_of(path: Path) -> str:
    return file_digest(path, "sha256")


def file_digest(path: Path, algorithm: str) -> str:
    """A file's hex digest in ``algorithm`` (sha256, or another an index states a file's hash in)."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def index_url() -> str:
    """``PIP_INDEX_URL``, else the index pip is configured with (pip.conf), else PyPI's."""
    url = os.environ.get("PIP_INDEX_URL")
    if not url:
        try:
            from pip._internal.configuration import Configuration

            config = Configuration(isolated=False)
            config.load()
            url = _configured(config, "install.index-url") or _configured(config, "global.index-url")
        except Exception:  # pip's configuration is pip's internals: without it, its default index
            url = None
    if not url:
        from pip._internal.models.index import PyPI  # pip's own default index

        url = PyPI.simple_url
    return url.rstrip("/")


def extra_index_urls() -> list[str]:
    """``PIP_EXTRA_INDEX_URL`` (separated by whitespace), else the extra-index-url of pip's configuration:
    the indexes pip reads after ``index_url()``."""
    urls = os.environ.get("PIP_EXTRA_INDEX_URL")
    if urls is None:
        try:
            from pip._internal.configuration import Configuration

            config = Configuration(isolated=False)
            config.load()
            urls = _configured(config, "install.extra-index-url") or _configured(config, "global.extra-index-url")
        except Exception:  # pip's configuration is pip's internals: without it, no extra index
            urls = None
    first = index_url()
    extras = [url.rstrip("/") for url in (urls or "").split()]
    return [url for i, url in enumerate(extras) if url != first and url not in extras[:i]]


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


def offline() -> bool:
    """``PATCHSET_OFFLINE=1`` (or true, yes, on): use only the cache, never the network; unset, empty, 0,
    false, no or off: the network too. Anything else is an error, not a silent download."""
    value = os.environ.get("PATCHSET_OFFLINE", "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    shown = os.environ["PATCHSET_OFFLINE"][:40]
    raise PinError(f"PATCHSET_OFFLINE={shown!r}: set it to 1 to work from the cache only, or to 0 (or unset it)")


def index_links(project: str) -> dict[str, tuple[str, str | None]]:
    """File name -> (url, sha256 the index states) from the simple API (PEP 691 JSON, or PEP 503 HTML) of
    ``index_url()``, then of each extra index for the files it lacks, as pip reads them. An index that
    cannot be read is skipped with a warning, as pip does, unless none can be."""
    indexes = [index_url(), *extra_index_urls()]
    links: dict[str, tuple[str, str | None]] = {}
    failures: list[PinError] = []
    for index in indexes:
        try:
            found = _index_links(index, project)
        except PinError as exc:
            failures.append(exc)
            continue
        for name, link in found.items():
            links.setdefault(name, link)
    if len(failures) == len(indexes):
        raise failures[0] if len(failures) == 1 else PinError("; ".join(map(str, failures)))
    for exc in failures:
        print(f"warning: {exc}; the other indexes are read", file=sys.stderr)
    return links


def _index_links(index: str, project: str) -> dict[str, tuple[str, str | None]]:
    url = f"{index}/{project}/"
    accept = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
    if url.startswith("file:") and Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path)).is_dir():
        url += "index.html"  # a directory index, as pip reads it
    req = _request(url, Accept=accept)
    url = req.full_url  # (without credentials: it goes into messages)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return _simple_files(resp.geturl(), resp.headers.get_content_type(), resp.read())
    except (OSError, TimeoutError, ValueError, KeyError, TypeError, http.client.HTTPException) as exc:
        raise PinError(
            f"cannot read the package index {url} ({exc}); check the network or PIP_INDEX_URL, "
            f"or work from the cache {cache_dir() / 'downloads'} with PATCHSET_OFFLINE=1"
        ) from exc


def _without_credentials(parts: urllib.parse.SplitResult) -> str:
    """The URL of ``parts`` without its ``user:token@``: what a request goes to and a message may show."""
    host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=host))


def shown_index() -> str:
    """``index_url()`` and any extra index, as a message shows them: without credentials."""
    shown = [_without_credentials(urllib.parse.urlsplit(url)) for url in (index_url(), *extra_index_urls())]
    return shown[0] + (f" (or the extra index {', '.join(shown[1:])})" if shown[1:] else "")


def _request(url: str, **headers: str) -> urllib.request.Request:
    """A request for ``url``; credentials in it (``https://user:token@host/...``, as pip takes them) go in
    an Authorization header, which urllib does not make of them, and the index's go to files on its host."""
    parts = urllib.parse.urlsplit(url)
    for index in map(urllib.parse.urlsplit, (index_url(), *extra_index_urls())):
        if parts.username is None and index.username is not None and index.hostname == parts.hostname:
            parts = index._replace(path=parts.path, query=parts.query, fragment="")
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username) + ":" + urllib.parse.unquote(parts.password or "")
        headers["Authorization"] = "Basic " + base64.b64encode(user.encode()).decode()
        url = _without_credentials(parts)
    return urllib.request.Request(url, headers=headers)


def _download(url: str, dest: Path) -> None:
    with urllib.request.urlopen(_request(url), timeout=300) as resp, open(dest, "wb") as out:
        while block := resp.read(1 << 20):
            out.write(block)


def fetch(filename: str, sha256: str | None, project: str) -> Path:
    """Return the cached, verified file; download it (again, once) when needed.

    ``sha256=None`` trusts the index's own hash (used only by the re-pin check, for a
    release that is not pinned yet). A download lands in the cache only once it verifies,
    so a bad download or a wrong hash in ``pin.json`` never removes a good cached file.
    """
    dest_dir = cache_dir() / "downloads"
    dest = dest_dir / filename
    cached = sha256_of(dest) if dest.is_file() else None
    if cached is not None and (sha256 is None or cached == sha256):
        return dest
    if cached is not None:
        why = f"{dest} has sha256 {cached}, but pin.json pins {sha256}"
        if offline():
            raise PinError(
                f"{why}, and downloads are off (PATCHSET_OFFLINE=1); replace the file with the pinned one, "
                "or correct pin.json if the pin is wrong"
            )
        print(f"warning: {why}; downloading it again", file=sys.stderr)
    elif offline():
        raise PinError(
            f"{filename} is not in the cache {dest_dir} and downloads are off (PATCHSET_OFFLINE=1); "
            f"copy the file there (sha256 {sha256}) or allow network access"
        )
    remove_stale(dest_dir, DOWNLOAD_SCRATCH)
    scratch = scratch_dir(dest_dir, DOWNLOAD_SCRATCH)
    try:
        part = scratch / filename
        try:
            links = index_links(project)
            if filename not in links:
                raise PinError(f"{filename}: the package index {shown_index()} does not list this file")
            url, index_hash = links[filename]
            _download(url, part)
        except (PinError, OSError, TimeoutError) as exc:
            raise PinError(
                f"cannot download {filename} from {shown_index()} ({exc}); with no network, put the file "
                f"(sha256 {sha256}) into {dest_dir}"
            ) from exc
        actual = sha256_of(part)
        if index_hash and ":" in index_hash:  # stated in another algorithm: checked in it, as pip does
            algorithm, _, stated = index_hash.partition(":")
            if (got := file_digest(part, algorithm)) != stated:
                raise PinError(
                    f"{filename}: {algorithm} mismatch: the index states {stated}, the download has {got}; "
                    "the download is corrupt or not the listed file (nothing was written to the cache)"
                )
            index_hash = None
        expected = sha256 or index_hash
        if expected and actual != expected:
            raise PinError(_mismatch(filename, sha256, index_hash, actual, cached))
        os.replace(part, dest)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return dest


def _mismatch(filename: str, pinned: str | None, index_hash: str | None, actual: str, cached: str | None) -> str:
    """Why a download does not verify, and which side is likely wrong."""
    kept = "the cached copy was left as it was" if cached else "nothing was written to the cache"
    witnesses = [w for w, h in (("the index states it", index_hash), ("the cached copy has it", cached)) if h == actual]
    if pinned and witnesses:
        return (
            f"{filename}: sha256 mismatch: pin.json pins {pinned}, the download has {actual} and "
            f"{' and '.join(witnesses)}; pin.json's entry is probably wrong: check it against the index ({kept})"
        )
    return (
        f"{filename}: sha256 mismatch: expected {pinned or index_hash}, got {actual}; the download is corrupt "
        f"or not the expected file ({kept})"
    )


def fetch_wheel(pin: Pin, target: WheelTarget) -> Path:
    name = pin.wheel_name(target)
    return fetch(name, pin.wheels[name], pin.project)
