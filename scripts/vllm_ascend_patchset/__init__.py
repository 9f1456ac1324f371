"""Tooling that turns the pinned vllm-ascend release plus our patch set into a wheel."""
