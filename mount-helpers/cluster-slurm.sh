# cluster-slurm.sh: Slurm in an emulated cluster of mount-helpers/shufflefs-cluster, sourced by
# it (bash functions only; they use its die, load, record_pid, host_index and $SELF).
#
# One munged for the whole cluster (a key of its own, a socket under the cluster's state
# folder: a path socket is reachable from every network namespace, and every daemon shares
# the key as on a real cluster), slurmctld in the root namespace at the bridge address
# PREFIX.254 (the head and login node: srun, sbatch, salloc and mpirun run from there), and
# one slurmd per host started through `shufflefs-cluster exec`, so that it and every task it
# starts run in the host's namespaces. Nodes are named after the hosts (sfs-NAME-hI, NodeAddr
# the host's address), each with SLURM_CPUS CPUs (more than the machine has: several ranks fit
# per host), linuxproc tracking, no task plugin, no cgroups, PMIx as the default MPI plugin.
# Everything lives in $DIR/slurm: slurm.conf, the munge key and socket, state, per-node spool
# and log files (%n). Ports are per cluster (from the subnet), so two clusters can run Slurm.
#
# Open MPI between hosts needs TCP on the cluster's subnet and nothing that moves bytes by
# shared memory across "hosts" (UCX, libfabric): `slurm_env` prints those variables with
# SLURM_CONF (and GLOO_SOCKET_IFNAME=eth0 for PyTorch's gloo: the hosts' names resolve to
# nothing); the srun/sbatch/salloc/slurm subcommands run with them.
#
# Measured (2 shared cores, 4 hosts x 2 ranks): `up --slurm` 0.3-0.5 s; srun of 8 shufflefs
# daemons to every mount answering 0.9-2.1 s (mpirun through the rsh agent: 1.9-2.1 s);
# scancel to no daemon and no mount 0.4 s; a killed host is declared down, and its job
# cancelled on the other hosts, about 25 s after the kill (SlurmdTimeout=10). Job ids start at
# a random FirstJobId, so no two clusters' jobs share ids (names derived from them: Open MPI's
# shared-memory segments, PMIx folders). Open MPI 4.1.4 launched by srun sometimes crashes in
# MPI_Init under load (docs/cluster.md, Slurm); mpirun in an allocation does not.

SLURM_CPUS=8

slurm_dir() { echo "$DIR/slurm"; }

# The ports of this cluster's slurmctld and slurmd: 20000 + 4 x (third octet) + 2 x (second
# octet's parity), so 10.213.x and 10.214.x clusters differ.
slurm_ports() {
  local o2 o3
  IFS=. read -r _ o2 o3 <<<"$PREFIX"
  local base=$((20000 + 4 * o3 + 2 * (o2 % 2) + 1024 * (o2 % 8)))
  echo "$base $((base + 1))"
}

slurm_write_conf() { # NAME
  local s ctl_port d_port i
  s=$(slurm_dir)
  read -r ctl_port d_port < <(slurm_ports)
  {
    cat <<EOF
# Written by shufflefs-cluster up $1 --slurm; removed by down.
ClusterName=sfs-$1
FirstJobId=$((RANDOM * 100 + 1))
SlurmctldHost=$(hostname -s)($PREFIX.254)
SlurmctldPort=$ctl_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$s/munge.sock
StateSaveLocation=$s/state
SlurmdSpoolDir=$s/spool-%n
SlurmctldPidFile=$s/slurmctld.pid
SlurmdPidFile=$s/slurmd-%n.pid
SlurmctldLogFile=$s/slurmctld.log
SlurmdLogFile=$s/slurmd-%n.log
TmpFS=$s/tmp-%n
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=pmix
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=2
KillOnBadExit=1
SlurmdTimeout=10
MessageTimeout=10
MinJobAge=10
InactiveLimit=0
SchedulerParameters=sched_interval=1
EOF
    for ((i = 0; i < HOSTS; i++)); do
      echo "NodeName=sfs-$1-h$i NodeAddr=$PREFIX.$((i + 1)) NodeHostname=sfs-$1-h$i CPUs=$SLURM_CPUS RealMemory=1000 State=UNKNOWN"
    done
    echo "PartitionName=sfs Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
  } >"$s/slurm.conf"
}

