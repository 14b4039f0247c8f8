"""A real single-node Slurm cluster for the command-line tests: munged,
slurmctld and slurmd (Debian 12: slurm-wlm 22.05, munge 0.5.15) started from a
temporary folder with their own socket, ports, state, spool and logs, so
nothing in /etc, /run or /var is used or touched.

    from slurm_cluster import single_node_slurm
    with single_node_slurm() as env:          # env: os.environ + SLURM_CONF
        subprocess.run(["sbatch", "--wait", ...], env=env)

Where the daemons cannot start (a program missing, or the node not idle
within STARTUP_S) it prints why, with the daemons' log tails, and exits 77,
the tests' SKIP_RETURN_CODE. Once the cluster is up, anything that fails is
the test's failure, not a skip. Teardown (also on an exception or a failed
check) cancels the jobs, kills the daemons' process groups and every process
still carrying this cluster's SLURM_CONF (job steps, the jobs themselves),
and removes the folder unless KVSCOPE_KEEP_SLURM is set. SIGTERM tears down
the same way; a test killed outright (SIGKILL) still takes the daemons with it
(PR_SET_PDEATHSIG), though not a job that was running at that moment.

Gotchas met while prototyping this by hand in the Debian 12 container:
- Installing the packages leaves no daemon running (policy-rc.d, no systemd)
  and the packaged configuration (/etc/slurm, /var/spool/slurmctld owned by
  the `slurm` user, /run/munge) is not usable as is: a root-run slurmctld with
  the default SlurmUser=slurm cannot write its state. Everything here lives in
  one temp folder, SlurmUser=root (or the current user).
- munged refuses to run as root without --force, and uses /run/munge,
  /etc/munge/munge.key, /var/lib/munge and /var/log/munge unless told
  otherwise: --socket, --key-file, --seed-file, --pid-file, --log-file all
  point into the temp folder; Slurm finds that socket through
  AuthInfo=socket=PATH (both auth/munge and cred/munge read it).
- munged checks the key's permissions (0600, owned by the user; `mungekey
  --create` makes it so) and warns "Socket is inaccessible" when a parent
  folder lacks o+x: mkdtemp makes 0700 folders, so the root is chmod 0755.
- The node name must be what slurmd thinks it is (the short hostname) and
  the controller's name what slurmctld thinks it is ("this host not valid
  controller" otherwise). The container's hostname (`vm`) resolves through
  /etc/hosts, but not every container's does: the addresses are given
  explicitly (SlurmctldHost=NAME(127.0.0.1), NodeAddr=127.0.0.1) and slurmd
  gets -N NAME, so no name lookup is needed.
- Default ports 6817/6818 may be taken (a packaged slurmctld, a second test
  run): free ports are picked at random.
- RealMemory above the machine's makes slurmd register the node INVALID
  ("Low RealMemory"); a small value (100 MB) is always below it. Without
  CR_*_Memory memory is not a consumable, so jobs need no --mem.
- slurmd and slurmctld print "mpi/pmix_v4: can not load PMIx library" errors
  at start (the Debian package builds the PMIx plugin, libpmix is not
  installed): harmless with MpiDefault=none.
- munged logs "Info: Unauthorized credential for client UID=0" a few times
  per job: an Info line, not an error; every job runs and authenticates. slurmctld logs "Configured MailProg is invalid"
  (no mailutils): MailProg=/bin/true.
- No accounting (sacct says "accounting storage is disabled"): the job's
  result is sbatch --wait's exit status (0 only when every array task exits
  0) and the files the tasks write.
- A client pointed at a missing SLURM_CONF retries for 60 s before failing,
  and one without SLURM_CONF looks for /etc/slurm/slurm.conf, then DNS SRV
  records: the readiness poll gives each client call its own timeout.
- Once the controller and slurmd are up the node goes from UNKNOWN to IDLE
  within a second or two (ReturnToService=2); the poll waits for `idle`.
- The batch job inherits the submitting environment (sbatch --export=ALL by
  default), SLURM_CONF included, and runs in the submission folder.
- Job ids start at 1 on a fresh cluster, so a test that looks for the id in
  a program's output would find "1" anywhere: FirstJobId is random (5 digits).
- slurmstepd and the job's processes are not in the daemons' process
  groups: killing slurmd leaves a running job behind. Teardown scancels first
  and then kills whatever still has this cluster's SLURM_CONF in its
  environment (/proc/PID/environ).
"""
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

