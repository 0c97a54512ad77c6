#!/usr/bin/env bash
# A real test of the slurm/ scripts on one Debian machine (CI container or workstation, as root):
# installs slurm-wlm and munge, starts munged, slurmctld and slurmd for a one-node cluster on this
# host (proctrack/linuxproc, task/none, no cgroups, the host's CPUs and memory), then through
# sbatch, with the same scripts a p5en cluster uses (slurm/submit.sh, run.sbatch, array.sh,
# merge.sbatch; the EFA env file skips itself without /opt/amazon):
#   1. the tiny job (jobs/tiny.ini, 2 ranks): completes, its HDF5 file holds every prompt; srun
#      --mpi=pmix is used when Debian's Slurm and Open MPI manage it (probed), and the job is run
#      again with SHARDLM_LAUNCHER=mpirun: the same tokens;
#   2. requeue: a longer job is requeued with `scontrol requeue` once it has written results; the
#      first start stops on SIGTERM (flushes, exits non-zero), the second resumes the same file (run.sbatch logs
#      "resuming", the file's resumed_with_requests attribute), and the file ends with every id once
#      and the tokens of an uninterrupted run. Again with the time-limit warning (SIGUSR1 to the
#      batch shell), after which run.sbatch requeues the job itself;
#   3. bulk: slurm/array.sh splits inputs/prompts.jsonl into 3 shards, runs them as a job array and
#      merges them in a dependent job; the merged file equals the single run of step 1, id for id,
#      token for token, and `shardlm report` reads it.
# Any failure exits 1 after printing the daemon and job logs. Started daemons are stopped on exit.
#   bash slurm/ci/local_slurm.sh                 # uses build/shardlm (built by jobs/build.sh if absent)
#   SHARDLM_BIN=build-x/shardlm bash slurm/ci/local_slurm.sh
# Run by jobs/test.sh when SHARDLM_SLURM_TEST=1 (CI sets it). Takes about a minute here (2 cores).
set -euo pipefail
cd "$(dirname "$0")/../.."
t_begin=$(date +%s)
say() { echo "[local_slurm $(( $(date +%s) - t_begin ))s] $*" >&2; }

[ "$(id -u)" -eq 0 ] || { echo "local_slurm.sh: run as root (it installs packages and starts slurmctld/slurmd as root)" >&2; exit 1; }
need=()
for p in slurm-wlm munge hdf5-tools python3; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  say "installing: ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
export SHARDLM_BIN=${SHARDLM_BIN:-build/shardlm}
[ -x "$SHARDLM_BIN" ] || bash jobs/build.sh
bin=$SHARDLM_BIN

