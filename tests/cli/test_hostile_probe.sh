#!/usr/bin/env bash
# The hostile-input probe (tests/probe/probe.py) over every command and file
# format: each case exits with its code and a message naming the file, key
# or flag, with no crash, hang, sanitizer report or write outside the paths
# it was given. The MPI fault cases (a rank stopped or killed mid-run) are
# pinned by test_comm_faults.sh and test_pp_stall.sh; `probe.py --faults`
# runs them too.
# HS_TEST_TIMEOUT: 300
set -u
python3 "$HS_SRC/tests/probe/probe.py" "$HS_BIN"
