"""The pin refuses files whose sha256 differs without losing a good cached file, and says what
to do without a network; check-pin works offline from the cache."""

from __future__ import annotations

import base64
import dataclasses
import email.message
import hashlib
import os
import urllib.error

import pytest
from vllm_ascend_patchset import check, package_index
from vllm_ascend_patchset import pin as pinmod
from vllm_ascend_patchset.cli import main
from vllm_ascend_patchset.pin import Pin, PinError
from vllm_ascend_patchset.wheel_target import WheelTarget

GOOD = b"the real wheel bytes"
GOOD_SHA = hashlib.sha256(GOOD).hexdigest()


@pytest.fixture(autouse=True)
def no_pip_configuration(monkeypatch):
    """This machine's pip configuration (an extra index, say) stays out of every test but the ones that set it."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # pip then reads no configuration file at all
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(package_index, "_WARNED", set())


def _only_this_pip_conf(monkeypatch, tmp_path, text: str) -> None:
    """pip reads ``text`` as its configuration, and no global, site or user file besides."""
    from pip._internal import configuration

    config = tmp_path / "pip.conf"
    config.write_text(text)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    nowhere = {kind: [] for kind in (configuration.Kind.GLOBAL, configuration.Kind.SITE, configuration.Kind.USER)}
    monkeypatch.setattr(configuration, "get_configuration_files", lambda: nowhere)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PATCHSET_CACHE", str(tmp_path))
    monkeypatch.delenv("PATCHSET_OFFLINE", raising=False)
    return tmp_path / "downloads"


def _serve(monkeypatch, payload: bytes, index_hash: str | None = None) -> list[str]:
    calls: list[str] = []
    links = {"x.whl": ("https://index.invalid/x.whl", index_hash)}
    monkeypatch.setattr(pinmod, "index_links", lambda project: links)

    def download(url, dest):
        calls.append(url)
        dest.write_bytes(payload)

    monkeypatch.setattr(pinmod, "_download", download)
    return calls


def test_mismatch_names_file_expected_and_actual(cache, monkeypatch):
    bad = b"tampered"
    _serve(monkeypatch, bad)
    with pytest.raises(PinError) as err:
        pinmod.fetch("x.whl", GOOD_SHA, "vllm-ascend")
    msg = str(err.value)
    assert "x.whl" in msg and GOOD_SHA in msg and hashlib.sha256(bad).hexdigest() in msg
    assert not (cache / "x.whl").exists(), "a file that fails verification must not stay in the cache"


def test_bad_cached_file_is_downloaded_again_once_saying_why(cache, monkeypatch, capsys):
    cache.mkdir(parents=True)
    (cache / "x.whl").write_bytes(b"corrupt cache")
    calls = _serve(monkeypatch, GOOD)
    assert pinmod.fetch("x.whl", GOOD_SHA, "vllm-ascend").read_bytes() == GOOD
    assert len(calls) == 1
    bad_sha = hashlib.sha256(b"corrupt cache").hexdigest()
    assert f"x.whl has sha256 {bad_sha}, but pin.json pins {GOOD_SHA}; downloading it again" in capsys.readouterr().err
    pinmod.fetch("x.whl", GOOD_SHA, "vllm-ascend")
    assert len(calls) == 1, "a verified cached file is not downloaded again"


def test_offline_without_cache_says_what_to_fetch(cache, monkeypatch):
    monkeypatch.setenv("PATCHSET_OFFLINE", "1")
    with pytest.raises(PinError, match=r"x\.whl is not in the cache .*sha256 " + GOOD_SHA):
        pinmod.fetch("x.whl", GOOD_SHA, "vllm-ascend")


WRONG_SHA = "0" * 64


@pytest.mark.parametrize("index_hash", [GOOD_SHA, None], ids=["index-states-hash", "index-states-none"])
def test_a_wrong_pin_never_deletes_the_good_cached_file(cache, monkeypatch, index_hash):
    cache.mkdir(parents=True)
    (cache / "x.whl").write_bytes(GOOD)
    _serve(monkeypatch, GOOD, index_hash)
    with pytest.raises(PinError) as err:
        pinmod.fetch("x.whl", WRONG_SHA, "vllm-ascend")
    assert (cache / "x.whl").read_bytes() == GOOD
    assert os.listdir(cache) == ["x.whl"], "no partial download left"
    assert f"pin.json pins {WRONG_SHA}, the download has {GOOD_SHA} and " in str(err.value)
    assert "pin.json's entry is probably wrong" in str(err.value)


def test_a_corrupt_download_never_replaces_the_cached_file(cache, monkeypatch):
    cache.mkdir(parents=True)
    (cache / "x.whl").write_bytes(b"old copy")
    _serve(monkeypatch, b"cut short", GOOD_SHA)
    with pytest.raises(PinError) as err:
        pinmod.fetch("x.whl", GOOD_SHA, "vllm-ascend")
    assert (cache / "x.whl").read_bytes() == b"old copy"
    assert os.listdir(cache) == ["x.whl"]
    assert "corrupt or not the expected file (the cached copy was left as it was)" in str(err.value)


def test_offline_a_corrupt_cached_file_is_named_as_such(cache, monkeypatch):
    cache.mkdir(parents=True)
    (cache / "x.whl").write_bytes(b"corrupt cache")
    monkeypatch.setenv("PATCHSET_OFFLINE", "1")
    bad_sha = hashlib.sha256(b"corrupt cache").hexdigest()
    with pytest.raises(PinError) as err:
        pinmod.fetch("x.whl", GOOD_SHA, "vllm-ascend")
    msg = str(err.value)
    assert f"has sha256 {bad_sha}, but pin.json pins {GOOD_SHA}, and downloads are off" in msg
    assert "not in the cache" not in msg


@pytest.fixture
def unreachable_index(monkeypatch):
    def urlopen(*args, **kwargs):
        raise urllib.error.URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(pinmod.urllib.request, "urlopen", urlopen)


@pytest.mark.parametrize("offline", ["0", "1"])
def test_check_pin_without_index_is_a_one_line_error(cache, monkeypatch, capsys, unreachable_index, offline):
    monkeypatch.setenv("PATCHSET_OFFLINE", offline)
    assert main(["check-pin", "9.9.9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    if offline == "1":
        assert "downloads are off (PATCHSET_OFFLINE=1)" in err
    else:
        assert "cannot read the package index" in err and "Name or service not known" in err


def _host_wheel(version: str) -> str:
    host = WheelTarget.host()
    return f"vllm_ascend-{version}-{host.py}-{host.py}-manylinux_2_34_{host.arch}.whl"


def test_check_pin_offline_uses_the_cache_for_the_pinned_and_other_releases(cache, monkeypatch, unreachable_index):
    monkeypatch.setenv("PATCHSET_OFFLINE", "1")
    pin = dataclasses.replace(Pin.load(), wheels={_host_wheel("0.23.0"): GOOD_SHA})
    cache.mkdir(parents=True)
    (cache / _host_wheel("0.23.0")).write_bytes(GOOD)
    (cache / _host_wheel("0.24.0")).write_bytes(b"another release")
    assert check.release_wheel(pin, "0.23.0", WheelTarget.host()) == cache / _host_wheel("0.23.0")
    assert check.release_wheel(pin, "0.24.0", WheelTarget.host()) == cache / _host_wheel("0.24.0")
    with pytest.raises(PinError, match=r"PATCHSET_OFFLINE=1\) and the cache .* holds no vllm-ascend 0.25.0 wheel"):
        check.release_wheel(pin, "0.25.0", WheelTarget.host())


def test_check_pin_lists_releases_in_version_order(monkeypatch):
    names = [_host_wheel(v) for v in ("0.10.0", "0.9.1", "0.23.0", "0.9.2rc1", "0.9.2")]
    monkeypatch.setattr(check, "index_links", lambda project: dict.fromkeys(names, ("u", None)))
    with pytest.raises(PinError, match=r"newest last: 0\.9\.1, 0\.9\.2rc1, 0\.9\.2, 0\.10\.0, 0\.23\.0$"):
        check.find_release_wheel("vllm-ascend", "9.9.9", WheelTarget.host())


def test_no_network_is_a_clear_error(cache, monkeypatch):
    def unreachable(project):
        raise OSError("Network is unreachable")

    monkeypatch.setattr(pinmod, "index_links", unreachable)
    with pytest.raises(PinError, match=r"cannot download x\.whl .*Network is unreachable.*put the file"):
        pinmod.fetch("x.whl", GOOD_SHA, "vllm-ascend")


def test_pin_lists_six_wheels_and_the_sdist():
    pin = Pin.load()
    assert {(t.py, t.arch) for t in pin.targets()} == {
        (py, arch) for py in ("cp310", "cp311", "cp312") for arch in ("x86_64", "aarch64")
    }
    assert list(pin.sdist) == ["vllm_ascend-0.23.0.post1.tar.gz"]
    assert all(len(h) == 64 for h in pin.all_files().values())


def test_unknown_target_lists_the_pinned_ones():
    with pytest.raises(PinError, match=r"no pinned wheel for cp39-riscv64; pinned targets: .*PY=cp310 ARCH=aarch64"):
        Pin.load().wheel_name(WheelTarget("cp39", "riscv64"))


def test_patchset_version_matches_the_pin():
    from vllm_ascend import patchset

    pin = Pin.load()
    assert patchset.PATCHSET_VERSION == f"{pin.version}+{pin.local_version}"
    assert patchset.UPSTREAM_VERSION == pin.version


@pytest.mark.parametrize("version", ["", "1e9", "../../etc", "latest"])
def test_check_pin_refuses_a_version_that_is_no_release_before_the_index(monkeypatch, capsys, version):
    """These went to the package index (or, offline, the cache) before the error said there was no such wheel."""

    def urlopen(*args, **kwargs):
        raise AssertionError("the index was read")

    monkeypatch.setattr(pinmod.urllib.request, "urlopen", urlopen)
    assert main(["check-pin", version]) == 2
    err = capsys.readouterr().err
    assert err == f"error: check-pin VERSION {version!r}: not a release version; give one such as 0.24.0\n", err


class _Page:
    """What urlopen returns for an index page."""

    def __init__(self, url: str, content_type: str, body: bytes) -> None:
        self._url, self.body = url, body
        self.headers = email.message.Message()
        self.headers["Content-Type"] = content_type

    def geturl(self) -> str:
        return self._url

    def read(self) -> bytes:
        return self.body

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


def test_an_index_that_serves_only_pep_503_html_is_read_as_pip_reads_it(monkeypatch):
    """Many mirrors serve the simple API as HTML only; a file's link may be relative and carry its hash."""
    page = (
        b"<!DOCTYPE html><html><body>"
        b'<a href="../../packages/vllm_ascend-0.23.0-cp311-cp311-manylinux_2_34_x86_64.whl#sha256=ab12">'
        b"vllm_ascend-0.23.0-cp311-cp311-manylinux_2_34_x86_64.whl</a><br/>"
        b'<a href="https://files.example/vllm_ascend-0.23.0.tar.gz">vllm_ascend-0.23.0.tar.gz</a>'
        b"</body></html>"
    )
    monkeypatch.setenv("PIP_INDEX_URL", "https://mirror.example/pypi/simple/")
    seen = []

    def urlopen(request, timeout):
        seen.append(request.full_url)
        return _Page(request.full_url, "text/html", page)

    monkeypatch.setattr(pinmod.urllib.request, "urlopen", urlopen)
    links = package_index.index_links("vllm-ascend")
    assert seen == ["https://mirror.example/pypi/simple/vllm-ascend/"]
    assert links == {
        "vllm_ascend-0.23.0-cp311-cp311-manylinux_2_34_x86_64.whl": (
            "https://mirror.example/pypi/packages/vllm_ascend-0.23.0-cp311-cp311-manylinux_2_34_x86_64.whl",
            "ab12",
        ),
        "vllm_ascend-0.23.0.tar.gz": ("https://files.example/vllm_ascend-0.23.0.tar.gz", None),
    }


