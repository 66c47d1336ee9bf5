#!/usr/bin/env python3
"""ctest Tools.zcclrun_ctrl_c_newline: SIGINT to zcclrun while zccl-bench's rank 0 is in the middle of a table row
(the row is printed in pieces while it is measured). zcclrun's report of the interrupted rank must start on a line
of its own, and zcclrun must exit with 130. Deadline: 90 s."""
import re
import signal
import subprocess
import sys
import time

zcclrun, bench = sys.argv[1], sys.argv[2]
# SIGINT at its default disposition in the job (a background job of a script would have it ignored)
p = subprocess.Popen([zcclrun, "-n", "2", bench, "allreduce", "-b", "16M", "-e", "16M", "-n", "1000", "-w", "1"],
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
# wait until the row has begun (its size column is out), then interrupt
out = b""
deadline = time.time() + 60
while time.time() < deadline:
    chunk = p.stdout.read1(65536)
    if not chunk:
        break
    out += chunk
    if re.search(rb"\n +16777216 +4194304 +float +sum +-1", out):
        break
time.sleep(0.3)
p.send_signal(signal.SIGINT)
try:
    rest, _ = p.communicate(timeout=30)
except subprocess.TimeoutExpired:
    p.kill()
    print("FAIL: zcclrun did not stop within 30 s of SIGINT")
    sys.exit(1)
out = (out + rest).decode(errors="replace")
print(out[-600:])
report = re.search(r"(^|\n)([^\n]*)zcclrun: rank \d+ \(pid \d+\) was killed by signal 2 \(SIGINT\)", out)
if p.returncode != 130:
    print(f"FAIL: zcclrun exited with {p.returncode}, not 130")
    sys.exit(1)
if not report:
    print("FAIL: no report of the rank killed by SIGINT")
    sys.exit(1)
if report.group(2):
    print(f"FAIL: the report continues a half-written line: {report.group(2)!r}")
    sys.exit(1)
print("ctrl_c_newline: PASSED")
