#!/bin/sh
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/graphd-epilog.sh): slurmd runs it as root on each
# node of a job once the job has ended. graphd ends a session when its client process exits, so
# a session the job's user still holds means a process of the job outlived it: say so on stderr
# and in syslog. Always exits 0: a failing Epilog would drain the node for the user's process.
# slurmd gives prologs and epilogs no search path: where make install and the distributions put
# graphctl and python3.
PATH=${PATH:+$PATH:}/usr/local/bin:/usr/bin:/bin
export PATH
uid=${SLURM_JOB_UID:?SLURM_JOB_UID is not set (run by slurmd as the Epilog)}
job="job ${SLURM_JOB_ID:-?} on $(hostname)"
if ! st=$(graphctl --json status 2>&1); then
    msg="graphd-epilog: $job: graphctl status failed: $st"
else
    n=$(printf '%s\n' "$st" | python3 -c '
import json, sys
print(sum(s["uid"] == int(sys.argv[1]) for s in json.load(sys.stdin)["sessions"]))' "$uid")
    [ "$n" = 0 ] && exit 0
    msg="graphd-epilog: $job: uid $uid still has $n graphd session(s) (graphctl status)"
fi
echo "$msg" >&2
logger -t graphd-epilog "$msg" 2>/dev/null || true
exit 0
