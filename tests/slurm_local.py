"""A private single-node Slurm on loopback for integration tests: munged, slurmctld and slurmd in a
fresh temp dir, clients pointed at it with SLURM_CONF. Every wait is bounded; the daemons are stopped
by PID (TERM, then KILL after a deadline)."""
from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol")


def available() -> str | None:
    """None if the binaries are there, else the reason to skip."""
    missing = [d for d in DAEMONS if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()]
    if missing:
        return f"Slurm/munge binaries not installed ({', '.join(missing)}); `apt-get install -y slurm-wlm munge`"
    if os.geteuid() != 0:
        return "the private Slurm runs its daemons as root (SlurmUser=root)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


CONF = """\
ClusterName=hpcbenchtest
FirstJobId={first_job}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=pmi2
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerType=sched/backfill
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
InactiveLimit=0
KillWait=5
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=localhost NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=30 State=UP
"""


class LocalSlurm:
    def __init__(self, root: Path) -> None:
        self.d = Path(root)
        self.procs: list[subprocess.Popen] = []
        self.conf = self.d / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    def start(self, timeout: float = 60.0) -> "LocalSlurm":
        d = self.d
        for sub in ("state", "spool", "munge"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o755)
        os.chmod(d / "munge", 0o755)
        key = d / "munge" / "munge.key"
        subprocess.run([_bin("mungekey"), "--create", f"--keyfile={key}"], check=True, timeout=30,
                       capture_output=True)
        os.chmod(key, 0o400)
        sock = d / "munge" / "munge.socket"
        self._spawn([_bin("munged"), "--foreground", f"--key-file={key}", f"--socket={sock}",
                     f"--pid-file={d / 'munge' / 'munged.pid'}", f"--log-file={d / 'munge' / 'munged.log'}",
                     f"--seed-file={d / 'munge' / 'munged.seed'}", "--force"], d / "munged.out")
        self._wait(lambda: sock.exists(), timeout, "munged socket")
        # a fresh job id per cluster: MPICH names its shared-memory segment after the PMI job (job.step), so a
        # killed earlier test cluster's leftover segment of job 1 would make this one's MPI_Init wait forever
        self.conf.write_text(CONF.format(d=d, first_job=random.randint(1000, 9_000_000), ctld_port=_free_port(), slurmd_port=_free_port(), munge_socket=sock))
        self._spawn([_bin("slurmctld"), "-D", "-i", "-f", str(self.conf)], d / "slurmctld.out")
        self._wait(lambda: self._ok(["scontrol", "ping"], "UP"), timeout, "slurmctld")
        self._spawn([_bin("slurmd"), "-D", "-f", str(self.conf), "-N", "localhost"], d / "slurmd.out")
        self._wait(lambda: self._ok(["sinfo", "-h", "-o", "%t"], "idle"), timeout, "slurmd to register idle")
        return self

    def _spawn(self, cmd: list[str], out: Path) -> None:
        fh = out.open("w")
        self.procs.append(subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=self.env,
                                           start_new_session=True))

    def _ok(self, cmd: list[str], needle: str) -> bool:
        try:
            p = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=10)
        except subprocess.TimeoutExpired:
            return False
        return p.returncode == 0 and needle in p.stdout

    def _wait(self, cond, timeout: float, what: str) -> None:  # noqa: ANN001
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited with {p.returncode} while waiting for {what}:\n"
                                       + self.logs())
            if cond():
                return
            time.sleep(0.3)
        raise RuntimeError(f"timed out after {timeout}s waiting for {what}\n" + self.logs())

    def run(self, cmd: list[str], timeout: float = 30, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout, cwd=cwd)

    def wait_job(self, job_id: str, timeout: float) -> str:
        """Wait until the job left the queue; its final state from scontrol (kept MinJobAge seconds)."""
        deadline = time.monotonic() + timeout
        state = "?"
        while time.monotonic() < deadline:
            p = self.run(["scontrol", "show", "job", job_id])
            for tok in p.stdout.split():
                if tok.startswith("JobState="):
                    state = tok.split("=", 1)[1]
            if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
                return state
            time.sleep(1.0)
        self.run(["scancel", job_id])
        raise RuntimeError(f"job {job_id} still {state} after {timeout}s\n" + self.logs())

    def logs(self) -> str:
        out = []
        for name in ("slurmctld.log", "slurmd.log", "munged.out", "slurmctld.out", "slurmd.out"):
            f = self.d / name
            if f.exists():
                out.append(f"--- {name} (tail)\n" + "\n".join(f.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(out)

    def _step_daemons(self) -> list[int]:
        """PIDs of processes of THIS private cluster (slurmstepd and job tasks): their environment
        names our slurm.conf. Nothing else on the machine matches."""
        needle = f"SLURM_CONF={self.conf}".encode()
        mine = {p.pid for p in self.procs} | {os.getpid()}
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in mine:
                continue
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:
                continue
        return pids

    def stop(self, grace: float = 10.0) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in reversed(self.procs):
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        for pid in self._step_daemons():  # step daemons outlive a killed slurmd
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    break
                time.sleep(0.5)
