"""``vllm-ascend-patchset``: the verbs behind the Makefile."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .pin import Pin, PinError
from .wheel_target import WheelTarget


def _target(args: argparse.Namespace) -> WheelTarget:
    host = WheelTarget.host()
    return WheelTarget(args.py or host.py, args.arch or host.arch)


def cmd_assemble(args: argparse.Namespace) -> int:
    from .assemble import assemble

    a = assemble(_target(args))
    print(f"assembled {a.package} ({len(a.patches)} patches, {len(a.overlay)} overlay files)")
    return 0


def cmd_wheel(args: argparse.Namespace) -> int:
    from .wheel import build_wheel

    pin = Pin.load()
    targets = pin.targets() if args.all else [_target(args)]
    for target in targets:
        pin.wheel_name(target)  # an unknown target is an error listing the pinned ones
    for target in targets:
        built = build_wheel(target, pin=pin)
        print(f"{built.path.relative_to(Path.cwd()) if built.path.is_relative_to(Path.cwd()) else built.path}")
        print(f"  {built.size} bytes, {built.files} files, sha256 {built.sha256} (RECORD verified, installs)")
    return 0


def cmd_diffs(args: argparse.Namespace) -> int:
    from .assemble import assemble
    from .diffs import write_diffs
    from .upstream_ut import load_source_patches

    if args.target:
        return _target_diffs(args)
    pin = Pin.load()
    upstream = f"vllm-ascend {pin.git_tag} (commit {pin.git_commit})"
    source = load_source_patches()  # upstream's unit tests and docs, rewritten where the series replaces their subject
    written = write_diffs(assemble(_target(args)), upstream=upstream, author=args.author, source_patches=source)
    for feature, paths in written.items():
        print(f"{feature}: {len(paths)} patches in {paths[0].parent}")
    return 0


def _target_diffs(args: argparse.Namespace) -> int:
    from .paths import PACKAGE
    from .target_diffs import write_target_diffs
    from .targets import load_target
    from .trees import pristine_root

    if not args.upstream_src:
        raise ValueError(
            "diffs --target needs --upstream-src <vllm-ascend git checkout> (make diffs TARGET=x UPSTREAM_SRC=path)"
        )
    pin = Pin.load()
    target = load_target(args.target)
    result = write_target_diffs(
        target,
        Path(args.upstream_src),
        pristine_pkg=pristine_root(_target(args)) / PACKAGE,
        pin_name=pin.git_tag,
        author=args.author,
    )
    for path in result.refreshed:
        print(f"refreshed {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
    for feature, paths in result.written.items():
        print(f"{feature}: {len(paths)} patches in {paths[0].parent}")
    print(f"for {target.repository} {target.ref} at {target.commit}; replayed with git am: identical to the port")
    return 0


def cmd_check_pin(args: argparse.Namespace) -> int:
    from .check import check_release

    results = check_release(args.version, _target(args))
    for r in results:
        print(f"{'ok  ' if r.ok else 'FAIL'} {r.item}: {r.detail}")
    failed = sum(not r.ok for r in results)
    print(f"{len(results) - failed} of {len(results)} apply to vllm-ascend {args.version}")
    return 1 if failed else 0


def cmd_port(args: argparse.Namespace) -> int:
    from .paths import PACKAGE
    from .port import check_descends, check_report_path, port, write_report
    from .series import load_overlay, load_patches
    from .targets import load_target
    from .trees import pristine_root

    # before anything is written: the checkout's changes would refuse a rerun
    check_report_path(args.report, Path(args.upstream_src))
    pin = Pin.load()
    pristine = pristine_root(_target(args)) / PACKAGE
    target = load_target(args.target) if args.target else None
    if target is not None:
        check_descends(Path(args.upstream_src), target)
    report = port(
        Path(args.upstream_src),
        patches=load_patches(),
        overlay=load_overlay(),
        pristine_pkg=pristine,
        pin_name=pin.git_tag,
        dry_run=args.dry_run,
        target=target,
    )
    print(report.render(full=False), end="")
    print(f"Full report (with the upstream diffs of replaced files): {write_report(report, args.report)}")
    return 0 if report.ok else 1


def cmd_upstream_ut(args: argparse.Namespace) -> int:
    from collections import Counter

    from .paths import BUILD_DIR
    from .upstream_ut import compare, prepare, regressions, run

    out = BUILD_DIR / "upstream-ut"
    if args.paths:  # upstream's tests as pytest shows them, on the series
        series = prepare(out / "series", _target(args))
        absent = [p for p in args.paths if not (series / p.split("::")[0]).exists()]
        if absent:
            shown = ", ".join(absent)
            print(f"error: not in upstream's tests: {shown} (paths such as tests/ut/core)", file=sys.stderr)
            return 2
        return run(series, args.paths, args.pytest_args, capture=False).returncode
    found = compare(out, _target(args))
    for name, shown in (("released", "upstream as released"), ("series", "with the series")):
        counts = Counter(found[name].values())
        print(f"{shown}: " + ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "error", "skipped")))
    broken = regressions(found["series"], found["released"])
    for test in broken:
        print(f"fails with the series, passed without it: {test}")
    if not broken:
        print("no test fails with the series that passed without it")
    print(f"reports: {out}/*/report.xml; one file with its output: make upstream-ut ARGS=tests/ut/<path>")
    return 1 if broken else 0


def cmd_config_docs(args: argparse.Namespace) -> int:
    from .assemble import assemble
    from .config_docs import SECTIONS, section_class, write

    assembled = assemble(_target(args)).root
    for doc in SECTIONS:
        changed = write(doc, section_class(doc, assembled))
        print(f"{doc}: {'table rewritten' if changed else 'up to date'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["cpp-twin"]:  # its own argument parser: see docs/cpp-twin.md
        from .twin.command import main as twin_main

        return twin_main(argv[1:])
    if argv[:1] == ["ds-bench"]:  # its own argument parser: see docs/dual-stream.md
        from .dsbench.command import main as ds_bench_main

        return ds_bench_main(argv[1:])
    parser = argparse.ArgumentParser(prog="vllm-ascend-patchset", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("assemble", help="build build/<target>/vllm_ascend from the pin, patches and overlay")
    p.add_argument("--py", help="CPython tag, e.g. cp311 (default: this interpreter)")
    p.add_argument("--arch", help="x86_64 or aarch64 (default: this machine)")
    p.set_defaults(func=cmd_assemble)
    p = sub.add_parser("wheel", help="build and verify dist/vllm_ascend-<version>+<label>-<tags>.whl")
    p.add_argument("--py")
    p.add_argument("--arch")
    p.add_argument("--all", action="store_true", help="every pinned target")
    p.set_defaults(func=cmd_wheel)
    p = sub.add_parser("diffs", help="git am-able series per feature under dist/upstream/")
    p.add_argument("--py")
    p.add_argument("--arch")
    p.add_argument("--target", help="the series for patches/targets/TARGET (e.g. main), in dist/upstream-TARGET/")
    p.add_argument("--upstream-src", help="with --target: a vllm-ascend git checkout that has the target's commit")
    p.add_argument("--author", help="'Full Name <mail>': every mail's author (default: the patches' Author headers)")
    p.set_defaults(func=cmd_diffs)
    sub.add_parser("cpp-twin", help="pipeline twin: TTFT and bubbles of fixed, upstream and our CPP (--help)")
    sub.add_parser("ds-bench", help="dual stream against single stream on the CPU, TP = 2, emulated links (--help)")
    p = sub.add_parser("upstream-ut", help="upstream's CPU unit tests with the series, against upstream as released")
    p.add_argument("paths", nargs="*", help="upstream's tests to run with the series alone, e.g. tests/ut/core")
    p.add_argument("--pytest-args", nargs=argparse.REMAINDER, default=[], help="what follows goes to pytest")
    p.add_argument("--py")
    p.add_argument("--arch")
    p.set_defaults(func=cmd_upstream_ut)
    p = sub.add_parser("config-docs", help="rewrite the docs' config tables from the config dataclasses")
    p.add_argument("--py")
    p.add_argument("--arch")
    p.set_defaults(func=cmd_config_docs)
    p = sub.add_parser("check-pin", help="report whether each patch applies to another upstream release")
    p.add_argument("version")
    p.add_argument("--py")
    p.add_argument("--arch")
    p.set_defaults(func=cmd_check_pin)
    p = sub.add_parser(
        "port",
        help="three-way merge the series into a vllm-ascend git checkout and report per patch and hunk",
    )
    p.add_argument("upstream_src", help="a vllm-ascend git checkout (its work tree receives the port)")
    p.add_argument("--dry-run", action="store_true", help="report only; write nothing into the checkout")
    p.add_argument("--target", help="port the series of patches/targets/TARGET (e.g. main) instead of the pinned one")
    p.add_argument(
        "--report", type=Path, help="where to write the full report (default: build/port/<ref>[-target-TARGET].txt)"
    )
    p.add_argument("--py")
    p.add_argument("--arch")
    p.set_defaults(func=cmd_port)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (PinError, ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file or folder the command writes is in the way or not writable
        print(f"error: {exc}: move what is in the way, or make the folder writable, and run it again", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
