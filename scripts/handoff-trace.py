#!/usr/bin/env python3
"""Where a hand-off's time goes, from a semabench worker's execution trace.

    go run ./internal/bench/semabench -only utilisation -holds 2ms \
        -designs batchmr,bound-1rtt -processes 1 -goroutines 64 -repeat 1 \
        -trace /tmp/tr
    for f in /tmp/tr.*; do
        go tool trace -d=parsed "$f" | python3 scripts/handoff-trace.py
    done

semabench's workers mark "release" just before a holder releases and
"granted" when an Acquire returns. For each release whose grant went to a
goroutine of the same process (all of them with -processes 1), this pairs
the releasing goroutine's own state changes with the first goroutine it
readied and that goroutine's "granted" mark, and prints each phase's
distribution:

  release->park   from the mark until the releaser parks (it has sent its
                  request to Redis: client-side cost)
  parked          until the network poller makes it runnable again (the
                  round trip, as the process sees it)
  runnable        until it runs
  run->ready      until it readies the next holder (parsing, bookkeeping)
  ready->run      until the next holder runs
  run->granted    until the next holder's Acquire has returned

A release that does not wait for Redis (the bound-local design) has no
round trip to split: it reports no hand-offs.
"""
import bisect
import collections
import re
import statistics
import sys

EVENT = re.compile(r'^M=-?\d+ P=-?\d+ G=(-?\d+) (\w+) Time=(\d+) (.*)$')
STATE = re.compile(r'GoID=(\d+) (\w+)->(\w+)')
MARK = re.compile(r'Category="handoff" Message="(\w+)"')


def main():
    events = []  # (time, kind, g, detail)
    for line in sys.stdin:
        m = EVENT.match(line)
        if not m:
            continue
        g, kind, t, rest = int(m.group(1)), m.group(2), int(m.group(3)), m.group(4)
        if kind == 'Log':
            mm = MARK.search(rest)
            if mm:
                events.append((t, 'mark', g, mm.group(1)))
        elif kind == 'StateTransition':
            sm = STATE.search(rest)
            if sm:
                events.append((t, 'state', g, (int(sm.group(1)), sm.group(2), sm.group(3))))
    events.sort(key=lambda e: e[0])
    times = [e[0] for e in events]
    own = collections.defaultdict(list)    # goroutine -> its state changes
    marks = collections.defaultdict(list)  # goroutine -> its marks
    for e in events:
        if e[1] == 'state':
            own[e[3][0]].append(e)
        else:
            marks[e[2]].append(e)
    own_times = {g: [e[0] for e in v] for g, v in own.items()}

    phases = collections.OrderedDict((k, []) for k in (
        'release->park', 'parked', 'runnable', 'run->ready', 'ready->run', 'run->granted', 'TOTAL'))
    for t0, kind, r, what in events:
        if kind != 'mark' or what != 'release':
            continue
        # A release that gives its permit back on a goroutine of its own
        # (batchmr's Permit.Release): follow that goroutine.
        i0 = bisect.bisect_left(times, t0)
        for t, k, g, d in events[i0:i0 + 200]:
            if k == 'state' and g == r and d[0] == r and (d[1], d[2]) == ('Running', 'Waiting'):
                break
            if k == 'state' and g == r and (d[1], d[2]) == ('NotExist', 'Runnable'):
                r = d[0]
                break
        park = wake = run = None
        for t, _, _, (_, a, b) in own[r][bisect.bisect_left(own_times[r], t0):][:40]:
            if park is None and (a, b) == ('Running', 'Waiting'):
                park = t
            elif park is not None and wake is None and (a, b) == ('Waiting', 'Runnable'):
                wake = t
            elif wake is not None and (a, b) == ('Runnable', 'Running'):
                run = t
                break
        if run is None:
            continue
        # A releaser that readied someone before it parked got its reply
        # without waiting: not the shape this measures, and pairing its
        # later park would mix in an unrelated cycle.
        i0, i1 = bisect.bisect_left(times, t0), bisect.bisect_left(times, park)
        if any(k == 'state' and g == r and d[0] != r and (d[1], d[2]) == ('Waiting', 'Runnable')
               for _, k, g, d in events[i0:i1]):
            continue
        w = ready = None
        i = bisect.bisect_left(times, run)
        for t, k, g, d in events[i:i + 400]:
            if k == 'state' and g == r and d[0] != r and (d[1], d[2]) == ('Waiting', 'Runnable'):
                w, ready = d[0], t
                break
        if w is None:
            continue
        wrun = next((t for t, _, _, (_, a, b) in own[w] if t >= ready and (a, b) == ('Runnable', 'Running')), None)
        got = next((t for t, _, _, what in marks[w] if t >= ready and what == 'granted'), None)
        if wrun is None or got is None or got - t0 > 5_000_000:
            continue  # not a hand-off: the readied goroutine was not a new holder
        for k, v in zip(phases, (park - t0, wake - park, run - wake, ready - run, wrun - ready, got - wrun, got - t0)):
            phases[k].append(v)
    n = len(phases['TOTAL'])
    print(f'hand-offs: {n}')
    if not n:
        return
    for k, v in phases.items():
        v = sorted(v) or [0]
        q = lambda f: v[int(f * (len(v) - 1))] / 1000
        print(f'{k:14s} p10 {q(.1):7.1f}  p50 {q(.5):7.1f}  p90 {q(.9):7.1f}  mean {statistics.mean(v) / 1000:7.1f} µs')


if __name__ == '__main__':
    main()
