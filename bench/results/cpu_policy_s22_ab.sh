#!/bin/bash
# A/B: main vs cpupolicy, piper, sentence+auto, rate 2/s, 15 s each, alternating servers, 2 rounds.
set -u
out=/tmp/cpab
port=8740
for round in 1 2; do
for tree in /work/main /work/wt/cpupolicy; do
  name=$(basename $tree); port=$((port+1))
  cd $tree
  PYTHONPATH=$tree /work/main/.venv/bin/python /work/main/.venv/bin/voxgate serve --model piper --in-process --port $port > $out/server_${name}_r$round.log 2>&1 &
  spid=$!
  for i in $(seq 1 90); do curl -sf http://127.0.0.1:$port/health >/dev/null 2>&1 && break; sleep 1; done
  (cd /work/wt/cpupolicy && PYTHONPATH=/work/wt/cpupolicy:/work/wt/cpupolicy/bench timeout 200 /work/main/.venv/bin/python bench/load.py --url http://127.0.0.1:$port --rates 2 --duration 15 --modes sentence,auto --languages en --texts own --json $out/${name}_r$round.json --plot $out/${name}_r$round.png > $out/${name}_r$round.txt 2>&1)
  kill $spid; wait $spid 2>/dev/null
done
done
echo done
