"""tests/ports.py: a test's port is outside the ephemeral range and no other test process takes it
while the test lives (the restarted relay of test_relay_core's SIGKILL test found its port taken)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ports

HERE = Path(__file__).resolve().parent


def other_process_claims(count: int) -> set[int]:
    code = f"import ports\nprint(*(ports.claim() for _ in range({count})))"
    out = subprocess.run([sys.executable, "-c", code], cwd=HERE, capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(HERE), "PATH": ""}).stdout
    return set(map(int, out.split()))


def test_a_claimed_port_is_below_the_ephemeral_range_and_no_other_process_gets_it() -> None:
    first = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    mine = {ports.claim() for _ in range(200)}
    assert len(mine) == 200 and all(ports.LOW <= port < first for port in mine)
    try:
        assert not mine & other_process_claims(2000)
    finally:
        ports.release()
    assert other_process_claims(200)  # released: claimable again (and a process's claims die with it)
