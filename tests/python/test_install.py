"""make install into a DESTDIR, then make uninstall: what is installed is complete and usable (a
program builds against the installed header through pkg-config and runs against the installed,
versioned library; the daemon finds its executor where it looks), and uninstall removes exactly
what install wrote (issue 16)."""
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(os.environ.get("GRAPHD_BUILD", os.path.join(ROOT, "build")))
PREFIX = "/usr/local"

if os.path.basename(BUILD) != "build":
    pytest.skip("install is checked on the default build only", allow_module_level=True)


def make(*args, dest):
    return subprocess.run(["make", "-s", "--no-print-directory", "-C", ROOT, *args,
                           "DESTDIR=" + str(dest), "PREFIX=" + PREFIX],
                          capture_output=True, text=True, timeout=300)


def tree(root):
    out = set()
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            out.add(os.path.relpath(os.path.join(d, name), root))
    return out


def test_install_then_uninstall(tmp_path):
    dest = tmp_path / "root"
    dest.mkdir()
    r = make("install", dest=dest)
    assert r.returncode == 0, r.stdout + r.stderr

    def p(rel):
        return os.path.join(str(dest), rel.lstrip("/"))

    # The daemon looks for its executor beside itself, else in ../libexec/graphd/.
    assert os.access(p(PREFIX + "/sbin/graphd"), os.X_OK)
    assert os.access(p(PREFIX + "/libexec/graphd/graphd-executor"), os.X_OK)
    # Stripped binaries: no symbol table.
    for exe in ("/sbin/graphd", "/bin/graphctl", "/libexec/graphd/graphd-executor"):
        sections = subprocess.run(["readelf", "-S", p(PREFIX + exe)], capture_output=True,
                                  text=True).stdout
        assert ".symtab" not in sections, exe
    # The versioned library, its soname link and the development link.
    version = open(os.path.join(ROOT, "VERSION")).read().strip()
    real = p(PREFIX + "/lib/libgraphd.so." + version)
    assert os.path.isfile(real) and not os.path.islink(real)
    assert os.readlink(p(PREFIX + "/lib/libgraphd.so.0")) == "libgraphd.so." + version
    assert os.readlink(p(PREFIX + "/lib/libgraphd.so")) == "libgraphd.so.0"
    dyn = subprocess.run(["readelf", "-d", real], capture_output=True, text=True).stdout
    assert "Library soname: [libgraphd.so.0]" in dyn
    # Man pages, docs, licence, unit.
    for rel in ("/share/man/man8/graphd.8", "/share/man/man5/graphd.conf.5",
                "/share/man/man1/graphctl.1", "/share/doc/graphd/README.md",
                "/share/doc/graphd/LICENSE"):
        assert os.path.isfile(p(PREFIX + rel)), rel
    assert os.path.isfile(p("/lib/systemd/system/graphd.service"))
    service = open(p("/lib/systemd/system/graphd.service")).read()
    assert PREFIX + "/sbin/graphd" in service
    assert "Documentation=man:graphd(8) man:graphd.conf(5) file://%s/share/doc/graphd/docs/" \
        "OPERATIONS.md\n" % PREFIX in service
    assert os.path.isfile(p(PREFIX + "/share/doc/graphd/docs/OPERATIONS.md"))
    assert os.path.isfile(p("/lib/systemd/system/graphd.socket"))

    # A client builds against the installed files through pkg-config and runs.
    env = dict(os.environ, PKG_CONFIG_PATH=p(PREFIX + "/lib/pkgconfig"),
               PKG_CONFIG_SYSROOT_DIR=str(dest))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "graphd"], env=env,
                           capture_output=True, text=True)
    assert flags.returncode == 0, flags.stderr
    src = tmp_path / "hello.c"
    src.write_text('#include <graphd.h>\n#include <stdio.h>\n'
                   'int main(void) { printf("%s\\n", graphd_version()); return 0; }\n')
    exe = tmp_path / "hello"
    cc = subprocess.run(["cc", "-o", str(exe), str(src)] + flags.stdout.split(),
                        capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True,
                         env=dict(os.environ, LD_LIBRARY_PATH=p(PREFIX + "/lib")))
    assert run.returncode == 0 and run.stdout.strip() == version, run.stdout + run.stderr

    # A config file already there is kept by install and by uninstall.
    conf = p("/etc/graphd/graphd.conf")
    with open(conf, "w") as f:
        f.write("# the operator's\n")
    assert make("install", dest=dest).returncode == 0
    assert open(conf).read() == "# the operator's\n"

    r = make("uninstall", dest=dest)
    assert r.returncode == 0, r.stdout + r.stderr
    assert tree(dest) == {"etc", "etc/graphd", "etc/graphd/graphd.conf"}
    os.unlink(conf)


def test_uninstall_without_install_says_so(tmp_path):
    r = make("uninstall", dest=tmp_path)
    assert r.returncode != 0
    assert "nothing installed" in r.stderr


def test_man_pages_cover_every_setting():
    """graphd.conf(5) and graphd(8) are generated from the settings table: every setting that
    --check-config prints has an entry in both, with its default."""
    out = subprocess.run([os.path.join(BUILD, "graphd"), "--check-config", "--config",
                          "/dev/null"], capture_output=True, text=True, check=True).stdout
    names = [line.split(" = ", 1)[0] for line in out.splitlines()[1:]]
    conf = open(os.path.join(BUILD, "man", "graphd.conf.5")).read()
    daemon = open(os.path.join(BUILD, "man", "graphd.8")).read()
    for name in names:
        assert ".B %s\n" % name.replace("-", "\\-") in conf, name
        assert "\\-\\-%s" % name.replace("_", "\\-") in daemon, name
    assert conf.count("Default: ") == len(names)
