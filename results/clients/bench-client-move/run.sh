#!/bin/bash
# Runs inside `unshare -n`: one server (BASE), the two client builds alternated REPS times per engine.
set -e
ip link set lo up
BASE=${BASE:-/work/wt-client-base/target/release/corelocal}
NEW=${NEW:-target/release/corelocal}
OUT=${OUT:-/tmp/ab/json}
mkdir -p $OUT /tmp/abroot /tmp/ab && printf "hello\n" >/tmp/abroot/hello
$BASE serve http --root /tmp/abroot --listen 127.0.0.1:8080 --cpus 1 --stats-interval 0 >/tmp/ab/srv.log 2>&1 &
SRV=$!
sleep 1
for engine in ${ENGINES:-uring epoll}; do
  for rep in $(seq ${REPS:-3}); do
    for build in base new; do
      if [ $build = base ]; then BIN=$BASE; else BIN=$NEW; fi
      $BIN bench crr --target 127.0.0.1:8080 --proto http --path /hello --cpus 0 --conns 64 \
        --duration 5s --engine $engine --progress never --json $OUT/$engine-$build-$rep.json >/dev/null 2>&1
      python3 -c "import json;d=json.load(open('$OUT/$engine-$build-$rep.json'));print('$engine $build $rep', d['client_threads'][0]['engine'], round(d['throughput']['sessions_per_s']), round(d['client_cpu']['us_per_unit'],3), d['errors']['rate'])"
    done
  done
done
kill $SRV
