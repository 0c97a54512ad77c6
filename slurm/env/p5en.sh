# shellcheck shell=bash
# EFA + NCCL environment for p5en.48xlarge (8x H200, 16 EFA interfaces) on AWS ParallelCluster,
# for NCCL over EFA through the aws-ofi-nccl plugin (the EFA installer's packages under /opt/amazon).
# Sourced by slurm/run.sbatch before it launches the ranks (srun and mpirun pass it on to them).
# Also source it before building on the head node, so that CMake finds Amazon's Open MPI:
#   source slurm/env/p5en.sh && bash jobs/build.sh
# Skipped (with a message, returning 0) where /opt/amazon/efa is absent: a laptop, CI, a non-EFA node.
# After an AMI or EFA-installer update, check with NCCL_DEBUG=INFO (it names the provider and plugin)
# and `srun shardlm bench-comm` (bus bandwidth).

if [ ! -d /opt/amazon/efa ]; then
  echo "[p5en.sh] /opt/amazon/efa is absent: EFA/NCCL settings skipped (not an EFA node)" >&2
  # shellcheck disable=SC2317  # exit: when run rather than sourced
  return 0 2>/dev/null || exit 0
fi

# Where the EFA installer puts libfabric (efa provider), Amazon's Open MPI and aws-ofi-nccl.
EFA_HOME=/opt/amazon/efa
OMPI_HOME=/opt/amazon/openmpi
OFI_NCCL_HOME=/opt/amazon/ofi-nccl

# The plugin's directory: lib, or lib64 (the EFA installer on Amazon Linux and from 1.44 on), or
# the Debian-style multiarch one.
OFI_NCCL_LIB=$OFI_NCCL_HOME/lib
for d in "$OFI_NCCL_HOME/lib" "$OFI_NCCL_HOME/lib64" "$OFI_NCCL_HOME/lib/x86_64-linux-gnu"; do
  if ls "$d"/libnccl-net*.so >/dev/null 2>&1; then OFI_NCCL_LIB=$d; break; fi
done
# The EFA libfabric and the plugin first, so NCCL and Open MPI load these and not a distro copy
# (lib64 too: where the installer puts them on Amazon Linux).
export LD_LIBRARY_PATH="$OFI_NCCL_LIB:$EFA_HOME/lib:$EFA_HOME/lib64:$OMPI_HOME/lib:$OMPI_HOME/lib64:${LD_LIBRARY_PATH:-}"
# Amazon's mpirun and the EFA tools (fi_info) ahead of any other MPI on the PATH.
export PATH="$OMPI_HOME/bin:$EFA_HOME/bin:$PATH"

# Inter-node traffic through the EFA provider only: never a silent fall-back to tcp/sockets.
export FI_PROVIDER=efa
# GPUDirect RDMA: p5-class EFA reads and writes GPU memory directly, with no bounce through host memory.
export FI_EFA_USE_DEVICE_RDMA=1

# Load aws-ofi-nccl: NCCL dlopens libnccl-net-<NCCL_NET_PLUGIN>.so from LD_LIBRARY_PATH (the
# library's name changed across plugin releases, so take the one installed).
# A plain libnccl-net.so is the one NCCL loads when NCCL_NET_PLUGIN is unset.
if [ -f "$OFI_NCCL_LIB/libnccl-net-ofi.so" ]; then
  export NCCL_NET_PLUGIN=ofi
elif [ -f "$OFI_NCCL_LIB/libnccl-net-aws-ofi.so" ]; then
  export NCCL_NET_PLUGIN=aws-ofi
elif [ -f "$OFI_NCCL_LIB/libnccl-net.so" ]; then
  unset NCCL_NET_PLUGIN
else
  echo "[p5en.sh] warning: no aws-ofi-nccl plugin under $OFI_NCCL_HOME (lib, lib64): NCCL will fall back to sockets" >&2
fi
# NCCL's bootstrap and socket fall-back on the ENA interface: never loopback or a docker bridge.
export NCCL_SOCKET_IFNAME="^lo,docker"
# Open MPI's TCP paths (out-of-band and btl) off the same interfaces, for the same reason.
export OMPI_MCA_btl_tcp_if_exclude=lo,docker0
export OMPI_MCA_oob_tcp_if_exclude=lo,docker0
# NCCL_PROTO is deliberately left alone: current aws-ofi-nccl supports LL/LL128 on p5-class RDMA,
# and forcing Simple (advice for plugin <= 1.5) costs latency on small messages.
# Warnings only by default; NCCL_DEBUG=INFO at submit time shows "NET/OFI Selected Provider is efa".
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"

# EFA pins (registers) the memory it sends from: lift the locked-memory limit, which Slurm may have
# copied from a login shell's small default (PropagateResourceLimits).
ulimit -l unlimited 2>/dev/null ||
  echo "[p5en.sh] warning: cannot raise the memlock limit ($(ulimit -l) KiB): EFA memory registration may fail" >&2
