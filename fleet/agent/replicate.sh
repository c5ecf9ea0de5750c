#!/bin/bash
# One replicate of a workload, run by fleet on the instance, in the build's directory:
#   replicate.sh DIR TAG IMDS_URL MONITOR(0|1) TIMEOUT_S COMMAND
# Runs COMMAND in its own process group with the psutil monitor beside it and a watcher on the
# IMDS spot interruption notice; on a notice it stops the workload and says so, so the
# controller reruns the replicate elsewhere instead of scoring it. Prints the workload's output,
# then one FLEET-RESULT line. FLEET_CLEANUP (environment, optional): shell run once the workload's
# group is gone, for what it started outside it.
set -u
dir=$1 tag=$2 imds=$3 monitor=$4 timeout_s=$5 cmd=$6
cd "$dir" || exit 97
export FLEET_METRIC_FILE="$dir/$tag.metric"
rm -f "$FLEET_METRIC_FILE" "$tag.out" "$tag.csv" "$tag.pid" "$tag.interrupted" "$tag.timeout"

mon=""
if [ "$monitor" = 1 ]; then
  # The monitor starts first and the workload once it is ready (its CSV header written): its
  # interpreter start-up would otherwise take CPU from the run being timed (measured: 2.5%).
  python3 ../monitor.py --pid-file "$tag.pid" --out "$tag.csv" 2>"$tag.monitor.err" &
  mon=$!
  for _ in $(seq 200); do  # 10 s at most; a monitor that cannot start is not waited for
    [ -s "$tag.csv" ] && break
    kill -0 "$mon" 2>/dev/null || break
    sleep 0.05
  done
fi

start=$(date +%s.%N)
# setsid: the workload and all it starts form one group, stopped together.
setsid bash -c "$cmd" >"$tag.out" 2>&1 </dev/null &
pid=$!
if [ -n "$mon" ]; then
  echo "$pid" >"$tag.pid.new" && mv "$tag.pid.new" "$tag.pid"
fi

# The watcher: an IMDSv2 token, then one notice check a second. The token is asked again when
# IMDS refuses it (401: expired after its 6 hours, or IMDS restarted), never given up on: a
# watcher that fails silently would let an interruption be scored as a failure.
(
  fresh_token() {
    token=$(curl -sf -m 2 -X PUT -H "X-aws-ec2-metadata-token-ttl-seconds: 21600" \
      "$imds/latest/api/token" 2>/dev/null) || token=""
  }
  fresh_token
  deadline=$(( $(date +%s) + ${timeout_s%.*} ))
  # Alive while /proc has it (a zombie too, until the wrapper's wait takes it), not only while
  # kill -0 works: sudo, the leader of every image replicate (`sudo -n docker run`), sets its
  # real uid to root for moments as it starts, and the user's kill -0 is refused then. The
  # watcher took that for the workload's end and never timed it out (CI failed so, 2026-12-01).
  # A refused signal is sent again the next turn, for the same reason.
  while kill -0 "$pid" 2>/dev/null || [ -e "/proc/$pid" ]; do
    [ -n "$token" ] || fresh_token
    if [ -n "$token" ]; then
      code=$(curl -s -m 2 -o /dev/null -w '%{http_code}' -H "X-aws-ec2-metadata-token: $token" \
        "$imds/latest/meta-data/spot/instance-action" 2>/dev/null) || code=000
      if [ "$code" = 200 ] && [ ! -e "$tag.interrupted" ] && [ ! -e "$tag.timeout" ]; then
        # Once, as the notice's one warning is: a workload that cleans up on TERM is not cut
        # short by more. Again next turn only when it was refused. The mark goes first: the
        # wrapper, its workload ended, kills this watcher at once, and the mark would be lost.
        touch "$tag.interrupted"
        kill -TERM -- "-$pid" 2>/dev/null || rm -f "$tag.interrupted"
      fi
      [ "$code" = 401 ] && fresh_token
    fi
    if [ ! -e "$tag.interrupted" ] && [ "$(date +%s)" -ge "$deadline" ]; then
      touch "$tag.timeout"
      kill -KILL -- "-$pid" 2>/dev/null
    fi
    sleep 1
  done
) &
watcher=$!

wait "$pid"
code=$?
end=$(date +%s.%N)
# What the workload left running in its group (a helper it put in the background) goes with
# it: it ran on beside every later replicate on the instance. So does what is not in its group
# (FLEET_CLEANUP: an image's container, which is dockerd's, not its client's).
kill -KILL -- "-$pid" 2>/dev/null
[ -z "${FLEET_CLEANUP:-}" ] || bash -c "$FLEET_CLEANUP" >/dev/null 2>&1 </dev/null
kill "$watcher" 2>/dev/null
wait "$watcher" 2>/dev/null
if [ -n "$mon" ]; then
  # Once its CSV exists the monitor handles SIGTERM; before that it is still starting, and
  # finds the workload gone by itself (a header-only CSV: too short to sample).
  [ -e "$tag.csv" ] && kill -TERM "$mon" 2>/dev/null
  wait "$mon" 2>/dev/null
  rm -f "$tag.pid"
fi
cat "$tag.out"
# The result on a line of its own: output without a final newline (printf value=1) ran into it,
# and the whole type failed as "the replicate wrapper did not finish".
[ -n "$(tail -c 1 "$tag.out")" ] && echo
state=finished
[ -e "$tag.timeout" ] && state=timeout
[ -e "$tag.interrupted" ] && state=interrupted
metric=$(head -c 200 "$FLEET_METRIC_FILE" 2>/dev/null | tr -s ' \n\t' ' ')
echo "FLEET-RESULT exit=$code start=$start end=$end state=$state metric_file=$metric"