def test_the_index_pip_is_configured_with_is_used_without_pip_index_url(tmp_path, monkeypatch):
    _only_this_pip_conf(monkeypatch, tmp_path, "[global]\nindex-url = https://mirror.example/simple\n")
    assert package_index.index_url() == "https://mirror.example/simple"
    monkeypatch.setenv("PIP_INDEX_URL", "https://other.example/simple/")  # the variable wins, as in pip
    assert package_index.index_url() == "https://other.example/simple"


def test_credentials_in_the_index_url_go_in_a_header_and_never_into_a_message(monkeypatch):
    """pip takes https://user:token@host/simple; urllib cannot (it reads 'token@host' as a port)."""
    monkeypatch.setenv("PIP_INDEX_URL", "https://ci-user:s3cr%40t@mirror.example/simple")
    seen = []

    def urlopen(request, timeout):
        seen.append((request.full_url, request.get_header("Authorization")))
        raise urllib.error.URLError("connection refused")

    monkeypatch.setattr(pinmod.urllib.request, "urlopen", urlopen)
    with pytest.raises(PinError) as info:
        package_index.index_links("vllm-ascend")
    expected = "Basic " + base64.b64encode(b"ci-user:s3cr@t").decode()
    assert seen == [("https://mirror.example/simple/vllm-ascend/", expected)]
    assert "s3cr" not in str(info.value) and "mirror.example/simple/vllm-ascend/" in str(info.value)
    # A file on the index's host gets them too; one elsewhere does not.
    assert package_index.index_request("https://mirror.example/packages/a.whl").get_header("Authorization") == expected
    assert package_index.index_request("https://files.example/a.whl").get_header("Authorization") is None


