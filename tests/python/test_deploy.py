"""The deployment files as shipped. The systemd unit verifies, and systemd's own offline security
analysis scores it at most 2.0 (issue 16). The Kubernetes manifests parse and fit together (issue
17). The Slurm TaskProlog gives jobs the unit's socket, and the Epilog reports a job's sessions
left on the node's daemon (issue 17). Skips with a message where systemd-analyze is absent. The
unit is checked as `make install` writes it (@SBINDIR@ replaced), with ExecStart pointing at this
build's daemon so that verify can check the binary exists."""
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(os.environ.get("GRAPHD_BUILD", os.path.join(ROOT, "build")))
UNIT = os.path.join(ROOT, "deploy", "systemd", "graphd.service")
SOCKET = os.path.join(ROOT, "deploy", "systemd", "graphd.socket")
MAX_EXPOSURE = 2.0

analyze = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(analyze is None,
                                   reason="systemd-analyze is not installed (package systemd)")


@pytest.fixture
def unit(tmp_path):
    text = open(UNIT).read().replace("@SBINDIR@", BUILD).replace("@DOCDIR@", "/usr/share/doc")
    path = tmp_path / "graphd.service"
    path.write_text(text)
    # Beside it, as installed: the socket unit names the service, the service's Also= the socket.
    (tmp_path / "graphd.socket").write_text(open(SOCKET).read())
    return path


def verify(path):
    """systemd-analyze verify, which also runs `man` on each man: Documentation= page: they are
    this build's pages, laid out as make install puts them."""
    man = path.parent / "man"
    for page in os.listdir(os.path.join(BUILD, "man")):
        section = man / ("man" + page.rsplit(".", 1)[1])
        section.mkdir(parents=True, exist_ok=True)
        if not (section / page).exists():
            (section / page).symlink_to(os.path.join(BUILD, "man", page))
    return subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True,
                          env=dict(os.environ, MANPATH=str(man)))


@needs_analyze
def test_unit_verifies(unit):
    r = verify(unit)
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr


@needs_analyze
def test_socket_unit_verifies(unit):
    r = verify(unit.parent / "graphd.socket")
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr


def test_socket_unit_is_the_configured_control_socket(unit):
    """graphd takes one inherited socket, the control socket at listen (daemon/activation.c): the
    socket unit listens there, once, and systemd's directory is the one the service keeps."""
    text = (unit.parent / "graphd.socket").read_text()
    streams = re.findall(r"^ListenStream=(\S+)", text, re.M)
    conf = open(os.path.join(ROOT, "deploy", "systemd", "graphd.conf")).read()
    listen = re.search(r"^listen\s*=\s*unix:(\S+)", conf, re.M).group(1)
    assert streams == [listen]
    assert not re.search(r"^Listen(Datagram|SequentialPacket|FIFO)=", text, re.M)
    service = unit.read_text()
    assert re.search(r"^RuntimeDirectory=%s$" % os.path.basename(os.path.dirname(listen)),
                     service, re.M)
    # Else stopping the service would delete the socket systemd still listens on.
    assert re.search(r"^RuntimeDirectoryPreserve=yes", service, re.M)
    assert "@" not in re.search(r"^Documentation=(.*)$", service, re.M).group(1)


@needs_analyze
def test_unit_security_score(unit):
    r = subprocess.run([analyze, "security", "--offline=yes", "--no-pager", str(unit)],
                       capture_output=True, text=True)
    m = re.search(r"Overall exposure level for graphd\.service: ([0-9.]+)", r.stdout)
    assert m, r.stdout + r.stderr
    score = float(m.group(1))
    assert score <= MAX_EXPOSURE, "exposure %.1f > %.1f:\n%s" % (score, MAX_EXPOSURE, r.stdout)


@needs_analyze
def test_unit_keeps_what_graphd_needs(unit):
    """Hardening must not take away what the daemon uses: its sandboxing syscalls, its delegated
    cgroup subtree, unix sockets, and no RuntimeDirectory duplicated by a tmpfiles entry."""
    text = unit.read_text()
    assert re.search(r"^SystemCallFilter=@system-service .*\bseccomp\b.*\blandlock_restrict_self\b",
                     text, re.M)
    assert re.search(r"^Delegate=memory", text, re.M)
    assert re.search(r"^ReadWritePaths=/sys/fs/cgroup/system\.slice/graphd\.service", text, re.M)
    assert re.search(r"^RestrictAddressFamilies=.*\bAF_UNIX\b", text, re.M)
    assert re.search(r"^RuntimeDirectory=graphd", text, re.M)
    assert not os.path.exists(os.path.join(ROOT, "deploy", "systemd", "graphd-tmpfiles.conf"))


# ---- Kubernetes (deploy/kubernetes): parsed and checked, never applied (no cluster here) ----

K8S = os.path.join(ROOT, "deploy", "kubernetes")


def manifests(name):
    import yaml
    with open(os.path.join(K8S, name)) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def one(docs, kind):
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, "%d %s in the manifest" % (len(found), kind)
    return found[0]


def conf_value(text, name):
    m = re.search(r"^\s*%s\s*=\s*(\S+)" % name, text, re.M)
    return m.group(1) if m else None


