#!/usr/bin/env python3
"""Self instruction counts (Ir) per function of a callgrind profile, and their difference.

usage:
  callgrind-functions.py PROFILE [--per N] [--top K] [--json]
      functions by self Ir (divided by N when --per is given), largest first
  callgrind-functions.py --diff OLD NEW [--per N] [--per-old N] [--top K] [--min X]
      functions whose self Ir changed, largest growth first (per connection with --per)
  callgrind-functions.py --summary PROFILE [--per N]
      JSON: total Ir; Ir outside glibc malloc's internals (`ir_steady`); calls into the
      allocator (malloc, calloc, realloc, free, posix_memalign); all divided by N

glibc malloc's internals (_int_malloc, _int_free, unlink_chunk, malloc_consolidate, …) cost
what the heap's layout makes them cost: the same run of allocations costs a few hundred
instructions more or less per connection depending on what earlier allocations left behind
(the warm-up, a once-a-second Date header). `ir_steady` leaves them out and `alloc_calls`
counts the calls instead, which do not depend on the layout.

Functions are named as callgrind names them (symbol, with the object file); a monomorphised
generic or a closure keeps its path. Costs of `calls=` lines (inclusive costs of callees) are
not counted as the caller's own.
"""
import argparse
import json
import re
import sys
from collections import Counter


ALLOC_INTERNALS = ("_int_malloc", "_int_free", "_int_realloc", "_int_memalign", "unlink_chunk",
                   "malloc_consolidate", "alloc_perturb", "sysmalloc", "systrim", "tcache_init",
                   "_int_free_merge_chunk", "_int_free_create_chunk", "_int_free_maybe_consolidate",
                   "_int_free_chunk", "free_perturb", "mremap_chunk", "munmap_chunk")
ALLOC_ENTRIES = ("malloc", "calloc", "realloc", "free", "posix_memalign", "aligned_alloc",
                 "memalign", "cfree")


def is_alloc_internal(name):
    return name.split(".")[0].split(" ")[0] in ALLOC_INTERNALS


def self_costs(path, calls=None):
    """Function name -> self Ir; `calls` (a Counter), if given, gets the call counts by callee."""
    names = {"fn": {}, "cfn": {}}
    costs = Counter()
    fn = None
    cfn = None
    skip_next = False
    name_re = re.compile(r"^\((\d+)\)(?: (.*))?$")

    def resolve(kind, value):
        m = name_re.match(value)
        if not m:
            return value
        ident, name = m.groups()
        table = names["fn"]  # fn and cfn share one id space
        if name is not None:
            table[ident] = name
        return table.get(ident, value)

    events = None
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            c = line[0]
            if c.isdigit() or c in "+-*":
                if skip_next:
                    skip_next = False
                    continue
                parts = line.split()
                if len(parts) >= 2 and fn is not None:
                    costs[fn] += int(parts[1])
                continue
            if line.startswith("fn="):
                fn = resolve("fn", line[3:])
            elif line.startswith("cfn="):
                cfn = resolve("cfn", line[4:])
            elif line.startswith("calls="):
                skip_next = True
                if calls is not None:
                    calls[cfn] += int(line[6:].split()[0])
            elif line.startswith("events:"):
                events = line.split()[1:]
    if events and events[0] != "Ir":
        sys.exit(f"{path}: first event is {events[0]}, not Ir")
    return costs


def short(name, width=110):
    return name if len(name) <= width else name[: width - 1] + "…"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("profiles", nargs="+")
    ap.add_argument("--diff", action="store_true")
    ap.add_argument("--summary", action="store_true")
    ap.add_argument("--per", type=float, default=1.0)
    ap.add_argument("--per-old", type=float)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--min", type=float, default=0.0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.summary:
        calls = Counter()
        costs = self_costs(a.profiles[0], calls)
        total = sum(costs.values())
        internals = sum(v for k, v in costs.items() if is_alloc_internal(k))
        allocs = sum(v for k, v in calls.items() if k.split(" ")[0] in ALLOC_ENTRIES)
        print(json.dumps({"ir": round(total / a.per, 1),
                          "ir_steady": round((total - internals) / a.per, 1),
                          "alloc_calls": round(allocs / a.per, 2)}))
        return
    if a.diff:
        old, new = (self_costs(p) for p in a.profiles[:2])
        per_old = a.per_old or a.per
        rows = []
        for k in set(old) | set(new):
            o, n = old.get(k, 0) / per_old, new.get(k, 0) / a.per
            if abs(n - o) >= a.min:
                rows.append((n - o, o, n, k))
        rows.sort(key=lambda r: -r[0])
        to = sum(old.values()) / per_old
        tn = sum(new.values()) / a.per
        print(f"{'old':>10} {'new':>10} {'change':>9}  function (self Ir{' per connection' if a.per != 1 else ''})")
        print(f"{to:10.1f} {tn:10.1f} {tn - to:+9.1f}  TOTAL")
        grown = [r for r in rows if r[0] > 0][: a.top]
        shrunk = sorted([r for r in rows if r[0] < 0])[: a.top]
        for d, o, n, k in grown + shrunk:
            print(f"{o:10.1f} {n:10.1f} {d:+9.1f}  {short(k)}")
        return
    costs = self_costs(a.profiles[0])
    top = costs.most_common(a.top)
    if a.json:
        print(json.dumps({k: round(v / a.per, 1) for k, v in top}, indent=1))
        return
    total = sum(costs.values())
    print(f"{total / a.per:10.1f}  TOTAL")
    for k, v in top:
        print(f"{v / a.per:10.1f}  {short(k)}")


if __name__ == "__main__":
    main()