def test_a_file_index_is_read_from_its_folders_index_html_and_hashes_in_capitals_are_kept(tmp_path, monkeypatch):
    page = tmp_path / "simple" / "vllm-ascend"
    page.mkdir(parents=True)
    (page / "index.html").write_text(
        '<a href="../../f/vllm_ascend-0.23.0.tar.gz#sha256=AB12CD">vllm_ascend-0.23.0.tar.gz</a>'
    )
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "simple").as_uri())
    links = package_index.index_links("vllm-ascend")
    assert links == {"vllm_ascend-0.23.0.tar.gz": ((tmp_path / "f" / "vllm_ascend-0.23.0.tar.gz").as_uri(), "ab12cd")}


def test_a_download_that_fails_never_shows_the_index_credentials(cache, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "https://ci-user:s3cret@mirror.example/simple")
    monkeypatch.setattr(pinmod, "index_links", lambda project: {})  # the file is not listed
    with pytest.raises(PinError) as info:
        pinmod.fetch("x.whl", "0" * 64, "vllm-ascend")
    assert "mirror.example/simple does not list this file" in str(info.value) and "s3cret" not in str(info.value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1", True),
        ("true", True),
        (" YES ", True),
        ("on", True),
        ("", False),
        ("0", False),
        ("False", False),
        ("off", False),
    ],
)
def test_patchset_offline_reads_as_a_switch_and_anything_else_is_an_error(monkeypatch, value, expected):
    from vllm_ascend_patchset import pin

    monkeypatch.setenv("PATCHSET_OFFLINE", value)
    assert pin.offline() is expected
    monkeypatch.setenv("PATCHSET_OFFLINE", "offline")
    with pytest.raises(pin.PinError, match=r"PATCHSET_OFFLINE='offline': set it to 1"):
        pin.offline()


