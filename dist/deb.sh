#!/usr/bin/env bash
# Build the Debian package of witch with cargo-deb (`cargo install cargo-deb`):
#
#   dist/deb.sh              # builds the workspace, then target/debian/witch_VERSION-1_amd64.deb
#   dist/deb.sh --no-build   # packages what target/release holds already
#   dist/deb.sh --fast       # faster compression, a larger package (the tests use it)
#
# The package metadata is in witchd/Cargo.toml ([package.metadata.deb]); this
# script writes what the package holds besides the build (manual pages,
# completions, the systemd unit for /usr) into target/release/deb/, which the
# metadata lists, then runs cargo-deb. It prints the package's path last.
set -euo pipefail
cd "$(dirname "$0")/.."

build=1
fast=()
for a in "$@"; do
  case "$a" in
    --no-build) build=0 ;;
    --fast) fast=(--fast) ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "deb.sh: unknown option $a (see --help)" >&2; exit 2 ;;
  esac
done
command -v cargo >/dev/null || { echo "deb.sh: cargo is not on PATH: install Rust (rustup, or apt-get install cargo)" >&2; exit 2; }
cargo deb --version >/dev/null 2>&1 || { echo "deb.sh: cargo-deb is missing: cargo install cargo-deb" >&2; exit 2; }

target=${CARGO_TARGET_DIR:-target}
rel=$target/release
if [ $build = 1 ]; then
  cargo build --release -p witchd -p witch-agent
fi
for f in witch witchd libwitch_agent.so; do
  [ -f "$rel/$f" ] || { echo "deb.sh: $rel/$f is missing: build with \`cargo build --release --workspace\` (or drop --no-build)" >&2; exit 2; }
done

out=$rel/deb
rm -rf "$out"
mkdir -p "$out/man" "$out/completions"
"$rel/witch" man "$out/man" 2>/dev/null
for b in witch witchd; do
  "$rel/witch" completions bash $b > "$out/completions/$b.bash"
  "$rel/witch" completions zsh $b > "$out/completions/_$b"
  "$rel/witch" completions fish $b > "$out/completions/$b.fish"
done
sed -e "s|@BINDIR@|/usr/bin|g" -e "s|@SYSCONFDIR@|/etc|g" -e "s|@DOCUMENTATION@|man:witchd(8) man:witch(1)|g" \
  dist/witchd.service > "$out/witchd.service"

cargo deb -p witchd --no-build --quiet "${fast[@]}" >/dev/null
ls -t "$target"/debian/witch_*.deb | head -1
