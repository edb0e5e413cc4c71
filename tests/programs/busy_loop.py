"""A busy interpreter for the attach soak: rounds of list stores (each
round overwrites the whole list before reading it back) folded into a
checksum, checking between rounds (without blocking) whether stdin has
closed.  It then prints the rounds and the checksum, which depend only on
the number of rounds: an unprofiled run with that many rounds prints the
same.

Usage: python3 busy_loop.py ROUNDS   (0: run until stdin closes); exits 6.
"""
import os
import select
import sys

N = 4096


def stdin_closed():
    ready, _, _ = select.select([0], [], [], 0)
    return bool(ready) and os.read(0, 64) == b""


def main():
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    a = [0] * N
    total = 0
    rounds = 0
    while (rounds < limit) if limit else not stdin_closed():
        for i in range(N):
            a[i] = i + rounds
        for i in range(N):
            a[i] = (i * 7 + rounds) & 0xFFFF
        s = 0
        for v in a:
            s = (s * 31 + v) & 0xFFFFFFFFFFFF
        total = (total * 1000003 + s) & 0xFFFFFFFFFFFFFFFF
        rounds += 1
    print(f"rounds {rounds} checksum {total}", flush=True)
    sys.exit(6)


main()