def test_a_hash_the_index_states_in_another_algorithm_is_checked_in_it(cache, monkeypatch):
    """PEP 503 lets a mirror state md5, sha384 or sha512; pip checks any. A download that does not match it
    is refused, one that does is kept (its sha256 then computed for pin.json)."""
    import hashlib

    body = b"a wheel"
    monkeypatch.setattr(pinmod, "_download", lambda url, part: part.write_bytes(body))
    page = (
        f'<a href="/f/good.whl#sha512={hashlib.sha512(body).hexdigest().upper()}">good.whl</a>'
        f'<a href="/f/bad.whl#md5={hashlib.md5(b"another").hexdigest()}">bad.whl</a>'
        '<a href="/f/odd.whl#whirlpool=00">odd.whl</a>'
    ).encode()
    monkeypatch.setenv("PIP_INDEX_URL", "https://mirror.example/simple/")
    monkeypatch.setattr(
        pinmod.urllib.request, "urlopen", lambda request, timeout: _Page(request.full_url, "text/html", page)
    )
    links = package_index.index_links("vllm-ascend")
    assert links["good.whl"][1] == "sha512:" + hashlib.sha512(body).hexdigest()
    assert links["odd.whl"][1] is None  # an algorithm hashlib may lack: no hash stated, as before
    assert pinmod.fetch("good.whl", None, "vllm-ascend").read_bytes() == body
    with pytest.raises(PinError, match="bad.whl: md5 mismatch: the index states"):
        pinmod.fetch("bad.whl", None, "vllm-ascend")
    assert not (pinmod.cache_dir() / "downloads" / "bad.whl").exists()


