#!/usr/bin/env bash
# Engine frames/s before and after issue 41's engine half, in one run, sides alternated so the box's
# load hits both alike. Trees: git archive 635a8a3 | tar -x -C /tmp/core41_before; the same for the
# core41 commit into /tmp/core41_after. ORDER, LEVELS and OUT override the defaults.
set -u
mkdir -p ${OUT:-/tmp/core41_bench}
PY=/work/main/.venv/bin/python
i=0
for side in ${ORDER:-before after after before before after}; do
  i=$((i+1))
  cd /tmp/core41_$side && PYTHONPATH=/tmp/core41_$side timeout 900 $PY bench/engine_bench.py --no-baseline \
    --concurrency ${LEVELS:-1,8,16} --frames 60 --json ${OUT:-/tmp/core41_bench}/$i-$side.json --png ${OUT:-/tmp/core41_bench}/$i-$side.png \
    > ${OUT:-/tmp/core41_bench}/$i-$side.log 2>&1
  echo "$i $side rc=$? load=$(cut -d' ' -f1 /proc/loadavg)"
done