# ---- the cluster: state under $ci, its own munge key and socket, ports off the usual ones ----
ci=${SLURM_CI_DIR:-/tmp/shardlm-slurm-ci}
port=${SLURM_CI_PORT:-16817}
node=$(hostname -s 2>/dev/null || cat /proc/sys/kernel/hostname)
out=out/slurm-ci   # the jobs' results and logs (SHARDLM_OUT_ROOT, SHARDLM_LOG_DIR)
rm -rf "$ci" "$out"
mkdir -p "$ci/state" "$ci/spool" "$ci/munge" "$out/logs"
pids=()
dump_logs() {
  for f in "$ci"/munged.log "$ci"/slurmctld.log "$ci"/slurmd.log "$ci"/*.out; do
    [ -f "$f" ] && { echo "===== $f (last 60 lines)"; tail -n 60 "$f"; }
  done
  for f in "$out"/logs/*.log; do
    [ -f "$f" ] && { echo "===== $f (last 40 lines)"; tail -n 40 "$f"; }
  done
  if command -v sinfo >/dev/null; then echo "===== sinfo -R / squeue"; sinfo -R 2>&1; squeue 2>&1; fi
}
fail() {
  echo "[local_slurm] FAILED: $*" >&2
  dump_logs >&2
  exit 1
}
cleanup() {
  local i
  # Jobs first (their processes outlive a killed slurmd), then the daemons, newest first.
  if [ -n "${SLURM_CONF:-}" ] && [ -n "$(squeue -h -o %i 2>/dev/null)" ]; then
    # shellcheck disable=SC2046  # one job id per word
    scancel --full $(squeue -h -o %i) 2>/dev/null || true
    for _ in $(seq 30); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 1; done
  fi
  for ((i = ${#pids[@]} - 1; i >= 0; --i)); do kill "${pids[i]}" 2>/dev/null || true; done
  for ((i = ${#pids[@]} - 1; i >= 0; --i)); do wait "${pids[i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
# Any command failing unexpectedly fails the test loudly, logs included.
trap 'fail "line $LINENO: $BASH_COMMAND exited $?"' ERR

dd if=/dev/urandom of="$ci/munge/munge.key" bs=1024 count=1 status=none
chown munge:munge "$ci/munge" "$ci/munge/munge.key" 2>/dev/null || true
chmod 700 "$ci/munge"
chmod 400 "$ci/munge/munge.key"
sock="$ci/munge/munge.sock"
munged -F --force --key-file="$ci/munge/munge.key" --socket="$sock" --pid-file="$ci/munge/munged.pid" \
  --log-file="$ci/munged.log" --seed-file="$ci/munge/seed" >"$ci/munged.out" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
munge -n -S "$sock" | unmunge -S "$sock" >/dev/null || fail "munged does not work"

# The node as slurmd sees it (CPUs, sockets, cores, memory), under this host's short name.
hw=$(slurmd -C | sed -nE '1s/^NodeName=[^ ]+ //p')
mem=$(sed -nE 's/.*RealMemory=([0-9]+).*/\1/p' <<<"$hw")
cat >"$ci/slurm.conf" <<EOF
ClusterName=shardlm-ci
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock
StateSaveLocation=$ci/state
SlurmdSpoolDir=$ci/spool
SlurmctldPidFile=$ci/slurmctld.pid
SlurmdPidFile=$ci/slurmd.pid
SlurmctldLogFile=$ci/slurmctld.log
SlurmdLogFile=$ci/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
ReturnToService=2
MinJobAge=600
KillWait=15
NodeName=$node NodeAddr=127.0.0.1 $hw State=UNKNOWN
PartitionName=ci Nodes=$node Default=YES MaxTime=INFINITE State=UP DefMemPerCPU=$(( mem / 8 ))
EOF
export SLURM_CONF="$ci/slurm.conf"
slurmctld -D -i -f "$SLURM_CONF" >"$ci/slurmctld.out" 2>&1 &
ctld=$!
pids+=("$ctld")
slurmd -D -N "$node" -f "$SLURM_CONF" >"$ci/slurmd.out" 2>&1 &
slurmd_pid=$!
pids+=("$slurmd_pid")
state=""
for _ in $(seq 60); do
  kill -0 "$ctld" 2>/dev/null || fail "slurmctld exited (port $port taken? set SLURM_CI_PORT)"
  kill -0 "$slurmd_pid" 2>/dev/null || fail "slurmd exited"
  state=$(sinfo -h -n "$node" -o %T 2>/dev/null || true)
  [ "$state" = idle ] && break
  sleep 1
done
[ "$state" = idle ] || fail "node $node is not idle after 60 s (state '$state')"
say "slurm up: $(sinfo -h -o '%P %D %c CPUs %m MB %T')"

# ---- helpers ----
export SHARDLM_OUT_ROOT=$out SHARDLM_LOG_DIR=$out/logs SHARDLM_PROFILE=local
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

job_state() { scontrol show job "$1" 2>/dev/null | sed -nE 's/.*JobState=([A-Z_]+).*/\1/p' | head -n 1; }
# wait_job ID SECONDS: waits until the job has ended; fails unless it COMPLETED.
wait_job() {
  local id=$1 limit=$2 s=""
  for ((i = 0; i < limit; ++i)); do
    s=$(job_state "$id")
    case "$s" in
      COMPLETED) return 0 ;;
      FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED)
        scontrol show job "$id" >&2; fail "job $id ended $s" ;;
    esac
    sleep 1
  done
  scontrol show job "$id" >&2
  fail "job $id not finished after $limit s (state $s)"
}
# rows FILE: "id<TAB>output tokens" per request, sorted (read with h5dump: no h5py needed).
rows() {
  python3 - "$1" <<'EOF'
import re, subprocess, sys
def data(dset):
    t = subprocess.run(["h5dump", "-y", "-w", "0", "-d", dset, sys.argv[1]], check=True, capture_output=True, text=True).stdout
    return t[t.index("DATA {") + 6:t.rindex("}", 0, t.rindex("}"))]
ids = re.findall(r'"((?:[^"\\]|\\.)*)"', data("/requests/id"))
toks = re.findall(r"\(([^()]*)\)", data("/requests/output_tokens"))
assert len(ids) == len(toks), (len(ids), len(toks))
for i, t in sorted(zip(ids, toks)):
    print(f"{i}\t{t}")
EOF
}
attr() { h5dump -a "$2" "$1" | sed -nE 's/^ *\(0\): "?([^"]*)"?$/\1/p'; }

