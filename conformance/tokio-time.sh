#!/usr/bin/env bash
# tokio's own published time tests, switched to sharded_timer::time, against this crate.
#
#   conformance/tokio-time.sh [--runs N]
#
# (`--start-paused-attributes`, a diagnostic, also changes the `start_paused` attributes
# to `#[sharded_timer::test(..)]`/`main`, in target/conformance/tokio-time-attributes/.)
#
# 1. The tokio version the root package locks (Cargo.lock), its source from the cargo
#    registry (`cargo fetch`; CARGO_HOME defaults to ~/.cargo).
# 2. A scratch package, target/conformance/tokio-time/ (its own [workspace], never a
#    member; nothing is copied into the repository): tests/ are tokio's
#    tests/time_*.rs and tests/rt_time_start_paused.rs with the support files they
#    include, switched by conformance/switch.py (the user's mechanical change). Every
#    cargo feature their cfgs name is a default feature of the scratch package, and
#    they build with `--cfg tokio_unstable` (time_alt.rs needs it; in the other files it
#    adds tokio's alternative-timer runtimes to their runtime lists), so no test is
#    compiled out. Left out: time_wasm.rs (wasm32 only).
# 3. Every test file runs with libtest's parallel harness, skipping the tests listed in
#    conformance/tokio-exceptions.txt (conformance/harness.py). Exit 1 if a test that is
#    not excepted fails, or if an exception names a test that no longer exists.
#
# Builds into $CARGO_TARGET_DIR (default target/conformance). Needs the crates.io
# registry the first time (tokio-test, futures-test, ... are not in Cargo.lock).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
HERE=$ROOT/conformance
RUNS=1
ATTRS=  # --start-paused-attributes: a diagnostic, not the conformance step (below)
while [ $# -gt 0 ]; do
    case $1 in
        --runs) RUNS=$2; shift 2 ;;
        --runs=*) RUNS=${1#--runs=}; shift ;;
        --start-paused-attributes) ATTRS=1; shift ;;
        *) echo "usage: $0 [--runs N] [--start-paused-attributes]" >&2; exit 2 ;;
    esac
done
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target/conformance}
CARGO_HOME=${CARGO_HOME:-$HOME/.cargo}
PKG=$ROOT/target/conformance/tokio-time${ATTRS:+-attributes}

