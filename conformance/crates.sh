#!/usr/bin/env bash
# Published crates that use tokio::time, switched to sharded_timer::time, against this
# crate: their own test suites (unit, integration and doc tests) as crates.io ships them.
#
#   conformance/crates.sh [--runs N] [--tokio] [NAME@VERSION ...]
#
# Default crates (one run of all six on a fresh target directory, 2 cores: about 2 min):
# - leaky-bucket@1.1.2: a tokio::time::Sleep in its acquire future, every test and
#   doctest start_paused;
# - tower@0.5.3 --all-features: sleeps in its timeout, rate-limit, hedge and retry
#   layers; time::pause() in plain #[tokio::test]s;
# - tokio-stream@0.1.19 --features full: Sleep, sleep_until, Instant and Interval in
#   its timeout, timeout_repeating, throttle and chunks_timeout adapters and its
#   IntervalStream; tests with pause/advance and start_paused, doctests with
#   #[tokio::main(start_paused = true)];
# - bb8@0.9.1: interval_at, sleep and timeout in its pool (reaper, connection and
#   get timeouts), tests on the real clock;
# - tokio-retry2@0.9.1: a Sleep from sleep_until in its retry future, Duration in its
#   strategies;
# - tryhard@0.5.2: a Sleep in its retry future; its retry hooks count on
#   `sleep(Duration::ZERO).await` yielding to the tasks already woken, as tokio's does
#   on the system clock (it found that ours completed at once: fixed).
#
# For each: its source from the registry (`cargo fetch`), copied to
# target/conformance/crates/NAME-VERSION/ (its own [workspace]; the repository's
# Cargo.lock first), switched by switch.py (src/, tests/, benches/, examples/, *.md:
# the user's change) plus the dependency `sharded-timer = { path, features = ["tokio"] }`;
# then harness.py runs every test binary, and `cargo test --doc` the doc tests (once).
# `--tokio` runs the unswitched crate instead (the baseline; no exceptions). Exit 1 if
# a test that is not excepted fails, or an exception of a crate run names no test.
#
# Exceptions: conformance/crates-exceptions.txt, `NAME::FILE::TEST  # reason` a line
# (FILE::TEST as in tokio-exceptions.txt; FILE `doc` for a doc test, TEST a part of
# its name without spaces that no other doc test's name contains).
#
# Builds into $CARGO_TARGET_DIR/crates (default target/conformance/crates), with
# RUSTFLAGS "-A dangerous_implicit_autorefs" (leaky-bucket 1.1.2 needs it on Rust 1.95).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
HERE=$ROOT/conformance
RUNS=1 TOKIO= CRATES=()
while [ $# -gt 0 ]; do
    case $1 in
        --runs) RUNS=$2; shift 2 ;;
        --tokio) TOKIO=1; shift ;;
        -*) echo "usage: $0 [--runs N] [--tokio] [NAME@VERSION ...]" >&2; exit 2 ;;
        *) CRATES+=("$1"); shift ;;
    esac
done
[ ${#CRATES[@]} -gt 0 ] || CRATES=(leaky-bucket@1.1.2 tower@0.5.3 tokio-stream@0.1.19 bb8@0.9.1 tokio-retry2@0.9.1 tryhard@0.5.2)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target/conformance}/crates
export RUSTFLAGS="${RUSTFLAGS:-} -A dangerous_implicit_autorefs"
CARGO_HOME=${CARGO_HOME:-$HOME/.cargo}
BASE=$ROOT/target/conformance/crates
EXCEPTIONS=$HERE/crates-exceptions.txt
cargo_args() {  # the features each crate's suite needs
    case $1 in
        tower) echo "--all-features" ;;
        tokio-stream) echo "--features full" ;;  # its tests' cfgs name time, sync, io-util, rt
        *) echo "" ;;
    esac
}

status=0
for spec in "${CRATES[@]}"; do
    name=${spec%@*} ver=${spec#*@}
    echo "=== $name $ver${TOKIO:+ (unswitched, on tokio::time)}"
    start=$SECONDS
    # Fetch the published package through a throwaway manifest.
    fetch=$BASE/fetch-$name-$ver
    mkdir -p "$fetch/src"
    : > "$fetch/src/lib.rs"
    printf '[package]\nname = "fetch"\nversion = "0.0.0"\nedition = "2021"\n[workspace]\n[dependencies]\n%s = "=%s"\n' \
        "$name" "$ver" > "$fetch/Cargo.toml"
    (cd "$fetch" && cargo fetch -q)
    src=$(ls -d "$CARGO_HOME"/registry/src/*/"$name-$ver" | head -n1)

    pkg=$BASE/$name-$ver${TOKIO:+-tokio}
    rm -rf "$pkg"
    cp -r "$src" "$pkg"
    chmod -R u+w "$pkg"
    cp "$ROOT/Cargo.lock" "$pkg/Cargo.lock"
    if [ -z "$TOKIO" ]; then
        dirs=()
        for d in src tests benches examples; do [ -d "$pkg/$d" ] && dirs+=("$pkg/$d"); done
        for f in "$pkg"/*.md; do [ -f "$f" ] && dirs+=("$f"); done
        python3 "$HERE/switch.py" "${dirs[@]}"
        printf '\n[dependencies.sharded-timer]\npath = "%s"\nfeatures = ["tokio"]\n' "$ROOT" >> "$pkg/Cargo.toml"
    fi
    grep -q '^\[workspace\]' "$pkg/Cargo.toml" || printf '\n[workspace]\n' >> "$pkg/Cargo.toml"

    # This crate's exceptions (switched runs only), `NAME::` stripped: FILE::TEST lines
    # for harness.py, and the doc tests' names apart.
    mkdir -p "$pkg/logs"
    exc=$pkg/logs/exceptions.txt doc_skips=()
    : > "$exc"
    if [ -z "$TOKIO" ] && [ -f "$EXCEPTIONS" ]; then
        sed -n "s/^[[:space:]]*$name:://p" "$EXCEPTIONS" | sed 's/[[:space:]]*#.*$//' > "$exc"
        while IFS= read -r t; do doc_skips+=(--skip "$t"); done < <(sed -n 's/^doc:://p' "$exc")
        sed -i '/^doc::/d' "$exc"
    fi

    args=$(cargo_args "$name")
    (cd "$pkg" && python3 "$HERE/harness.py" --pkg "$pkg" --exceptions "$exc" \
        --runs "$RUNS" --cargo-args="$args" --label "$name $ver${TOKIO:+ on tokio}") || status=1
    # Doc tests: their own `cargo test --doc`, once, each excepted one `--skip`ped: by
    # a part of its name (rustdoc splits test arguments at spaces, and a doc test's
    # name has some), so the run must skip as many doc tests as there are exceptions.
    if (cd "$pkg" && cargo test -q --doc $args -- ${doc_skips[@]+"${doc_skips[@]}"} \
            > "$pkg/logs/doc.log" 2>&1); then r=ok; else r=FAILED; status=1; fi
    result=$(grep -h '^test result' "$pkg/logs/doc.log" | tail -n1 || true)
    echo "$name $ver doc tests: $r, $result"
    skipped=$(grep -o '[0-9]* filtered out' <<< "$result" | cut -d' ' -f1 || true)
    if [ -n "$skipped" ] && [ "$skipped" != $((${#doc_skips[@]} / 2)) ]; then
        echo "STALE EXCEPTION: $name's $((${#doc_skips[@]} / 2)) doc test exception(s) skipped $skipped doc test(s):" \
            "each must name exactly one"
        status=1
    fi
    echo "$name $ver: $((SECONDS - start)) s"
done
exit $status
