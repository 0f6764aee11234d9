#!/bin/bash
# Online rollback of a mounted durable memfs with N files: wall time of `memfs rollback --mount`.
set -e
BIN=${MEMFS:-target/release/memfs}
N=${1:-10000}
D=$(mktemp -d /var/tmp/memfs-hm-XXXX); M=$(mktemp -d /tmp/memfs-hm-mnt-XXXX)
trap '$BIN umount $M >/dev/null 2>&1 || fusermount3 -uz $M; rm -rf $D $M' EXIT
$BIN mount $M --data-dir $D --durability async >/dev/null
mkdir $M/t; for d in $(seq 0 9); do mkdir $M/t/$d; done
python3 - "$M" "$N" <<'PY'
import sys,os
m,n=sys.argv[1],int(sys.argv[2])
for i in range(n):
    with open(f"{m}/t/{i%10}/f{i}","w") as f: f.write("generation 1")
PY
$BIN snapshot create base --mount $M >/dev/null
python3 - "$M" "$N" <<'PY'
import sys,os
m,n=sys.argv[1],int(sys.argv[2])
for i in range(0,n,10):
    with open(f"{m}/t/{i%10}/f{i}","w") as f: f.write("generation 2")
PY
ls -lR $M >/dev/null
t0=$(date +%s.%N)
$BIN rollback --mount $M --to base --yes >/dev/null
t1=$(date +%s.%N)
t2=$(date +%s.%N)
$BIN diff base - --mount $M | wc -l
t3=$(date +%s.%N)
cat $M/t/0/f0; echo
echo "files=$N rollback_s=$(echo "$t1 - $t0" | bc) diff_s=$(echo "$t3 - $t2" | bc)"