# Starts host I's slurmd in the host (again, after the host was killed: "a reboot").
slurm_start_slurmd() { # NAME I
  local s
  s=$(slurm_dir)
  "$SELF" exec "$1" "$2" slurmd -f "$s/slurm.conf" -N "sfs-$1-h$2" </dev/null \
    >>"$s/slurmd-start.log" 2>&1 || die "slurmd on h$2 did not start (see $s/slurmd-sfs-$1-h$2.log)"
}

slurm_wait_idle() { # NAME SECONDS
  local tries=$(($2 * 5)) states
  while :; do
    states=$(SLURM_CONF=$(slurm_dir)/slurm.conf sinfo -h -N -o '%N %T' 2>/dev/null | sort -u)
    if [ -n "$states" ] && ! grep -qv ' idle$' <<<"$states" &&
       [ "$(wc -l <<<"$states")" -eq "$HOSTS" ]; then
      return 0
    fi
    tries=$((tries - 1))
    [ $tries -gt 0 ] || die "slurm: nodes not idle after $2 s: $(echo $states)"
    sleep 0.2
  done
}

# Waits up to 5 s for a daemon's pid file (written after it forked).
slurm_wait_file() { # FILE WHAT
  local tries=50
  until [ -s "$1" ]; do
    tries=$((tries - 1)); [ $tries -gt 0 ] || die "$2 wrote no pid file $1 (see its log)"
    sleep 0.1
  done
}

# `up ... --slurm`: munged, slurmctld, one slurmd per host; returns once every node is idle.
slurm_up() { # NAME
  local s
  s=$(slurm_dir)
  command -v slurmctld >/dev/null && command -v munged >/dev/null ||
    die "--slurm needs slurm-wlm and munge (apt-get install slurm-wlm munge)"
  mkdir -p "$s/state"
  chmod 700 "$s"
  dd if=/dev/urandom of="$s/munge.key" bs=1024 count=1 status=none
  chmod 400 "$s/munge.key"
  munged --force --key-file="$s/munge.key" --socket="$s/munge.sock" \
    --pid-file="$s/munged.pid" --log-file="$s/munged.log" --seed-file="$s/munged.seed" ||
    die "munged did not start (see $s/munged.log)"
  slurm_wait_file "$s/munged.pid" munged
  record_pid "$DIR" "$(cat "$s/munged.pid")" munged
  slurm_write_conf "$1"
  slurmctld -f "$s/slurm.conf" -i </dev/null >>"$s/slurmctld.out" 2>&1 ||
    die "slurmctld did not start (see $s/slurmctld.log)"
  slurm_wait_file "$s/slurmctld.pid" slurmctld
  record_pid "$DIR" "$(cat "$s/slurmctld.pid")" slurmctld
  local i
  for ((i = 0; i < HOSTS; i++)); do
    mkdir -p "$s/spool-sfs-$1-h$i" "$s/tmp-sfs-$1-h$i"
    slurm_start_slurmd "$1" "$i"
  done
  slurm_wait_idle "$1" 60
  echo "slurm up on $1: partition sfs, $HOSTS nodes x $SLURM_CPUS CPUs; eval \"\$($SELF slurm-env $1)\""
}

