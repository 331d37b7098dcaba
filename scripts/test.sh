#!/usr/bin/env bash
# The README's test command (`make test`): the three tiers in turn, cheapest first, each timed
# (tests/tiers.py says what each holds). Extra arguments go to every pytest call, e.g.
# `scripts/test.sh -k leak`. The end-to-end tier waits mostly on its subprocesses' clocks, so it
# runs on SOAKD_TEST_JOBS workers (two per core, at most 8; 1 turns xdist off), each test module
# on one worker so a module's shared server starts once. On this 2-core machine the tier (without
# test_readme) took 348 s on 3 workers and 310 s on 4, the same 535 s of CPU: a fourth worker
# fills the cores while the others wait on their subprocesses' clocks. The integration tier waits
# on its sockets and short clocks (11 s of CPU in 38 s), so it runs on up to 3 workers, test by
# test: 38 -> 20 s (each worker's collection costs about 7 s of CPU, so a fourth costs more than it
# gives). The unit tier is all CPU, so it runs on one worker per core (at most 4).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${VENV:-.venv}/bin/python
cores=$(nproc)
JOBS=${SOAKD_TEST_JOBS:-$(( cores * 2 < 8 ? cores * 2 : 8 ))}
UNIT_JOBS=$(( cores < 4 ? cores : 4 ))
TIMING_JOBS=$(( cores < 2 ? 1 : 2 ))
INTEGRATION_JOBS=$(( JOBS < 3 ? JOBS : 3 ))
[ "$JOBS" -gt 1 ] || { UNIT_JOBS=1; TIMING_JOBS=1; }
# Every pytest call (and every xdist worker) imports all of tests/ to collect it, rewriting each
# module's asserts; with bytecode writing off (PYTHONDONTWRITEBYTECODE) it does that work again in
# each of the seven collections instead of reading the first one's cached modules.
unset PYTHONDONTWRITEBYTECODE
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
status=0
# e2e runs in two parts: in parallel, then its timing tests (bounds in wall-clock figures) on at
# most one worker per core (two here), so no other tier's CPU moves their figures. They mostly wait
# (Prometheus' scrapes and rule evaluations, a stalled server, a soak's clock: 25 s of CPU in 89 s
# alone), so two modules at once overlap their waits: 89 s -> 54-55 s, 3 of 3 rounds passing.
for tier in unit integration e2e e2e-timing; do
  case $tier in
    e2e) args=(-m "e2e and not timing") ;;
    e2e-timing) args=(-m "e2e and timing") ;;
    *) args=(-m "$tier") ;;
  esac
  args+=(--junitxml "$out/$tier.xml")
  if [ "$tier" = e2e ] && [ "$JOBS" -gt 1 ]; then
    args+=(-n "$JOBS" --dist loadfile)
  elif [ "$tier" = e2e-timing ] && [ "$TIMING_JOBS" -gt 1 ]; then
    args+=(-n "$TIMING_JOBS" --dist loadfile)
  elif [ "$tier" = integration ] && [ "$JOBS" -gt 1 ]; then
    args+=(-n "$INTEGRATION_JOBS" --dist load)
  elif [ "$tier" = unit ] && [ "$UNIT_JOBS" -gt 1 ]; then
    args+=(-n "$UNIT_JOBS" --dist load)
  fi
  echo "== $tier tests"
  start=$(date +%s)
  "$PY" -m pytest -q -p no:cacheprovider "${args[@]}" "$@"
  rc=$?
  echo "$(( $(date +%s) - start ))" > "$out/$tier.seconds"
  case $rc in
    0 | 5) ;;  # 5: nothing selected in this tier (say, -k narrowed it away)
    *) status=1 ;;
  esac
done
# One closing table and one closing line over the three tiers, from their JUnit files.
"$PY" - "$out" <<'EOF'
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

out = Path(sys.argv[1])
total = {"passed": 0, "failed": 0, "skipped": 0}
reasons: dict[str, int] = {}
print("\n== time per tier (wall clock)")
for tier in ("unit", "integration", "e2e", "e2e-timing"):
    xml, secs = out / f"{tier}.xml", out / f"{tier}.seconds"
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if xml.exists():
        root = ET.parse(xml).getroot()
        for suite in root.iter("testsuite"):
            for k in counts:
                counts[k] += int(suite.get(k, 0))
        for skip in root.iter("skipped"):
            why = (skip.get("message") or "?").removeprefix("Skipped: ")
            reasons[why] = reasons.get(why, 0) + 1
    failed = counts["failures"] + counts["errors"]
    passed = counts["tests"] - failed - counts["skipped"]
    total["passed"] += passed
    total["failed"] += failed
    total["skipped"] += counts["skipped"]
    seconds = secs.read_text().strip() if secs.exists() else "?"
    print(f"{tier:<12} {seconds:>5} s  {passed} passed, {failed} failed, {counts['skipped']} skipped")
if reasons:  # what each skip wants, and how to get it (the reasons say)
    print("\n== skipped, for want of")
    for why, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"{n:>4}  {why}")
print(f"tests: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
EOF
exit $status
