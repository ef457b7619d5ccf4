#!/usr/bin/env bash
# The integration tier in two phases (make test-integration): the whole-DAG modules alone, then
# every other module as two pytest processes side by side.
#
# Why (figures: docs/development.md#measurements): the whole-DAG modules
# (GRAIL_INTEGRATION_ALONE) use both cores themselves, their branches side by side, and beside
# another leg the demo's local run takes more than twice as long; the rest is mostly one process
# at a time (a subprocess start, imports, a server's start, one small training), but two legs
# of it with torch's default threads (4 compute threads on 2 cores) take longer than one. So
# the DAG modules run alone first, then every other module as two legs with one thread each
# (OMP_NUM_THREADS=1, inherited by their subprocesses; GRAIL_LEG_THREADS overrides it): the
# modules in GRAIL_INTEGRATION_LEG and "every other module of the tier" (--ignore of both
# lists), so a new module always runs in one of them. Each pytest process has its own TMPDIR,
# so neither pytest's temporary folders nor their clean-up meet; the first leg's output is
# printed after the second's; the tier fails if any of the three does, and then keeps their
# temporary folders (pytest keeps a failed test's tmp_path).
#
# Usage: tests/two_legs.sh PYTHON MARKER [pytest arguments...]
set -uo pipefail
python=$1 marker=$2
shift 2
read -r -a alone <<< "${GRAIL_INTEGRATION_ALONE:?names the modules run alone first}"
read -r -a leg <<< "${GRAIL_INTEGRATION_LEG:?names the first leg of modules}"
ignores=()
for module in "${alone[@]}" "${leg[@]}"; do
    [ -f "$module" ] || { echo "two_legs.sh: $module: no such test module" >&2; exit 2; }
    ignores+=("--ignore=$module")
done
root=$(mktemp -d "${TMPDIR:-/tmp}/grail-integration.XXXXXX")
mkdir -p "$root/alone" "$root/first" "$root/second"
# say LINE: prints a phase's line, and appends it to CI's list of steps when .ci/run names one.
say() {
    echo "$1"
    [ -z "${CI_TIMINGS:-}" ] || echo "  $1" >> "$CI_TIMINGS"
}
started=$SECONDS
TMPDIR="$root/alone" "$python" -m pytest -m "$marker" "${alone[@]}" "$@"
alone_status=$?
say "the whole-DAG modules alone: exit $alone_status, $((SECONDS - started)) s"
started=$SECONDS
threads=${GRAIL_LEG_THREADS:-1}
TMPDIR="$root/first" OMP_NUM_THREADS=$threads "$python" -m pytest -m "$marker" "${leg[@]}" "$@" > "$root/first.log" 2>&1 &
first=$!
TMPDIR="$root/second" OMP_NUM_THREADS=$threads "$python" -m pytest -m "$marker" "${ignores[@]}" "$@"
second=$?
say "the second leg (every other module): exit $second, $((SECONDS - started)) s"
wait "$first"
first_status=$?
say "the first leg (${leg[*]}): exit $first_status, $((SECONDS - started)) s"
echo "the first leg's output:"
cat "$root/first.log"
if [ "$alone_status" -eq 0 ] && [ "$first_status" -eq 0 ] && [ "$second" -eq 0 ]; then
    rm -rf "$root"  # made by mktemp above; a failed run keeps it (its failed tests' tmp_path)
else
    echo "two_legs.sh: a pytest process failed; its temporary folders are kept under $root" >&2
    exit 1
fi