[ -f out/tiny-llama/model.safetensors ] ||
  "$bin" make-model --config inputs/models/tiny-llama.json --out out/tiny-llama --dtype bf16 --seed 1 >/dev/null

# ---- launcher: srun --mpi=pmix when Debian's Slurm and Open MPI manage it, else mpirun ----
if timeout 60 srun --mpi=pmix -n 2 -t 1 "$bin" bench-comm --max-bytes 4K >"$ci/pmix-probe.out" 2>&1; then
  export SHARDLM_LAUNCHER=srun
  say "launcher: srun --mpi=pmix works (2-rank bench-comm)"
else
  export SHARDLM_LAUNCHER=mpirun
  say "launcher: mpirun (srun --mpi=pmix failed: $(tail -n 3 "$ci/pmix-probe.out" | tr '\n' ' '))"
fi

# ---- 1. the tiny job ----
tiny=$(slurm/submit.sh jobs/tiny.ini)
say "1. tiny job $tiny submitted"
wait_job "$tiny" 120
tiny_h5=$out/$tiny/results.h5
[ -f "$tiny_h5" ] || fail "no $tiny_h5"
rows "$tiny_h5" >"$ci/tiny.rows"
want=$(grep -c . inputs/prompts.jsonl)
[ "$(wc -l <"$ci/tiny.rows")" -eq "$want" ] || fail "$tiny_h5 holds $(wc -l <"$ci/tiny.rows") requests, want $want"
"$bin" report "$tiny_h5" >"$ci/tiny.report" || fail "shardlm report $tiny_h5"
grep -q "completed (not interrupted)" "$ci/tiny.report" || fail "report of $tiny_h5: $(cat "$ci/tiny.report")"
say "1. ok: $want requests in $tiny_h5, report reads it"
# The same job through the other launch mode: Open MPI's mpirun inside the allocation.
other=mpirun
[ "$SHARDLM_LAUNCHER" = mpirun ] && other=""
if [ -n "$other" ]; then
  tiny2=$(SHARDLM_LAUNCHER=$other slurm/submit.sh jobs/tiny.ini)
  wait_job "$tiny2" 120
  grep -q "launcher $other" "$out/logs/tiny-$tiny2.log" || fail "job $tiny2 did not use $other"
  rows "$out/$tiny2/results.h5" >"$ci/tiny-$other.rows"
  cmp -s "$ci/tiny-$other.rows" "$ci/tiny.rows" || fail "the $other run's tokens differ from the srun run's"
  say "1. ok: the same through $other (job $tiny2), same tokens"
fi

# ---- 2. requeue: SIGTERM, flush, resume ----
long=$out/long.jsonl
for i in $(seq 1 400); do
  echo "{\"id\": \"long-$i\", \"prompt\": \"Once upon a time number $i\", \"max_tokens\": 384, \"ignore_eos\": true}"
done >"$long"
job=jobs/tiny-requeue.ini
# The same prompts in one uninterrupted run (outside Slurm), for the tokens a requeued job must give.
mpirun --oversubscribe -np 2 "$bin" run --config "$job" --prompts "$long" --out "$ci/straight.h5" --threads 1 -q \
  >"$ci/straight.out" 2>&1 || fail "uninterrupted run: $(tail -n 5 "$ci/straight.out")"
rows "$ci/straight.h5" >"$ci/straight.rows"

