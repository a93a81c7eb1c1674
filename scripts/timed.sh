#!/usr/bin/env bash
# timed.sh LOG CMD...: run CMD, then append "seconds<TAB>CMD (its first words)" to LOG; CMD's exit
# status is kept (make stops on a failure as without it). `make demo` prints LOG at the end.
set -uo pipefail
log=$1; shift
start=$(date +%s%N)
"$@"; status=$?
end=$(date +%s%N)
name=$(printf '%s ' "${@:2:4}" | sed 's/ *$//')
mkdir -p "$(dirname "$log")"
ms=$(( (end - start) / 1000000 ))
printf '%5d.%d s\t%s\n' $(( ms / 1000 )) $(( ms % 1000 / 100 )) "$name" >> "$log"
exit $status