# What a user needs in the environment to use this cluster's Slurm and Open MPI across its
# hosts, as `export` lines.
slurm_env() { # NAME
  local s
  s=$(slurm_dir)
  [ -f "$s/slurm.conf" ] || die "cluster $1 has no Slurm (up it with --slurm)"
  cat <<EOF
export SLURM_CONF=$s/slurm.conf
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=tcp,vader,self OMPI_MCA_osc=^ucx
export OMPI_MCA_btl_tcp_if_include=$SUBNET OMPI_MCA_oob_tcp_if_include=$SUBNET
export OMPI_MCA_hwloc_base_binding_policy=none OMPI_MCA_rmaps_base_oversubscribe=1
export PMIX_MCA_ptl_tcp_if_include=$SUBNET
export GLOO_SOCKET_IFNAME=eth0
EOF
  [ "$(id -u)" != 0 ] || echo "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
}

cmd_slurm_env() {
  [ $# -eq 1 ] || die "usage: slurm-env NAME"
  load "$1"
  slurm_env "$1"
}

# `slurm NAME CMD ARGS...`: any command (srun, sbatch, salloc, scancel, squeue, mpirun...)
# with the cluster's Slurm environment, from the head node. `shufflefs mount ... MOUNT` in
# the arguments records MOUNT ({rank} expanded) for `down`, as `mpirun` does.
cmd_slurm() {
  [ $# -ge 2 ] || die "usage: slurm NAME CMD [ARGS...]"
  load "$1"
  local name=$1 env
  shift
  env=$(slurm_env "$name") || exit 1
  eval "$env"
  local a prev="" r
  for a in "$@"; do
    if [ "$a" = mount ] && [[ ${prev##*/} == shufflefs* ]]; then
      for ((r = 0; r < HOSTS * SLURM_CPUS; r++)); do
        realpath -m -- "${!#//\{rank\}/$r}"
      done | (flock 9; cat >>"$DIR/mounts") 9>>"$DIR/pids.lock"
    fi
    prev=$a
  done
  record_pid "$DIR" $$ "$1"
  exec "$@"
}

# Host I's slurmd again after the host was killed.
cmd_slurmd() {
  [ $# -eq 2 ] || die "usage: slurmd NAME HOST"
  load "$1"
  local i
  i=$(host_index "$1" "$2")
  slurm_start_slurmd "$1" "$i"
}

# `down`: stops slurmctld, every slurmd and munged (what they left inside the hosts goes with
# the hosts' processes); works without the config, after a killed run. Files go with $DIR.
slurm_down() { # DIR
  local s=$1/slurm f pid
  [ -d "$s" ] || return 0
  if [ -f "$s/slurm.conf" ] && [ -s "$s/slurmctld.pid" ]; then
    SLURM_CONF=$s/slurm.conf timeout 5 scontrol shutdown >/dev/null 2>&1 || true
  fi
  for f in "$s"/slurmctld.pid "$s"/slurmd-*.pid "$s"/munged.pid; do
    [ -s "$f" ] || continue
    pid=$(cat "$f" 2>/dev/null) || continue
    # Only a process that is still the daemon the file names.
    case "$(cat "/proc/$pid/comm" 2>/dev/null)" in
      slurmctld|slurmd|munged) kill -TERM "$pid" 2>/dev/null || true ;;
    esac
  done
  local round
  for ((round = 0; round < 30; round++)); do
    local alive=0
    for f in "$s"/slurmctld.pid "$s"/slurmd-*.pid "$s"/munged.pid; do
      [ -s "$f" ] || continue
      pid=$(cat "$f" 2>/dev/null) || continue
      case "$(cat "/proc/$pid/comm" 2>/dev/null)" in
        slurmctld|slurmd|munged) alive=1 ;;
      esac
    done
    [ $alive = 1 ] || return 0
    sleep 0.1
  done
  for f in "$s"/slurmctld.pid "$s"/slurmd-*.pid "$s"/munged.pid; do
    [ -s "$f" ] || continue
    pid=$(cat "$f" 2>/dev/null) || continue
    case "$(cat "/proc/$pid/comm" 2>/dev/null)" in
      slurmctld|slurmd|munged) kill -KILL "$pid" 2>/dev/null || true ;;
    esac
  done
}