def test_daemonset_serves_the_node_socket_directory():
    docs = manifests("graphd.yaml")
    assert {d["kind"] for d in docs} == {"Namespace", "ConfigMap", "DaemonSet"}
    ds = one(docs, "DaemonSet")
    assert ds["apiVersion"] == "apps/v1"
    conf = one(docs, "ConfigMap")["data"]["graphd.conf"]
    listen = conf_value(conf, "listen")
    assert listen and listen.startswith("unix:/run/graphd/")
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    # The socket directory is the node's, so training pods on the node reach the same daemon.
    sock_dir = os.path.dirname(listen[len("unix:"):])
    assert vols[mounts[sock_dir]]["hostPath"]["path"] == sock_dir
    # The config file the container reads is the ConfigMap's.
    assert c["args"] == ["--config", "/etc/graphd/graphd.conf"]
    assert vols[mounts["/etc/graphd"]]["configMap"]["name"] == "graphd-config"
    # Probes ask the daemon itself, on its socket.
    for probe in ("readinessProbe", "livenessProbe"):
        cmd = c[probe]["exec"]["command"]
        assert os.path.basename(cmd[0]) == "graphctl" and "status" in cmd
        assert cmd[cmd.index("--address") + 1] == listen
    # Metrics: the port the config listens on is the one the pod declares and Prometheus scrapes.
    port = int(conf_value(conf, "metrics_listen").rsplit(":", 1)[1])
    assert {"name": "metrics", "containerPort": port, "protocol": "TCP"} in c["ports"]
    ann = ds["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/port"] == str(port) and ann["prometheus.io/path"] == "/metrics"
    # Least privilege: not root, no capabilities, no privilege escalation, read-only root.
    sc, psc = c["securityContext"], pod["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"] and "privileged" not in sc
    assert psc["seccompProfile"]["type"] == "RuntimeDefault"


def test_training_job_reaches_the_daemon():
    ds_docs = manifests("graphd.yaml")
    conf = one(ds_docs, "ConfigMap")["data"]["graphd.conf"]
    listen = conf_value(conf, "listen")
    gid = one(ds_docs, "DaemonSet")["spec"]["template"]["spec"]["securityContext"]["runAsGroup"]
    job = one(manifests("training-job.yaml"), "Job")
    assert job["apiVersion"] == "batch/v1"
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["GRAPHD_ADDRESS"] == listen
    sock_dir = os.path.dirname(listen[len("unix:"):])
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert vols[mounts[sock_dir]]["hostPath"]["path"] == sock_dir
    # The sockets are 0660 to the graphd group: the job joins it, and runs as itself.
    assert conf_value(conf, "socket_mode") == "0660"
    assert gid in pod["securityContext"]["supplementalGroups"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False


def test_image_installs_where_the_manifests_look():
    text = open(os.path.join(K8S, "Dockerfile")).read()
    assert "make install PREFIX=/usr" in text
    assert re.search(r"--gid 9464 graphd", text) and re.search(r"--uid 9464", text)
    ds = one(manifests("graphd.yaml"), "DaemonSet")
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    assert c["readinessProbe"]["exec"]["command"][0] == "/usr/bin/graphctl"


SLURM = os.path.join(ROOT, "deploy", "slurm")


def test_slurm_taskprolog_exports_the_units_socket():
    out = subprocess.run([os.path.join(SLURM, "graphd-taskprolog.sh")], capture_output=True,
                         text=True, check=True, env={"PATH": "/usr/bin:/bin"}).stdout
    (line,) = out.splitlines()  # slurmstepd takes "export NAME=value" lines into the task's env
    m = re.fullmatch(r"export GRAPHD_ADDRESS=(\S+)", line)
    conf = open(os.path.join(ROOT, "deploy", "systemd", "graphd.conf")).read()
    assert m and m.group(1) == conf_value(conf, "listen"), out


def epilog(job_uid, address):
    env = dict(os.environ, PATH=BUILD + os.pathsep + os.environ["PATH"], GRAPHD_ADDRESS=address,
               SLURM_JOB_UID=str(job_uid), SLURM_JOB_ID="77")
    return subprocess.run([os.path.join(SLURM, "graphd-epilog.sh")], capture_output=True,
                          text=True, env=env, timeout=30)


def test_slurm_epilog_reports_a_jobs_leftover_sessions(daemon, tmp_path):
    import graphd
    with graphd.Client(daemon.address):  # a session of this uid, as a process outliving its job
        r = epilog(os.getuid(), daemon.address)
    assert r.returncode == 0 and r.stdout == "", r
    assert re.search(r"job 77 on .*: uid %d still has [1-9]\d* graphd session" % os.getuid(),
                     r.stderr), r.stderr
    # a uid with no session on the daemon: nothing to say
    unused = max(int(s["uid"]) for s in graphd.default_client().status()["sessions"]) + 4242
    r = epilog(unused, daemon.address)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", ""), r
    # a daemon that does not answer is reported, and the node is not drained (exit 0)
    r = epilog(unused, "unix:%s" % (tmp_path / "none.sock"))
    assert r.returncode == 0 and "graphctl status failed" in r.stderr, r