STARTUP_S = 60
SKIP = 77
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "sinfo", "scontrol", "scancel")


def skip(why):
    print(f"SKIP: {why}", flush=True)
    sys.exit(SKIP)


def _which(name):
    # The daemons live in /usr/sbin, which a non-root PATH often lacks.
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin:/usr/local/sbin"
    return shutil.which(name, path=path)


def _free_ports(n):
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


# Start-up lines every healthy start prints (no libpmix; a fresh state folder).
_NOISE = ("pmix", "PMIx", "MPI: Cannot create context", "state file", "Trying backup state save")


def _tail(path, n=20):
    try:
        with open(path, errors="replace") as f:
            lines = [line for line in f.read().splitlines() if not any(x in line for x in _NOISE)]
    except OSError as e:
        return f"  ({e.strerror})"
    return "\n".join("  " + line for line in lines[-n:]) or "  (empty)"


class _Cluster:
    def __init__(self, root):
        self.root = root
        self.procs = []          # (name, Popen, log file) in start order
        self.conf = os.path.join(root, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        # Client and daemon programs in /usr/sbin must be found by the test too.
        self.env["PATH"] = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin"
        # A test run inside a Slurm job (CI on a cluster) must not hand that
        # job's SLURM_* variables to this cluster's clients.
        for k in [k for k in self.env if k.startswith("SLURM_") and k != "SLURM_CONF"]:
            del self.env[k]

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    def start(self, name, argv):
        log = self.path("log", name + ".out")
        with open(log, "w") as out:
            p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=self.env, cwd=self.root, start_new_session=True,
                                 preexec_fn=_die_with_parent)
        self.procs.append((name, p, log))
        return p

    def client(self, *argv, timeout=10):
        try:
            p = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout)
            return p.returncode, (p.stdout + p.stderr).strip()
        except subprocess.TimeoutExpired:
            return None, f"{argv[0]}: no answer within {timeout} s"

    def logs(self):
        parts = []
        for name, p, log in self.procs:
            state = "running" if p.poll() is None else f"exited {p.returncode}"
            # Run in the foreground, each daemon copies its log file to stderr.
            parts.append(f"--- {name} ({state}), {log} (without PMIx and fresh-state noise):\n"
                         f"{_tail(log)}")
        return "\n".join(parts)

    def stop(self):
        if any(p.poll() is None for name, p, _ in self.procs if name == "slurmctld"):
            self.client("scancel", "--partition=debug", "--full", timeout=5)
        for name, p, _ in reversed(self.procs):
            _kill_group(p)
        self._kill_leftovers()

    def _kill_leftovers(self):
        # Job steps and job processes started by slurmd live in their own
        # sessions; they carry SLURM_CONF=<this cluster's conf>, which names
        # only this cluster (the folder is unique).
        needle = b"SLURM_CONF=" + self.conf.encode() + b"\0"
        for _ in range(2):
            found = []
            for pid in os.listdir("/proc"):
                if not pid.isdigit() or int(pid) == os.getpid():
                    continue
                try:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        if needle in f.read() + b"\0":
                            found.append(int(pid))
                except OSError:
                    pass
            for pid in found:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            if not found:
                return
            time.sleep(0.5)


