#!/usr/bin/env bash
# Build and install witch, witchd and the agent library into a prefix.
#
#   ./install.sh                      # into /usr/local (as root)
#   ./install.sh --prefix ~/.local    # into your home
#
# Layout (PREFIX defaults to /usr/local):
#   PREFIX/bin/witch, PREFIX/bin/witchd        stripped
#   PREFIX/lib/witch/libwitch_agent.so         where witch and witchd look for the agent
#   PREFIX/lib/systemd/system/witchd.service   the daemon's unit (hardened)
#   PREFIX/share/man/man1/witch*.1, man8/witchd.8
#   PREFIX/share/bash-completion/completions/, zsh/site-functions/, fish/vendor_completions.d/
#   PREFIX/share/doc/witch/witchd.toml         an example configuration
#   PREFIX/share/doc/witch/README.md, docs/,   the README and the documents it links
#     kernel-patch/                            (the optional kernel patch, with its README)
#   SYSCONFDIR/witchd.toml                     only if absent (SYSCONFDIR: /etc for
#                                              the /usr and /usr/local prefixes, else PREFIX/etc)
# With --keep-debug the debug info is kept beside each file, in .debug/NAME.debug
# (linked by .gnu_debuglink, where gdb and witch look for it).
#
# Options: --prefix DIR, --destdir DIR (stage into DIR/PREFIX, for packaging),
# --sysconfdir DIR, --keep-debug, --no-build (install what is built already),
# --from DIR (where the built files are; default target/release).
#
# Why a script rather than `cargo install` or a `witch install` subcommand:
# `cargo install` installs binaries only, not the agent (a cdylib) or the unit,
# pages and completions; a subcommand of witch would need witch built first,
# and installing is the build plus copying files, which is what `install(1)`
# and `objcopy` are for. The pages and completions come from the binaries
# themselves (`witch man`, `witch completions`), so they match their options.
set -euo pipefail
cd "$(dirname "$0")"

prefix=/usr/local
destdir=
sysconfdir=
keep_debug=0
build=1
rel=${CARGO_TARGET_DIR:-target}/release
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=$2; shift 2 ;;
    --prefix=*) prefix=${1#*=}; shift ;;
    --destdir) destdir=$2; shift 2 ;;
    --destdir=*) destdir=${1#*=}; shift ;;
    --sysconfdir) sysconfdir=$2; shift 2 ;;
    --sysconfdir=*) sysconfdir=${1#*=}; shift ;;
    --keep-debug) keep_debug=1; shift ;;
    --no-build) build=0; shift ;;
    --from) rel=$2; shift 2 ;;
    --from=*) rel=${1#*=}; shift ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$prefix" in /*) ;; *) prefix=$PWD/$prefix ;; esac
if [ -z "$sysconfdir" ]; then
  case "$prefix" in /usr|/usr/local) sysconfdir=/etc ;; *) sysconfdir=$prefix/etc ;; esac
fi
for tool in install objcopy; do
  command -v $tool >/dev/null || { echo "install.sh: $tool is missing (apt-get install binutils coreutils)" >&2; exit 2; }
done

if [ $build = 1 ]; then
  if ! command -v cargo >/dev/null; then
    echo "install.sh: cargo is not on PATH: install Rust (rustup, or apt-get install cargo), or build as the user who has it (\`cargo build --release --workspace\`) and install that with \`./install.sh --no-build\`" >&2
    exit 2
  fi
  cargo build --release -p witchd -p witch-agent
fi
for f in witch witchd libwitch_agent.so; do
  [ -f "$rel/$f" ] || { echo "install.sh: $rel/$f is missing: build with \`cargo build --release --workspace\` (or drop --no-build)" >&2; exit 2; }
done