# requeue_test HOW: submits the long job, interrupts it once it has finished 40 requests, and checks
# that it comes back and resumes. HOW is "scontrol" (scontrol requeue: Slurm sends SIGTERM, as on
# preemption or node failure) or "timelimit" (SIGUSR1 to the batch shell, what --signal=B:USR1@300
# sends before the time limit: run.sbatch stops the step and requeues the job itself).
requeue_test() {
  local how=$1 rq log done_n=0 s resumed
  rq=$(slurm/submit.sh "$job" --prompts "$long")
  log=$out/logs/tiny-requeue-$rq.log
  for _ in $(seq 240); do
    done_n=$( (grep -oE 'replica [0-9]+: [0-9]+/' "$log" 2>/dev/null || true) | sed -E 's/.*: ([0-9]+)\//\1/' | sort -n | tail -n 1)
    [ "${done_n:-0}" -ge 40 ] && break
    s=$(job_state "$rq")
    [ "$s" = RUNNING ] || [ "$s" = PENDING ] || fail "job $rq ended ($s) before it could be interrupted"
    sleep 0.5
  done
  [ "${done_n:-0}" -ge 40 ] || fail "job $rq did not get to 40 requests"
  case "$how" in
    scontrol) scontrol requeue "$rq" ;;
    timelimit) scancel --batch --signal=USR1 "$rq" ;;
  esac
  # A requeued job waits a moment (BeginTime) before it is eligible again: let it start now, but not
  # in the second Slurm requeued it. slurmd revokes the first start's credential at the requeue and
  # refuses any credential of that job issued in the same second (whole seconds compared): the
  # job then ends FAILED, "Job credential revoked" (seen once in CI).
  local pending_since=
  for _ in $(seq 60); do
    grep -q "(start 2)" "$log" 2>/dev/null && break
    if [ "$(job_state "$rq")" = PENDING ]; then
      [ -n "$pending_since" ] || pending_since=$(date +%s)
      if [ $(($(date +%s) - pending_since)) -ge 2 ]; then
        scontrol update jobid="$rq" StartTime=now >/dev/null 2>&1 || true
      fi
    fi
    sleep 1
  done
  wait_job "$rq" 180
  grep -qE "step exited with [1-9]" "$log" || fail "$how: the first start of $rq did not stop on SIGTERM (non-zero exit)"
  grep -q "stopped by signal 15" "$log" || fail "$how: shardlm did not report stopping on signal 15"
  if [ "$how" = timelimit ]; then
    grep -q "time limit near: requeueing job $rq" "$log" || fail "timelimit: run.sbatch did not requeue $rq"
  fi
  grep -qE "\(start 2\).*resuming $out/$rq/results.h5" "$log" || fail "$how: the second start of $rq did not resume its file"
  resumed=$(attr "$out/$rq/results.h5" resumed_with_requests)
  [ "${resumed:-0}" -gt 0 ] || fail "$how: $out/$rq/results.h5 has no resumed_with_requests attribute"
  rows "$out/$rq/results.h5" >"$ci/requeue-$how.rows"
  [ "$(cut -f1 "$ci/requeue-$how.rows" | sort | uniq -d | wc -l)" -eq 0 ] || fail "$how: an id appears twice in job $rq's file"
  [ "$(wc -l <"$ci/requeue-$how.rows")" -eq 400 ] || fail "$how: job $rq's file holds $(wc -l <"$ci/requeue-$how.rows") requests, want 400"
  cmp -s "$ci/requeue-$how.rows" "$ci/straight.rows" || fail "$how: job $rq's tokens differ from an uninterrupted run"
  say "2. ok ($how): job $rq stopped after $done_n requests, resumed with $resumed, 400 ids once, tokens = uninterrupted run"
}
requeue_test scontrol
requeue_test timelimit

# ---- 3. job array over shards + dependent merge ----
read -r array merge < <(SHARDLM_LOCAL_RANKS=1 slurm/array.sh --shards 3 jobs/tiny.ini inputs/prompts.jsonl)
say "3. array $array + merge $merge submitted"
wait_job "$merge" 180
merged=$out/$array/merged.h5
rows "$merged" >"$ci/merged.rows"
cmp -s "$ci/merged.rows" "$ci/tiny.rows" || { diff "$ci/merged.rows" "$ci/tiny.rows" | head; fail "merged shards differ from the single run"; }
[ "$(attr "$merged" merged_from)" = 3 ] || fail "$merged: merged_from is not 3"
"$bin" report "$merged" >"$ci/merged.report" || fail "shardlm report $merged"
say "3. ok: 3 shards merged = the single run, id for id, token for token"
say "PASSED in $(( $(date +%s) - t_begin )) s"
