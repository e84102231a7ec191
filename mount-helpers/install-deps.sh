#!/usr/bin/env bash
# Installs what shufflefs needs to build and run, when missing: fuse3, Open MPI, clang for
# rsmpi's bindings, iproute2/util-linux/python3 for the emulated hosts, and
# sshfs/openssh-server/slurm-wlm/munge for their storage host and Slurm. Sourced by tests/run.sh and mount-helpers/demo.sh; safe to run twice.
# Also exports what Open MPI needs to run as root and to put 4 ranks on 2 cores.
need_apt=()
command -v fusermount3 >/dev/null || need_apt+=(fuse3)
[ -f /usr/include/fuse3/fuse.h ] || need_apt+=(libfuse3-dev)
command -v mpirun >/dev/null || need_apt+=(openmpi-bin)
command -v mpicc >/dev/null || need_apt+=(libopenmpi-dev)
command -v clang >/dev/null || need_apt+=(clang)
ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || need_apt+=(libclang-dev)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
# The emulated hosts (mount-helpers/shufflefs-cluster): namespaces, shaping, nsenter, python3.
{ command -v ip && command -v tc; } >/dev/null || need_apt+=(iproute2)
command -v nsenter >/dev/null || need_apt+=(util-linux)
command -v python3 >/dev/null || need_apt+=(python3)
# Private hosts' disks (ext4 on a loop device), the storage host (sshd serving, sshfs mounting)
# and Slurm in the emulated cluster (munged, slurmctld, slurmd, srun).
command -v mkfs.ext4 >/dev/null || need_apt+=(e2fsprogs)
command -v losetup >/dev/null || need_apt+=(mount)
command -v sshfs >/dev/null || need_apt+=(sshfs)
[ -x /usr/sbin/sshd ] || need_apt+=(openssh-server)
command -v ssh-keygen >/dev/null || need_apt+=(openssh-client)
{ command -v slurmctld && command -v slurmd && command -v srun; } >/dev/null || need_apt+=(slurm-wlm)
command -v munged >/dev/null || need_apt+=(munge)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "== installing: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_rmaps_base_oversubscribe=1