root=$destdir$prefix
# put SRC DEST MODE STRIP: install a stripped copy, and with --keep-debug its
# debug info in .debug/ beside it.
put() {
  local src=$1 dest=$2 mode=$3 how=$4 tmp
  install -d "$(dirname "$dest")"
  tmp=$(mktemp "$(dirname "$dest")/.install.XXXXXX")
  if [ $keep_debug = 1 ]; then
    local dbg; dbg=$(dirname "$dest")/.debug/$(basename "$dest").debug
    install -d "$(dirname "$dbg")"
    objcopy --only-keep-debug --compress-debug-sections "$src" "$dbg"
    chmod 0644 "$dbg"
    objcopy "$how" --add-gnu-debuglink="$dbg" "$src" "$tmp"
  else
    objcopy "$how" "$src" "$tmp"
  fi
  chmod "$mode" "$tmp"
  mv -f "$tmp" "$dest"
}
put "$rel/witch" "$root/bin/witch" 0755 --strip-all
put "$rel/witchd" "$root/bin/witchd" 0755 --strip-all
# The agent keeps its dynamic symbols (witch_session_attach is looked up by name).
put "$rel/libwitch_agent.so" "$root/lib/witch/libwitch_agent.so" 0644 --strip-unneeded

witch=$root/bin/witch
install -d "$root/share/man/man1" "$root/share/man/man8"
gen=$(mktemp -d)
trap 'rm -rf "$gen"' EXIT
"$witch" man "$gen" 2>/dev/null
install -m 0644 "$gen"/*.1 "$root/share/man/man1/"
install -m 0644 "$gen"/*.8 "$root/share/man/man8/"
install -d "$root/share/bash-completion/completions" "$root/share/zsh/site-functions" "$root/share/fish/vendor_completions.d"
for b in witch witchd; do
  "$witch" completions bash $b > "$root/share/bash-completion/completions/$b"
  "$witch" completions zsh $b > "$root/share/zsh/site-functions/_$b"
  "$witch" completions fish $b > "$root/share/fish/vendor_completions.d/$b.fish"
done

install -d "$root/lib/systemd/system" "$root/share/doc/witch/docs"
# systemd finds the unit, and man the pages it names, only under /usr and
# /usr/local; elsewhere the unit names its documents by file.
case "$prefix" in
  /usr|/usr/local) documentation="man:witchd(8) man:witch(1)" ;;
  *) documentation="file:$prefix/share/man/man8/witchd.8 file:$prefix/share/doc/witch/README.md" ;;
esac
sed -e "s|@BINDIR@|$prefix/bin|g" -e "s|@SYSCONFDIR@|$sysconfdir|g" -e "s|@DOCUMENTATION@|$documentation|g" \
  dist/witchd.service > "$root/lib/systemd/system/witchd.service"
chmod 0644 "$root/lib/systemd/system/witchd.service"
install -m 0644 dist/witchd.toml README.md "$root/share/doc/witch/"
install -m 0644 docs/*.md "$root/share/doc/witch/docs/"
install -d "$root/share/doc/witch/kernel-patch/patches"
install -m 0644 kernel-patch/README.md "$root/share/doc/witch/kernel-patch/"
install -m 0644 kernel-patch/patches/* "$root/share/doc/witch/kernel-patch/patches/"
if [ ! -e "$destdir$sysconfdir/witchd.toml" ]; then
  install -D -m 0644 dist/witchd.toml "$destdir$sysconfdir/witchd.toml"
fi

echo "installed witch, witchd and the agent into $root"
echo "  try: $prefix/bin/witch doctor"
# The daemon: through systemd only where it looks for units (and runs).
if [ -z "$destdir" ]; then
  case "$prefix" in
    /usr|/usr/local)
      if [ -d /run/systemd/system ]; then
        echo "  daemon: edit $sysconfdir/witchd.toml, then systemctl daemon-reload && systemctl enable --now witchd"
      else
        echo "  daemon: edit $sysconfdir/witchd.toml, then run $prefix/bin/witchd --config $sysconfdir/witchd.toml (systemd is not running here)"
      fi ;;
    *)
      echo "  daemon: edit $sysconfdir/witchd.toml, then run $prefix/bin/witchd --config $sysconfdir/witchd.toml (systemd does not look for units under $prefix; root may add it with systemctl link $prefix/lib/systemd/system/witchd.service)" ;;
  esac
fi
