#!/bin/sh
# Slurm TaskProlog (slurm.conf: TaskProlog=/etc/slurm/graphd-taskprolog.sh): slurmstepd runs it
# as the job's user before each task, and a line "export NAME=value" on its output enters the
# task's environment. Every rank then finds its node's daemon (docs/OPERATIONS.md, "Slurm").
echo "export GRAPHD_ADDRESS=unix:/run/graphd/graphd.sock"
