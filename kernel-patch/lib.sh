# Shared by boot-test.sh and check-patches.sh (sourced, not run).
#
# The kernel source the patches are made against: Debian's linux-source-6.12
# package at this version, upstream v6.12.117 with Debian's patches, served
# by bookworm-security (and, for other 6.12 builds, bookworm-backports).
LINUX_PKG=linux-source-6.12
LINUX_DEB_VERSION=6.12.117-1~deb12u1
LINUX_UPSTREAM=v6.12.117
LINUX_TARBALL=/usr/src/linux-source-6.12.tar.xz
LINUX_TOPDIR=linux-source-6.12

KP_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(dirname "$KP_DIR")
# Build trees live outside the repository, beside it unless told otherwise.
KBUILD_DIR=${KBUILD_DIR:-$(dirname "$REPO_DIR")/kbuild}

note() { printf '%s\n' "$*" >&2; }
die() { printf 'boot-test: %s\n' "$*" >&2; exit 2; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

# Debian 12 keeps newer builds (QEMU among them) in bookworm-backports, which
# a fresh machine does not list. Add it if this is bookworm and it is missing.
enable_backports() {
  . /etc/os-release
  [ "${VERSION_CODENAME:-}" = bookworm ] || return 0
  if grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    return 0
  fi
  note "apt: adding bookworm-backports"
  as_root tee /etc/apt/sources.list.d/bookworm-backports.sources >/dev/null <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  APT_UPDATED=
}

APT_UPDATED=
apt_update_once() {
  if [ -z "$APT_UPDATED" ]; then
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    APT_UPDATED=1
  fi
}

# apt_install PKG... : install what is not installed yet.
apt_install() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "${p%%=*}" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  apt_update_once
  note "apt: installing ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# The named kernel source; if the archive no longer has that version, the
# newest 6.12 it has (the patches are then checked to apply by git apply).
install_linux_source() {
  local have
  have=$(dpkg-query -W -f='${Version}' "$LINUX_PKG" 2>/dev/null || true)
  [ "$have" = "$LINUX_DEB_VERSION" ] && return 0
  enable_backports
  apt_update_once
  if apt-cache madison "$LINUX_PKG" | grep -qF " $LINUX_DEB_VERSION "; then
    apt_install "$LINUX_PKG=$LINUX_DEB_VERSION"
  elif [ -n "$have" ]; then
    note "warning: $LINUX_PKG $LINUX_DEB_VERSION is not in the archive; using the installed $have"
  else
    note "warning: $LINUX_PKG $LINUX_DEB_VERSION is not in the archive; installing the newest"
    apt_install "$LINUX_PKG"
  fi
}

installed_linux_version() {
  dpkg-query -W -f='${Version}' "$LINUX_PKG"
}

patches() {
  ls "$KP_DIR"/patches/*.patch
}

# The unpacked source as a git repository, $KBUILD_DIR/src (tag base): its
# work tree is the upstream build's source.
SRC=$KBUILD_DIR/src
git_src() { git -C "$SRC" -c core.quotepath=off -c gc.auto=0 "$@"; }
export GIT_AUTHOR_NAME=boot-test GIT_AUTHOR_EMAIL=boot-test@localhost
export GIT_COMMITTER_NAME=boot-test GIT_COMMITTER_EMAIL=boot-test@localhost

prepare_source() {   # prepare_source VERSION
  if [ "$(cat "$SRC/.git/witch-source" 2>/dev/null)" != "$1" ]; then
    note "unpacking $LINUX_TARBALL"
    rm -rf "$SRC" "$KBUILD_DIR/src-patched" "$KBUILD_DIR"/build-*
    mkdir -p "$SRC"
    tar -xf "$LINUX_TARBALL" -C "$SRC" --strip-components=1
    git_src init -q
    git_src add -f -A .          # Debian's .gitignore ignores the top level
    git_src commit -q -m "$LINUX_PKG $1"
    git_src tag base
    echo "$1" > "$SRC/.git/witch-source"
  fi
}

# Apply the series, in order, to a scratch index of the pristine source
# (nothing is checked out); sets SERIES_TREE to the result's tree.
apply_series() {
  local idx=$KBUILD_DIR/series.$$.index p
  rm -f "$idx"
  GIT_INDEX_FILE=$idx git_src read-tree base
  for p in $(patches); do
    GIT_INDEX_FILE=$idx git_src apply --cached "$p" ||
      die "$(basename "$p") does not apply to $LINUX_PKG $(cat "$SRC/.git/witch-source")"
  done
  SERIES_TREE=$(GIT_INDEX_FILE=$idx git_src write-tree)
  rm -f "$idx"
}