# Extra indexes (pip's extra-index-url)


def _file_index(root, files: dict[str, bytes]) -> str:
    """A folder index listing ``files`` for vllm-ascend, each with its sha256; its URL."""
    page = root / "simple" / "vllm-ascend"
    page.mkdir(parents=True)
    anchors = []
    for name, body in files.items():
        (root / name).write_bytes(body)
        anchors.append(f'<a href="../../{name}#sha256={hashlib.sha256(body).hexdigest()}">{name}</a>')
    (page / "index.html").write_text("".join(anchors))
    return (root / "simple").as_uri()


def test_a_file_the_index_lacks_comes_from_an_extra_index_and_the_index_wins_where_both_list_it(
    tmp_path, cache, monkeypatch
):
    first = _file_index(tmp_path / "mirror", {"a.tar.gz": b"a from the mirror"})
    extra = _file_index(tmp_path / "extra", {"a.tar.gz": b"a from the extra", "x.whl": GOOD})
    monkeypatch.setenv("PIP_INDEX_URL", first)
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", f"{extra}  {first}/")  # the index itself is not read twice
    assert package_index.extra_index_urls() == [extra]
    links = package_index.index_links("vllm-ascend")
    assert links["a.tar.gz"][0] == (tmp_path / "mirror" / "a.tar.gz").as_uri()
    assert links["x.whl"][0] == (tmp_path / "extra" / "x.whl").as_uri()
    assert pinmod.fetch("x.whl", GOOD_SHA, "vllm-ascend").read_bytes() == GOOD
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL")
    with pytest.raises(PinError, match="does not list this file"):
        pinmod.fetch("y.whl", GOOD_SHA, "vllm-ascend")


def test_an_index_that_cannot_be_read_is_skipped_with_a_warning_unless_none_can(monkeypatch, capsys):
    monkeypatch.setenv("PIP_INDEX_URL", "https://down.example/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://up.example/simple")
    page = b'<a href="/f/x.whl">x.whl</a>'

    def urlopen(request, timeout):
        if "down.example" in request.full_url:
            raise urllib.error.URLError("connection refused")
        return _Page(request.full_url, "text/html", page)

    monkeypatch.setattr(pinmod.urllib.request, "urlopen", urlopen)
    assert package_index.index_links("vllm-ascend") == {"x.whl": ("https://up.example/f/x.whl", None)}
    assert "warning: cannot read the package index https://down.example/simple/vllm-ascend/" in capsys.readouterr().err
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://down.example/other")
    with pytest.raises(PinError) as info:
        package_index.index_links("vllm-ascend")
    message = str(info.value)
    assert "down.example/simple/vllm-ascend/" in message and "down.example/other/vllm-ascend/" in message


def test_extra_indexes_come_from_pip_configuration_and_the_variable_wins(tmp_path, monkeypatch):
    conf = "[global]\nextra-index-url =\n    https://one.example/simple/\n    https://two.example/simple\n"
    _only_this_pip_conf(monkeypatch, tmp_path, conf)
    assert package_index.extra_index_urls() == ["https://one.example/simple", "https://two.example/simple"]
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://three.example/simple")
    assert package_index.extra_index_urls() == ["https://three.example/simple"]
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", " ")  # empty counts as unset, as in pip
    assert package_index.extra_index_urls() == ["https://one.example/simple", "https://two.example/simple"]


