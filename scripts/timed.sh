#!/usr/bin/env bash
# timed.sh LOG CMD...: run CMD, then append "seconds<TAB>CMD (its first words)" to LOG; CMD's exit
# status is kept (make stops on a failure as without it). `make demo` prints LOG at the end.
# TIMED_TAG (optional) is written after the seconds, e.g. [lane] for a step run beside another.
set -uo pipefail
log=$1; shift
start=$(date +%s%N)
"$@"; status=$?
end=$(date +%s%N)
name=$(printf '%s ' "${@:2:4}" | sed 's/ *$//')
mkdir -p "$(dirname "$log")"
ms=$(( (end - start) / 1000000 ))
printf '%5d.%d s\t%s%s\n' $(( ms / 1000 )) $(( ms % 1000 / 100 )) "${TIMED_TAG:+$TIMED_TAG }" "$name" >> "$log"
exit $status
