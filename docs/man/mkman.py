#!/usr/bin/env python3
"""Writes graphd's man pages from the programs' own help, so that they never drift from the
settings table (daemon/config.c) or graphctl's commands: graphd(8) and graphd.conf(5) from
`graphd --help`, graphctl(1) from `graphctl --help`. Called by the Makefile at build time:

    docs/man/mkman.py BUILD_DIR OUT_DIR VERSION
"""
import os
import re
import subprocess
import sys


def run(exe, *args):
    return subprocess.run([exe, *args], capture_output=True, text=True, check=True).stdout


def esc(text):
    """troff-safe text: backslashes, and a leading dot or quote."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return re.sub(r"^([.'])", r"\\&\1", text, flags=re.M)


def settings(help_text):
    """[(name, description, default, reloadable)] from graphd --help's settings section."""
    out = []
    section = help_text.split("\nsettings (", 1)[1]
    for block in re.split(r"^  --", section, flags=re.M)[1:]:
        flag, body = block.split("\n", 1)
        body = " ".join(body.split())
        m = re.match(r"(.*)\. Default: (.*?)(; reloadable \(SIGHUP\))?\.$", body)
        if not m:
            sys.exit("mkman: cannot read the help of --%s: %r" % (flag, body))
        out.append((flag.replace("-", "_"), m.group(1), m.group(2), bool(m.group(3))))
    return out


def header(name, section, version, title):
    return ('.TH %s %s "" "graphd %s" "%s"\n' % (name.upper(), section, version, title))


def graphd_8(table, version):
    s = header("graphd", 8, version, "System Administration")
    s += ".SH NAME\ngraphd \\- graph capture and replay as a service\n"
    s += (".SH SYNOPSIS\n.B graphd\n[\\fB\\-\\-config\\fR \\fIFILE\\fR] "
          "[\\fB\\-\\-\\fISETTING\\fR \\fIVALUE\\fR ...]\n.br\n.B graphd \\-\\-check\\-config\n"
          "[\\fB\\-\\-config\\fR \\fIFILE\\fR] [\\fB\\-\\-\\fISETTING\\fR \\fIVALUE\\fR ...]\n")
    s += (".SH DESCRIPTION\ngraphd owns the node's accelerators and the shared memory pools that "
          "captured graphs run in. Training processes register TorchScript modules over gRPC, "
          "get graph handles back, and replay them each step; results come back through "
          "shared-memory tensors. Module code runs in per-user executor processes under a "
          "sandbox. The Python client (\\fBimport graphd\\fR) is a drop-in for "
          "\\fBtorch.cuda.make_graphed_callables\\fR.\n")
    s += ".SH OPTIONS\n"
    for opt, text in (("\\-\\-config \\fIFILE\\fR",
                       "settings file (default /etc/graphd/graphd.conf)."),
                      ("\\-\\-check\\-config", "read and check the settings, print them, and exit "
                       "(status 1 and the first error when they are wrong)."),
                      ("\\-\\-version", "print the version and exit."),
                      ("\\-\\-help", "print the options and settings and exit.")):
        s += ".TP\n.B %s\n%s\n" % (opt, text)
    s += (".PP\nEvery setting of \\fBgraphd.conf\\fR(5) is also a flag, its name with dashes: "
          "\\fB\\-\\-max\\-sessions 64\\fR sets \\fImax_sessions\\fR and wins over the file.\n")
    for name, desc, default, reloadable in table:
        s += ".TP\n.BI \\-\\-%s \" VALUE\"\n%s. Default: %s%s.\n" % (
            esc(name.replace("_", "-")), esc(desc), esc(default),
            "; reloadable" if reloadable else "")
    s += (".SH SIGNALS\n.TP\n.B SIGHUP\nreload the settings file: reloadable settings change at "
          "once (each logged with its old value), others are logged as needing a restart.\n"
          ".TP\n.B SIGTERM\nstop: in-flight calls get \\fIshutdown_grace_ms\\fR to finish.\n")
    s += (".SH FILES\n.TP\n.I /etc/graphd/graphd.conf\nsettings.\n.TP\n.I /run/graphd/graphd.sock\n"
          "control socket (gRPC); the session socket is beside it (\\fI.session\\fR).\n")
    s += ".SH SEE ALSO\n\\fBgraphd.conf\\fR(5), \\fBgraphctl\\fR(1), \\fBsystemd.service\\fR(5)\n"
    return s


def graphd_conf_5(table, version):
    s = header("graphd.conf", 5, version, "File Formats")
    s += ".SH NAME\ngraphd.conf \\- settings of the graphd daemon\n"
    s += (".SH DESCRIPTION\nAn INI file: settings go in the section \\fB[graphd]\\fR as "
          "\\fIname\\fR \\fB=\\fR \\fIvalue\\fR lines; \\fB#\\fR and \\fB;\\fR start comments. "
          "Byte sizes take K/M/G/T (powers of 1000) and Ki/Mi/Gi/Ti (powers of 1024). A flag "
          "\\fB\\-\\-\\fIname\\fR \\fIVALUE\\fR of \\fBgraphd\\fR(8) wins over the file. "
          "\\fBgraphd \\-\\-check\\-config\\fR checks a file. Settings marked reloadable change "
          "on SIGHUP; the others need a restart.\n.SH SETTINGS\n")
    for name, desc, default, reloadable in table:
        s += ".TP\n.B %s\n%s.\n.br\nDefault: %s%s.\n" % (
            esc(name), esc(desc), esc(default), "; reloadable" if reloadable else "")
    s += ".SH EXAMPLE\n.nf\n[graphd]\nmax_sessions = 256\ndefault_pool_limit = 64Gi\n.fi\n"
    s += ".SH SEE ALSO\n\\fBgraphd\\fR(8), \\fBgraphctl\\fR(1)\n"
    return s


def graphctl_1(help_text, version):
    s = header("graphctl", 1, version, "User Commands")
    s += ".SH NAME\ngraphctl \\- look at and manage a graphd daemon\n"
    s += ".SH SYNOPSIS\n.B graphctl\n[\\fIOPTIONS\\fR] \\fICOMMAND\\fR\n.SH DESCRIPTION\n"
    s += ".nf\n" + esc(help_text.rstrip("\n")) + "\n.fi\n"
    s += (".SH ENVIRONMENT\n.TP\n.B GRAPHD_ADDRESS\nthe daemon's address when "
          "\\fB\\-\\-address\\fR is not given.\n"
          ".SH SEE ALSO\n\\fBgraphd\\fR(8), \\fBgraphd.conf\\fR(5)\n")
    return s


def main():
    build, out, version = sys.argv[1:4]
    os.makedirs(out, exist_ok=True)
    table = settings(run(os.path.join(build, "graphd"), "--help"))
    pages = {"graphd.8": graphd_8(table, version),
             "graphd.conf.5": graphd_conf_5(table, version),
             "graphctl.1": graphctl_1(run(os.path.join(build, "graphctl"), "--help"), version)}
    for name, text in pages.items():
        with open(os.path.join(out, name), "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
