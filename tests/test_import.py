from pathlib import Path

import conftest


def test_vllm_ascend_comes_from_the_assembled_tree():
    import vllm_ascend

    assert Path(vllm_ascend.__file__).resolve().parent == (conftest.ASSEMBLED / "vllm_ascend").resolve()


def test_patchset_module_and_registration_hook():
    import vllm_ascend
    from vllm_ascend import patchset

    assert patchset.PATCHSET_VERSION.startswith(patchset.UPSTREAM_VERSION + "+")
    assert vllm_ascend.register() == "vllm_ascend.platform.NPUPlatform"
    assert patchset._logged, "register() must log the patch set"
