#!/usr/bin/env bash
# Starts a single-node Slurm (munge, slurmctld, slurmd) on this machine for the launcher
# tests, as ../shared/launchers.md describes; installs it with apt when missing.
# Idempotent: does nothing when `sinfo` already shows the node up. Needs root.
# Prints "slurm: ready" on success; exits non-zero with the reason otherwise.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

ready() { sinfo -h -o '%T' 2>/dev/null | grep -Eq '^(idle|mixed|allocated)'; }
if command -v sinfo >/dev/null 2>&1 && ready; then echo "slurm: ready"; exit 0; fi
[ "$(id -u)" -eq 0 ] || { echo "slurm: needs root to install and start Slurm" >&2; exit 1; }

if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
  apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends slurmd slurmctld slurm-client munge >/dev/null 2>&1 \
    || { apt-get -o DPkg::Lock::Timeout=600 update >/dev/null && apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends slurmd slurmctld slurm-client munge >/dev/null; }
fi

if [ ! -s /etc/munge/munge.key ]; then
  mkdir -p /etc/munge
  dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
fi
chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge && chown munge:munge /run/munge /var/log/munge /var/lib/munge
pgrep -x munged >/dev/null || runuser -u munge -- munged

cpus=$(nproc)
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
chown slurm:slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm 2>/dev/null || true
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=test
SlurmctldHost=localhost
SlurmUser=slurm
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd
for _ in $(seq 1 60); do
  if ready; then echo "slurm: ready"; exit 0; fi
  scontrol update nodename=localhost state=resume >/dev/null 2>&1 || true
  sleep 0.5
done
echo "slurm: the node did not come up within 30 s; sinfo says: $(sinfo 2>&1 | tr '\n' ' ')" >&2
exit 1
