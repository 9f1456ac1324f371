"""``vllm-ascend-patchset``: the verbs behind the Makefile."""

from __future__ import annotations

import argparse
import sys

from .pin import Pin, PinError, Target


def _target(args: argparse.Namespace) -> Target:
    host = Target.host()
    return Target(args.py or host.py, args.arch or host.arch)


def cmd_assemble(args: argparse.Namespace) -> int:
    from .assemble import assemble

    a = assemble(_target(args))
    print(f"assembled {a.package} ({len(a.patches)} patches, {len(a.overlay)} overlay files)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vllm-ascend-patchset", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("assemble", help="build build/<target>/vllm_ascend from the pin, patches and overlay")
    p.add_argument("--py", help="CPython tag, e.g. cp311 (default: this interpreter)")
    p.add_argument("--arch", help="x86_64 or aarch64 (default: this machine)")
    p.set_defaults(func=cmd_assemble)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (PinError, ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
