#!/usr/bin/env bash
# The cheap checks of the kernel patches, for CI (about two minutes on a fresh
# machine, most of it unpacking the source):
#   - each patch is a format-patch mail with a Signed-off-by,
#   - the series applies, in order, to the named linux-source-6.12,
#   - scripts/checkpatch.pl --strict finds nothing,
#   - the selftest builds and passes on the running (upstream) kernel, which
#     shows that what it expects of every kernel is what upstream does,
#   - the re-arm benchmark builds.
# Prints "N passed, N failed" and exits non-zero on any failure.
# Environment: KBUILD_DIR, as for boot-test.sh.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

main() {
  enable_backports
  apt_install git gcc libc6-dev xz-utils perl python3 python3-ply python3-git
  install_linux_source
  local version passed=0 failed=0 p out f
  version=$(installed_linux_version)
  mkdir -p "$KBUILD_DIR"
  KBUILD_DIR=$(cd "$KBUILD_DIR" && pwd)
  SRC=$KBUILD_DIR/src
  prepare_source "$version"
  result() {   # result PASS|FAIL NAME DETAIL
    printf '%-4s %-26s %s\n' "$1" "$2" "$3"
    if [ "$1" = PASS ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
  }

  for p in $(patches); do
    if grep -q '^From [0-9a-f]\{40\} ' "$p" && grep -q '^Subject: \[PATCH' "$p" &&
       grep -q '^Signed-off-by: ' "$p"; then
      result PASS "format $(basename "$p" | cut -c1-4)" "format-patch mail, signed off"
    else
      result FAIL "format $(basename "$p" | cut -c1-4)" "not a format-patch mail with Signed-off-by"
    fi
  done

  if (apply_series) > /dev/null 2>&1; then
    apply_series
    result PASS "apply" "$(patches | wc -l) patches apply to $LINUX_PKG $version"
  else
    result FAIL "apply" "$( (apply_series) 2>&1 | tail -1)"
    echo "$passed passed, $failed failed"
    exit 1
  fi

  # checkpatch runs from the source tree (a git tree, for its SPDX check),
  # with Debian's python3, which has the modules that check needs.
  for p in $(patches); do
    out=$(cd "$SRC" && PATH=/usr/bin:$PATH perl scripts/checkpatch.pl --strict --quiet "$p" 2>&1 || true)
    if [ -z "$out" ]; then
      result PASS "checkpatch $(basename "$p" | cut -c1-4)" "--strict: clean"
    else
      result FAIL "checkpatch $(basename "$p" | cut -c1-4)" "$(echo "$out" | grep -m1 -E 'ERROR|WARNING|CHECK' || echo "$out" | head -1)"
      echo "$out" | sed 's/^/    /'
    fi
  done

  tmp=$(mktemp -d "${TMPDIR:-/tmp}/witch-kpatch.$$.XXXX")
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/selftests/perf_events"
  for f in kselftest.h kselftest_harness.h; do
    git_src cat-file -p "$SERIES_TREE:tools/testing/selftests/$f" > "$tmp/selftests/$f"
  done
  git_src cat-file -p "$SERIES_TREE:tools/testing/selftests/perf_events/breakpoint_modify.c" \
    > "$tmp/selftests/perf_events/breakpoint_modify.c"
  if gcc -O2 -Wall -Werror -Wl,-no-as-needed -o "$tmp/breakpoint_modify" \
       "$tmp/selftests/perf_events/breakpoint_modify.c" -lpthread 2> "$tmp/cc.log"; then
    if "$tmp/breakpoint_modify" > "$tmp/selftest.tap" 2>&1; then
      result PASS "selftest (running kernel)" "$(uname -r): $(grep '^# Totals' "$tmp/selftest.tap" | sed 's/^# //')"
    else
      result FAIL "selftest (running kernel)" "$(uname -r): $(grep -m3 '^not ok' "$tmp/selftest.tap" | tr '\n' ' ')"
      sed 's/^/    /' "$tmp/selftest.tap"
    fi
  else
    result FAIL "selftest build" "$(head -3 "$tmp/cc.log")"
  fi

  if gcc -O2 -Wall -Werror -o "$tmp/rearm_bench" "$KP_DIR/guest/rearm_bench.c" 2> "$tmp/cc.log"; then
    result PASS "rearm_bench build" "builds"
  else
    result FAIL "rearm_bench build" "$(head -3 "$tmp/cc.log")"
  fi

  echo "$passed passed, $failed failed"
  [ "$failed" = 0 ]
}

main "$@"
