#!/usr/bin/env python3
"""Switch Rust sources from `tokio::time` to `sharded_timer::time`, in place.

    python3 conformance/switch.py src tests README.md ...

Arguments are files or directories (every `*.rs` and `*.md` under a directory).
This is the import change README.md's "Coming from `tokio::time`" describes:

* every path `tokio::time...` becomes `sharded_timer::time...` (code, comments and
  doc examples alike: `use tokio::time::{self, Duration};`, `tokio::time::sleep(d)`);
* a grouped import that names `time` is split:
  `use tokio::{sync::oneshot, time::{Duration, Instant}};` becomes
  `use tokio::{sync::oneshot};` and `use sharded_timer::time::{Duration, Instant};`
  on the next line (inside `///` and `//!` doc comments too);
* nothing else: `#[tokio::test(..)]`, `#[tokio::main]`, `tokio::runtime`,
  `tokio::sync`, `tokio::spawn`, `tokio::pin!`, `tokio::task`, ... are kept.

Not handled: a grouped import inside `/** */` or `#[doc = ".."]`, and an attribute
on a grouped import (the split-off line does not get it). The dependency itself
(`sharded-timer = { version = .., features = ["tokio"] }`) is added by hand.
"""
import re
import sys
from pathlib import Path

# `tokio::time` as a path of its own: not `foo::tokio::time`, not `tokio::time_x`.
PLAIN = re.compile(r"(?<![\w:])(::)?tokio::time\b")
# The start of a grouped import from tokio: `use tokio::{`, `pub(crate) use ::tokio::{`.
GROUP = re.compile(r"(?<![\w:])((?:pub(?:\([^)]*\))?\s+)?use\s+)(?:::)?tokio\s*::\s*\{")
DOC_LINE = re.compile(r"^([ \t]*(?:///|//!))(.*)$")
TIME_ITEM = re.compile(r"^time\b(?!\s*!)")


def split_top(items):
    """Splits the inside of `{...}` at its top-level commas."""
    parts, depth, cur = [], 0, ""
    for ch in items:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [" ".join(p.split()) for p in parts if p.strip()]


def split_groups(text):
    """Moves the `time` items of every `use tokio::{..};` into a `use sharded_timer::..;`."""
    out, pos = [], 0
    while True:
        m = GROUP.search(text, pos)
        if not m:
            out.append(text[pos:])
            return "".join(out)
        # Find the `}` that closes the group, then the `;`.
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        semi = text.find(";", i)
        if depth or semi < 0 or text[i:semi].strip():
            out.append(text[pos : m.end()])  # not a use statement we understand
            pos = m.end()
            continue
        items = split_top(text[m.end() : i - 1])
        moved = [it for it in items if TIME_ITEM.match(it)]
        if not moved:
            out.append(text[pos : semi + 1])
            pos = semi + 1
            continue
        kept = [it for it in items if not TIME_ITEM.match(it)]
        use = re.sub(r"use\s+$", "use ", m.group(1))  # `use ` or `pub(crate) use `
        line_start = text.rfind("\n", 0, m.start()) + 1
        before = text[line_start : m.start()]
        sep = "\n" + before if not before.strip() else " "  # next line, same indent
        new = use + "sharded_timer::" + (moved[0] if len(moved) == 1 else "{" + ", ".join(moved) + "}") + ";"
        if kept:
            new = use + "tokio::{" + ", ".join(kept) + "};" + sep + new
        out.append(text[pos : m.start()] + new)
        pos = semi + 1


def split_doc_groups(text):
    """`split_groups` inside runs of `///` or `//!` lines with the same prefix."""
    lines = text.split("\n")
    out, i = [], 0
    while i < len(lines):
        m = DOC_LINE.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        prefix, body = m.group(1), []
        while i < len(lines) and lines[i].startswith(prefix) and DOC_LINE.match(lines[i]):
            body.append(lines[i][len(prefix) :])
            i += 1
        out.extend(prefix + line for line in split_groups("\n".join(body)).split("\n"))
    return "\n".join(out)


def switch(text):
    """The switched text of one source file."""
    text = split_doc_groups(text)
    text = split_groups(text)
    return PLAIN.sub(lambda m: (m.group(1) or "") + "sharded_timer::time", text)


def files(args):
    for arg in args:
        p = Path(arg)
        if p.is_dir():
            yield from sorted(q for q in p.rglob("*") if q.suffix in (".rs", ".md") and q.is_file())
        else:
            yield p


def main(args):
    if not args:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    changed = 0
    for path in files(args):
        old = path.read_text(encoding="utf-8")
        new = switch(old)
        if new != old:
            path.write_text(new, encoding="utf-8")
            changed += 1
    print(f"switch.py: {changed} file(s) switched to sharded_timer::time", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