# The tokio the root package depends on (Cargo.lock may hold several).
VER=$(python3 - "$ROOT" <<'EOF'
import sys, tomllib
root = sys.argv[1]
name = tomllib.load(open(f"{root}/Cargo.toml", "rb"))["package"]["name"]
pkgs = tomllib.load(open(f"{root}/Cargo.lock", "rb"))["package"]
me = next(p for p in pkgs if p["name"] == name and "source" not in p)
dep = next(d for d in me.get("dependencies", []) if d.split()[0] == "tokio").split()
print(dep[1] if len(dep) > 1 else next(p["version"] for p in pkgs if p["name"] == "tokio"))
EOF
)
echo "tokio $VER (the version $ROOT/Cargo.lock gives the root package)"
(cd "$ROOT" && cargo fetch -q)
SRC=$(ls -d "$CARGO_HOME"/registry/src/*/"tokio-$VER" 2>/dev/null | head -n1)
[ -n "$SRC" ] || { echo "tokio-$VER not found under $CARGO_HOME/registry/src" >&2; exit 1; }
echo "tokio's tests from $SRC/tests"

# The scratch package: tests/, the support files they include, Cargo.toml, Cargo.lock.
rm -rf "$PKG/tests" "$PKG/src"
mkdir -p "$PKG/tests" "$PKG/src"
: > "$PKG/src/lib.rs"
for f in "$SRC"/tests/time_*.rs "$SRC"/tests/rt_time_start_paused.rs; do
    case $(basename "$f") in time_wasm.rs) continue ;; esac  # wasm32 only
    cp "$f" "$PKG/tests/"
done
python3 - "$SRC" "$PKG" <<'EOF'
# `mod support { pub mod panic; }` and `#[path = "support/x.rs"]` in the copied tests.
import re, shutil, sys
from pathlib import Path
src, pkg = Path(sys.argv[1]), Path(sys.argv[2])
for t in (pkg / "tests").glob("*.rs"):
    text = t.read_text()
    wanted = re.findall(r'#\[path\s*=\s*"(support/[\w/]+\.rs)"\]', text)
    for block in re.findall(r"mod support\s*\{([^}]*)\}", text):
        wanted += [f"support/{m}.rs" for m in re.findall(r"mod\s+(\w+)\s*;", block)]
    for rel in wanted:
        (pkg / "tests" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src / "tests" / rel, pkg / "tests" / rel)
EOF
python3 "$HERE/switch.py" "$PKG/tests"
if [ -n "$ATTRS" ]; then
    # Diagnostic: also `#[tokio::test(start_paused = true)]` -> `#[sharded_timer::test(..)]`
    # (and `main`), which tells a failure of following tokio's paused clock from others.
    sed -i -E 's/#\[tokio::(test|main)(\([^]]*start_paused[^]]*\))\]/#[sharded_timer::\1\2]/' "$PKG"/tests/*.rs
fi
cp "$ROOT/Cargo.lock" "$PKG/Cargo.lock"
python3 - "$SRC" "$PKG" "$ROOT" "$VER" > "$PKG/Cargo.toml" <<'EOF'
# Dev-dependencies: the crates the tests use, at the versions tokio's Cargo.toml asks.
import re, sys, tomllib
from pathlib import Path
src, pkg, root, ver = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
manifest = tomllib.load(open(src / "Cargo.toml", "rb"))
deps = dict(manifest.get("dev-dependencies", {}))
for cfg, t in manifest.get("target", {}).items():  # only those the tests name are kept
    deps.update({n: d for n, d in t.get("dev-dependencies", {}).items() if n not in deps})
text = "".join(p.read_text() for p in (pkg / "tests").rglob("*.rs"))
used = {n for n in deps if re.search(rf"\b{n.replace('-', '_')}::", text)}
features = sorted(set(re.findall(r'feature\s*=\s*"([\w-]+)"', text)))
def spec(d):
    d = d if isinstance(d, dict) else {"version": d}
    return "{ " + ", ".join(f"{k} = {tomllib_value(v)}" for k, v in d.items()) + " }"
def tomllib_value(v):
    return "[" + ", ".join(f'"{x}"' for x in v) + "]" if isinstance(v, list) else (str(v).lower() if isinstance(v, bool) else f'"{v}"')
print(f"""# Written by conformance/tokio-time.sh: tokio {ver}'s time tests, switched.
[package]
name = "tokio-time-conformance"
version = "0.0.0"
edition = "2021"
publish = false

[workspace]

[lib]
test = false
doctest = false

# The features tokio's tests gate themselves on: all on, so none is compiled out.
[features]
default = [{", ".join(f'"{f}"' for f in features)}]
""" + "".join(f'{f} = []\n' for f in features) + f"""
[dev-dependencies]
sharded-timer = {{ path = "{root}", features = ["tokio"] }}
tokio = {{ version = "={ver}", features = ["full", "test-util"] }}
""" + "".join(f"{n} = {spec(deps[n])}\n" for n in sorted(used)) + """
[lints.rust]
unexpected_cfgs = { level = "allow" }
""")
EOF
echo "scratch package: $PKG ($(ls "$PKG"/tests/*.rs | wc -l) test files)"

cd "$PKG"
export RUSTFLAGS="${RUSTFLAGS:-} --cfg tokio_unstable"
exec python3 "$HERE/harness.py" --pkg "$PKG" --exceptions "$HERE/tokio-exceptions.txt" \
    --runs "$RUNS" --label "tokio time conformance"