def test_an_extra_index_credentials_go_to_its_host_and_never_into_a_message(monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "https://mirror.example/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://ci-user:s3cret@extra.example/simple")
    expected = "Basic " + base64.b64encode(b"ci-user:s3cret").decode()
    assert package_index.index_request("https://extra.example/packages/a.whl").get_header("Authorization") == expected
    assert package_index.index_request("https://mirror.example/packages/a.whl").get_header("Authorization") is None
    assert (
        package_index.shown_index() == "https://mirror.example/simple (or the extra index https://extra.example/simple)"
    )
    # Not over another port or scheme, and never on to wherever a redirect points.
    assert package_index.index_request("https://extra.example:8443/a.whl").get_header("Authorization") is None
    assert package_index.index_request("http://extra.example/a.whl").get_header("Authorization") is None
    request = package_index.index_request("https://extra.example/packages/a.whl")
    assert "Authorization" not in request.headers and request.unredirected_hdrs["Authorization"] == expected


def test_of_two_indexes_on_one_host_a_file_gets_the_credentials_of_the_one_whose_path_it_shares(monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "https://u:one@git.example/api/projects/1/packages/pypi/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://u:two@git.example/api/projects/2/packages/pypi/simple")
    two = "Basic " + base64.b64encode(b"u:two").decode()
    assert (
        package_index.index_request("https://git.example/api/projects/2/packages/pypi/files/x.whl").get_header(
            "Authorization"
        )
        == two
    )


def test_an_index_without_the_project_lists_nothing_and_a_malformed_one_is_skipped_without_its_token(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("PIP_INDEX_URL", "https://mirror.example/simple")
    page = b'<a href="/f/x.whl">x.whl</a>'

    def urlopen(request, timeout):
        if "empty.example" in request.full_url:
            raise urllib.error.HTTPError(request.full_url, 404, "Not Found", None, None)
        if request.full_url.startswith("file:"):
            raise urllib.error.URLError("[Errno 2] No such file or directory")  # as urllib says of a missing folder
        return _Page(request.full_url, "text/html", page)

    monkeypatch.setattr(pinmod.urllib.request, "urlopen", urlopen)
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://empty.example/simple")
    assert package_index.index_links("vllm-ascend") == {"x.whl": ("https://mirror.example/f/x.whl", None)}
    assert capsys.readouterr().err == ""  # (pip reads a 404 as no files)
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", (tmp_path / "simple").as_uri())  # a folder index without the project
    (tmp_path / "simple").mkdir()
    assert package_index.index_links("vllm-ascend") == {"x.whl": ("https://mirror.example/f/x.whl", None)}
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "ci:S3CRET@pkgs.example/simple https://u:t@bad.example:44x3/simple")
    for _ in range(2):
        assert package_index.index_links("vllm-ascend") == {"x.whl": ("https://mirror.example/f/x.whl", None)}
    warned = capsys.readouterr().err
    assert warned.count("warning: cannot read the package index") == 2, "each once per process"
    assert "S3CRET" not in warned and "u:t" not in warned and "pkgs.example/simple" in warned


def test_an_index_that_cannot_be_read_is_named_as_such_when_no_other_lists_the_file(tmp_path, cache, monkeypatch):
    extra = _file_index(tmp_path / "extra", {"other.whl": b"other"})
    monkeypatch.setenv("PIP_INDEX_URL", "https://down.example/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", extra)
    real_urlopen = pinmod.urllib.request.urlopen

    def urlopen(request, timeout):
        if "down.example" in request.full_url:
            raise urllib.error.URLError("connection refused")
        return real_urlopen(request, timeout=timeout)

    monkeypatch.setattr(pinmod.urllib.request, "urlopen", urlopen)
    with pytest.raises(PinError) as info:
        pinmod.fetch("x.whl", GOOD_SHA, "vllm-ascend")
    message = str(info.value)
    assert f"the package index {extra} does not list this file (and https://down.example/simple could not" in message
