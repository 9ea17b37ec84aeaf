#!/usr/bin/env python3
"""Builds a scratch package's test targets and runs them, minus listed exceptions.

    harness.py --pkg DIR --exceptions FILE [--runs N] [--timeout S] [--label TEXT]
               [--cargo-args "--all-features"]

Used by tokio-time.sh and crates.sh. Every test target (`tests/*.rs`, the unit tests
of `src/`) is built with `cargo build --tests --keep-going` (a target that does not
compile does not stop the others), then each test binary runs on its own with
libtest's default parallel harness and `--exact --skip NAME` for each exception of
that file (a binary still running after --timeout is killed, the tests that hang
are found and the others run again without them). Prints one line
per file, each failing test with the first line of its panic, and a final count
line; exits 1 if a test that is not excepted failed (or hung, or its file did not
compile), or if an exception names a test that no longer exists. Full logs are
written under DIR/logs/.

Exceptions: one `file::test_name  # reason` a line; `#` starts a comment.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

RESULT = re.compile(r"^test (\S+)(?: - should panic)? \.\.\. (ok|FAILED|ignored)", re.M)
TEST_ATTR = re.compile(r"#\[(?:test|[\w:]*::test\b[^\]]*)\]")


def read_exceptions(path):
    exc = defaultdict(dict)
    if path and Path(path).exists():
        for n, line in enumerate(Path(path).read_text().splitlines(), 1):
            body, _, reason = line.partition("#")
            body = body.strip()
            if not body:
                continue
            if "::" not in body:
                sys.exit(f"{path}:{n}: expected `file::test_name  # reason`, got {line!r}")
            file, name = body.split("::", 1)
            exc[file][name] = reason.strip()
    return exc


def build(pkg, logs, cargo_args):
    """Builds the test targets; returns ({target: executable}, {target: first errors})."""
    cmd = ["cargo", "build", "--tests", "--keep-going", "--message-format=json"] + cargo_args
    print("+ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, cwd=pkg, stdout=subprocess.PIPE, text=True)
    exes, errors = {}, defaultdict(list)
    for line in p.stdout.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        kind = msg.get("target", {}).get("kind", [])
        name = msg.get("target", {}).get("name")
        if msg.get("reason") == "compiler-artifact" and msg.get("profile", {}).get("test") and msg.get("executable"):
            exes[name] = msg["executable"]
        elif msg.get("reason") == "compiler-message" and msg["message"]["level"] == "error":
            errors[name].append(msg["message"]["rendered"])
    (logs / "build.log").write_text("".join("".join(v) for v in errors.values()))
    return exes, errors


def run_binary(exe, pkg, skips, timeout, only=(), threads=None):
    """Runs one test binary; returns (listed names, {name: result}, output, timed out)."""
    listed = subprocess.run([exe, "--list", "--format", "terse"], cwd=pkg, capture_output=True, text=True).stdout
    names = [line[: -len(": test")] for line in listed.splitlines() if line.endswith(": test")]
    args = [exe, "--exact"] + [a for s in skips for a in ("--skip", s)] + list(only)
    args += [f"--test-threads={threads}"] if threads else []
    proc = subprocess.Popen(args, cwd=pkg, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, timed_out = proc.communicate(timeout=timeout)[0], False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, timed_out = proc.communicate()[0], True
    return names, dict(RESULT.findall(out)), out, timed_out


def cause(out, name):
    """The first line of the panic of `name` in libtest's failure report."""
    sect = out.split(f"---- {name} stdout ----", 1)
    if len(sect) < 2:
        return "no panic message captured"
    lines = sect[1].split("\n---- ", 1)[0].strip().splitlines()
    for i, line in enumerate(lines):
        if "panicked at" in line:
            where = line.split("panicked at", 1)[1].strip().rstrip(":")
            msg = [m.strip() for m in lines[i + 1 : i + 4] if m.strip()]
            msg = msg[:1] + [m for m in msg[1:3] if m.startswith(("left:", "right:"))]
            return f"{' '.join(msg)}  (at {where})"
    return " ".join(lines[:2]) if lines else "no panic message captured"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pkg", required=True)
    ap.add_argument("--exceptions")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=90, help="seconds per test binary")
    ap.add_argument("--label", default="conformance")
    ap.add_argument("--cargo-args", default="", help="more arguments for cargo build, e.g. --all-features")
    a = ap.parse_args()
    pkg = Path(a.pkg).resolve()
    logs = pkg / "logs"
    logs.mkdir(exist_ok=True)
    exc = read_exceptions(a.exceptions)
    # The test targets cargo knows (`tests/*.rs`, [[test]]); one may not compile.
    meta = json.loads(subprocess.run(["cargo", "metadata", "--no-deps", "--format-version", "1"], cwd=pkg,
                                     check=True, capture_output=True, text=True).stdout)
    sources = {t["name"]: t["src_path"] for p in meta["packages"] for t in p["targets"] if "test" in t["kind"]}
    exes, errors = build(pkg, logs, a.cargo_args.split())
    files = sorted(set(sources) | set(exes))  # and the unit tests (`src/`), by crate name
    bad = False

    for f in exc:
        if f not in files:
            print(f"STALE EXCEPTION: no test file {f}.rs for {', '.join(exc[f])}")
            bad = True

    failed_any, passed_all, excepted, total = set(), None, set(), set()
    for run in range(1, a.runs + 1):
        if a.runs > 1:
            print(f"\n--- run {run} of {a.runs}")
        passed = set()
        for f in files:
            skips = exc.get(f, {})
            if f not in exes:
                n = len(TEST_ATTR.findall(Path(sources[f]).read_text())) if f in sources else 0
                first = next((e.splitlines()[0] for e in errors.get(f, [])), "no executable")
                print(f"{f}: COMPILE ERROR, its ~{n} tests not run: {first} (all errors: {logs / 'build.log'})")
                for i in range(n):
                    failed_any.add((f, f"<test {i + 1} of a file that did not compile>"))
                    total.add((f, f"<test {i + 1} of a file that did not compile>"))
                continue
            names, results, out, timed_out = run_binary(exes[f], pkg, skips, a.timeout)
            hung = []
            if timed_out:  # which tests hang: those left, all at once; then the rest again
                left = [n for n in names if n not in results and n not in skips]
                _, r, out2, _ = run_binary(exes[f], pkg, [], a.timeout, only=left, threads=len(left))
                hung = [n for n in left if n not in r]
                _, results, out3, _ = run_binary(exes[f], pkg, list(skips) + hung, a.timeout)
                out += f"\n=== which hang: {' '.join(left)}\n{out2}\n=== again without: {' '.join(hung)}\n{out3}"
            (logs / f"{f}.run{run}.log").write_text(out)
            for s in skips:
                if s not in names:
                    print(f"STALE EXCEPTION: {f}::{s} is not a test of {f}.rs")
                    bad = True
            counts = defaultdict(int)
            failures = []
            for n in names:
                total.add((f, n))
                r = results.get(n)
                if n in skips:
                    excepted.add((f, n))
                    counts["excepted"] += 1
                elif r == "ok" or r == "ignored":
                    passed.add((f, n))
                    counts["passed" if r == "ok" else "ignored"] += 1
                else:
                    failed_any.add((f, n))
                    counts["failed"] += 1
                    why = cause(out, n) if r == "FAILED" else (
                        f"hung: no result after {a.timeout} s" if n in hung else "no result: the binary crashed")
                    failures.append(f"    FAILED {f}::{n}: {why}")
            extra = f", {counts['ignored']} ignored" if counts["ignored"] else ""
            print(f"{f}: {counts['passed']} passed, {counts['failed']} failed, {counts['excepted']} excepted"
                  f"{extra} (of {len(names)})" + (f", {len(hung)} hung" if hung else ""))
            print("\n".join(failures)) if failures else None
        passed_all = passed if passed_all is None else passed_all & passed

    passed_all = (passed_all or set()) - failed_any
    print(f"\nlogs: {logs}")
    runs = f" in each of {a.runs} runs" if a.runs > 1 else ""
    print(f"{a.label}: {len(passed_all)} passed{runs}, {len(failed_any)} failed, "
          f"{len(excepted)} excepted (of {len(total)})")
    return 1 if bad or failed_any else 0


if __name__ == "__main__":
    sys.exit(main())