def _die_with_parent():
    # The daemons run in the foreground (-D, --foreground), so a test killed
    # outright (SIGKILL, a CTest timeout) takes them with it: PR_SET_PDEATHSIG.
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _kill_group(p, grace=10):
    if p.poll() is not None:
        with contextlib.suppress(OSError):
            os.killpg(p.pid, signal.SIGKILL)   # children it may have left
        return
    with contextlib.suppress(OSError):
        os.killpg(p.pid, signal.SIGTERM)
    try:
        p.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(OSError):
        os.killpg(p.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(5)


def _write_conf(c, user, node, cpus):
    ctld_port, slurmd_port = _free_ports(2)
    munge_socket = c.path("munge", "munge.socket")
    with open(c.conf, "w") as f:
        f.write(f"""# written by tests/cli/slurm_cluster.py: a throwaway single-node cluster
ClusterName=kvscope-test
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={c.path("state")}
SlurmdSpoolDir={c.path("spool")}
SlurmctldPidFile={c.path("slurmctld.pid")}
SlurmdPidFile={c.path("slurmd.pid")}
SlurmctldLogFile={c.path("log", "slurmctld.log")}
SlurmdLogFile={c.path("log", "slurmd.log")}
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=300
MailProg=/bin/true
FirstJobId={random.randint(10000, 99999)}
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=100 State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
""")
    return munge_socket


@contextlib.contextmanager
def single_node_slurm(startup_s=STARTUP_S):
    """Starts the cluster, waits (polling, with a deadline) for its node to be
    idle, yields the environment to run Slurm clients with, and tears it all
    down. Exits 77 where the daemons cannot start."""
    missing = [d for d in DAEMONS if not _which(d)]
    if missing:
        skip("cannot start a single-node Slurm: " + ", ".join(missing) + " not found "
             "(apt-get install slurmctld slurmd slurm-client munge)")
    user = "root" if os.geteuid() == 0 else None
    if user is None:
        import pwd
        user = pwd.getpwuid(os.geteuid()).pw_name
    node = socket.gethostname().split(".")[0]
    cpus = os.cpu_count() or 1

    root = tempfile.mkdtemp(prefix="kvscope-slurm-")
    os.chmod(root, 0o755)
    for d in ("munge", "state", "spool", "log"):
        os.makedirs(os.path.join(root, d))
    os.chmod(os.path.join(root, "munge"), 0o755)
    c = _Cluster(root)
    t0 = time.monotonic()

    def terminated(signum, frame):   # SIGTERM: tear down as for any other failure
        raise SystemExit(128 + signum)
    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        key = c.path("munge", "munge.key")
        code, out = c.client(_which("mungekey"), "--create", f"--keyfile={key}")
        if code != 0:
            skip(f"cannot start a single-node Slurm: mungekey --create failed: {out}")
        munge_socket = _write_conf(c, user, node, cpus)
        c.start("munged", [_which("munged"), "--foreground", "--force", f"--socket={munge_socket}",
                           f"--key-file={key}", f"--pid-file={c.path('munge', 'munged.pid')}",
                           f"--log-file={c.path('log', 'munged.log')}",
                           f"--seed-file={c.path('munge', 'munged.seed')}"])
        c.start("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", c.conf])
        c.start("slurmd", [_which("slurmd"), "-D", "-N", node, "-f", c.conf])

        deadline = t0 + startup_s
        last = ""
        while True:
            dead = [f"{n} exited {p.returncode}" for n, p, _ in c.procs if p.poll() is not None]
            if dead:
                last = ", ".join(dead)
                break
            code, out = c.client("sinfo", "--noheader", "--node", node, "--format=%T", timeout=10)
            last = out or f"sinfo exit {code}"
            if code == 0 and out.strip() == "idle":
                break
            if code == 0 and out.strip().startswith("inval"):
                break          # slurmd's node does not match the configuration: final
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if last != "idle":
            _, reason = c.client("sinfo", "-R", timeout=5)
            logs = c.logs()
            c.stop()
            skip(f"cannot start a single-node Slurm: node {node} not idle after "
                 f"{time.monotonic() - t0:.0f} s (last: {last}; sinfo -R: {reason or '-'})\n{logs}")
        c.startup_s = time.monotonic() - t0
        print(f"single-node Slurm up in {c.startup_s:.1f} s: node {node}, {cpus} CPUs, "
              f"SLURM_CONF={c.conf}", flush=True)
        c.env["KVSCOPE_SLURM_STARTUP_S"] = f"{c.startup_s:.1f}"
        yield c.env
    except BaseException:
        # A failure once the cluster is up is the test's: show the logs.
        if sys.exc_info()[0] is not SystemExit:
            print(c.logs(), file=sys.stderr)
        raise
    finally:
        c.stop()
        signal.signal(signal.SIGTERM, previous)
        if os.environ.get("KVSCOPE_KEEP_SLURM"):
            print(f"kept {root} (KVSCOPE_KEEP_SLURM)")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    # By hand: python3 tests/cli/slurm_cluster.py  -> a 2-task array job.
    with single_node_slurm() as env:
        out = tempfile.mkdtemp(prefix="kvscope-slurm-job-")
        p = subprocess.run(["sbatch", "--wait", "--array=0-1", f"--output={out}/task.%a",
                            "--wrap", "echo task $SLURM_ARRAY_TASK_ID"], env=env, cwd=out,
                           capture_output=True, text=True, timeout=120)
        print(p.stdout + p.stderr, end="")
        for k in (0, 1):
            print(open(f"{out}/task.{k}").read(), end="")
        shutil.rmtree(out)
        sys.exit(p.returncode)
