#!/usr/bin/env bash
# Stop the SLURM daemons started by start_local_slurm.sh in the given folder.
#
#   bash slurm/local/stop_local_slurm.sh /tmp/glam-slurm
#
# Only the processes named in that folder's pid files are signalled.
set -uo pipefail

root_dir=${1:?usage: stop_local_slurm.sh DIR}
pids=()
for pid_file in slurmd.pid slurmctld.pid munge/munged.pid; do
    if [[ -s $root_dir/$pid_file ]]; then
        pids+=("$(<"$root_dir/$pid_file")")
        rm -f "$root_dir/$pid_file"
    fi
done
((${#pids[@]})) || exit 0
kill "${pids[@]}" 2>/dev/null
for _ in $(seq 100); do
    kill -0 "${pids[@]}" 2>/dev/null || exit 0
    sleep 0.1
done
kill -9 "${pids[@]}" 2>/dev/null
exit 0
