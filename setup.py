"""Packaging for the patch-set tooling (assemble, wheel, diffs, check, cpp-twin).

The patched ``vllm_ascend`` wheel itself is produced by ``make wheel``; this file only
makes the tooling importable (``pip install -e .``) with a console entry point.
"""

from setuptools import find_packages, setup

setup(
    name="vllm-ascend-patchset",
    version="0.1.0",
    description="Build tooling for the vllm-ascend CPP and dual-stream patch set",
    package_dir={"": "scripts"},
    packages=find_packages(where="scripts", include=["vllm_ascend_patchset*"]),
    python_requires=">=3.10",
    entry_points={"console_scripts": ["vllm-ascend-patchset=vllm_ascend_patchset.cli:main"]},
)
