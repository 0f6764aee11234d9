#!/bin/bash
# Time to a usable clone (the command returns once the clone serves): --mount, --data-dir online, --data-dir offline.
# Usage (docs/snapshots.md, "Clones"): FILES=100000 MIB=4096 N=5 flock /tmp/memfs-bench.lock scripts/clone-measure.sh
set -u
B=${MEMFS:-target/release/memfs}
W=/var/tmp/clonedd-meas
FILES=${FILES:-100000}; MIB=${MIB:-4096}; N=${N:-5}
cleanup() {
  for p in $W/C $W/M; do mountpoint -q $p && $B umount $p; done
  rm -rf $W
}
trap cleanup EXIT
rm -rf $W; mkdir -p $W/D $W/M $W/C
now() { date +%s%N; }
uptime
$B mount $W/M --data-dir $W/D --durability none >/dev/null || exit 1
s=$(now)
python3 - "$W/M" "$FILES" "$MIB" <<'PY'
import os, sys
root, files, mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
per = 1000
for d in range((files + per - 1) // per):
    dp = os.path.join(root, "d%04d" % d); os.mkdir(dp)
    for i in range(min(per, files - d * per)):
        os.close(os.open(os.path.join(dp, "f%d" % i), os.O_CREAT | os.O_WRONLY, 0o644))
buf = bytearray(os.urandom(1 << 20))
with open(os.path.join(root, "big"), "wb", buffering=0) as f:
    for i in range(mib):
        buf[0:8] = i.to_bytes(8, "little")
        f.write(buf)
PY
echo "tree: $FILES files + $MIB MiB written in $(( ($(now)-s)/1000000 )) ms"
$B snapshot create s1 --mount $W/M || exit 1
one() { # label, clone args...
  local label=$1; shift
  local s=$(now)
  out=$($B clone s1 $W/C "$@") || { echo "FAILED: $out"; exit 1; }
  local e=$(now)
  [ "$(stat -c %s $W/C/big)" = $((MIB << 20)) ] || { echo "clone does not show the tree"; exit 1; }
  echo "$label: $(( (e-s)/1000 )) us :: ${out%%;*}" | sed 's/memfs: clone of snapshot s1//' | cut -c1-260
  pid=$(echo "$out" | sed -n 's/.*server pid \([0-9]*\).*/\1/p')
  $B umount $W/C
  if [ -n "$pid" ]; then while [ -e /proc/$pid ] && ! grep -q '^State:.Z' /proc/$pid/status 2>/dev/null; do sleep 0.01; done; fi
}
for i in $(seq $N); do one "--mount M" --mount $W/M; done
for i in $(seq $N); do one "--data-dir D (mounted)" --data-dir $W/D; done
$B umount $W/M
echo "HISTORY:"; cat $W/D/HISTORY; du -sh $W/D
for i in $(seq 3); do one "--data-dir D (not mounted: new server)" --data-dir $W/D; done
s=$(now); $B mount $W/M --data-dir $W/D --durability none | grep recovery; echo "mount of D: $(( ($(now)-s)/1000 )) us"
one "--data-dir D (mounted, s1 not rebuilt since the mount: first clone)" --data-dir $W/D
for i in $(seq 2 3); do one "--data-dir D (mounted, s1 rebuilt aside already)" --data-dir $W/D; done
# A checkpoint at the snapshot: a snapshot taken, then unmount (the final checkpoint is at s2's commit).
$B snapshot create s2 --mount $W/M >/dev/null
$B umount $W/M
echo "HISTORY:"; cat $W/D/HISTORY
for i in $(seq 3); do out=$($B clone s2 $W/C --data-dir $W/D) && echo "s2 (checkpoint at its commit), not mounted: ${out%%;*}" | sed 's/memfs: clone of snapshot//' | cut -c1-260; pid=$(echo "$out" | sed -n 's/.*server pid \([0-9]*\).*/\1/p'); $B umount $W/C; while [ -e /proc/$pid ] && ! grep -q '^State:.Z' /proc/$pid/status 2>/dev/null; do sleep 0.01; done; done
uptime
