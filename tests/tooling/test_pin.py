"""The pin refuses files whose sha256 differs, and says what to do without a network."""

from __future__ import annotations

import hashlib

import pytest
from vllm_ascend_patchset import pin as pinmod
from vllm_ascend_patchset.pin import Pin, PinError, Target

GOOD = b"the real wheel bytes"
GOOD_SHA = hashlib.sha256(GOOD).hexdigest()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PATCHSET_CACHE", str(tmp_path))
    monkeypatch.delenv("PATCHSET_OFFLINE", raising=False)
    return tmp_path / "downloads"


def _serve(monkeypatch, payload: bytes) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(pinmod, "_index_links", lambda project: {"x.whl": ("https://index.invalid/x.whl", None)})

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


def test_bad_cached_file_is_downloaded_again_once(cache, monkeypatch):
    cache.mkdir(parents=True)
    (cache / "x.whl").write_bytes(b"corrupt cache")
    calls = _serve(monkeypatch, GOOD)
    assert pinmod.fetch("x.whl", GOOD_SHA, "vllm-ascend").read_bytes() == GOOD
    assert len(calls) == 1
    pinmod.fetch("x.whl", GOOD_SHA, "vllm-ascend")
    assert len(calls) == 1, "a verified cached file is not downloaded again"


def test_offline_without_cache_says_what_to_fetch(cache, monkeypatch):
    monkeypatch.setenv("PATCHSET_OFFLINE", "1")
    with pytest.raises(PinError, match=r"x\.whl is not in the cache .*sha256 " + GOOD_SHA):
        pinmod.fetch("x.whl", GOOD_SHA, "vllm-ascend")


def test_no_network_is_a_clear_error(cache, monkeypatch):
    def unreachable(project):
        raise OSError("Network is unreachable")

    monkeypatch.setattr(pinmod, "_index_links", unreachable)
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
        Pin.load().wheel_name(Target("cp39", "riscv64"))


def test_patchset_version_matches_the_pin():
    from vllm_ascend import patchset

    pin = Pin.load()
    assert patchset.PATCHSET_VERSION == f"{pin.version}+{pin.local_version}"
    assert patchset.UPSTREAM_VERSION == pin.version
