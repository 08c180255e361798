#!/bin/bash
# Start a one-machine Slurm cluster (Debian's slurm-wlm, as root), so that
# tests/frontends/test_spmd.py's srun test runs instead of skipping:
#   apt-get install -y slurm-wlm && bash tests/slurm/one_machine_cluster.sh
# The node gets this machine's CPUs; jobs oversubscribe them (srun --overcommit).
set -euo pipefail
host=$(hostname)
state=${SLURM_TEST_DIR:-/tmp/ddp_verify-slurm}
mkdir -p "$state/state" "$state/spool" /run/munge
chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
pgrep -x munged >/dev/null || munged --force
node=$(slurmd -C | head -1)
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=ddp-verify-test
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
StateSaveLocation=$state/state
SlurmdSpoolDir=$state/spool
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd.log
${node%% UpTime=*} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
pgrep -x slurmctld >/dev/null || slurmctld -c -i
pgrep -x slurmd >/dev/null || slurmd -c
for _ in $(seq 20); do
    sinfo -h -o %t | grep -q idle && { sinfo; exit 0; }
    sleep 0.5
done
echo "the node did not come up: see $state/slurmd.log" >&2
exit 1
