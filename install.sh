#!/bin/sh
# Install or upgrade hpc-batch on a systemd machine.
#
#   curl -fsSL https://raw.githubusercontent.com/Yiannis128/hpc-batch/master/install.sh | sudo sh
#   curl -fsSL .../install.sh | sudo sh -s -- 0.2.0 --admin-group wheel
#   sudo sh install.sh ./dist/hpc_batch-0.2.0-py3-none-any.whl
#   sudo sh install.sh /path/to/checkout
#
# The first argument, unless it starts with "-", is what to pip install: a
# version, a wheel or sdist, a checkout or a requirement (default: what the
# last install used, else hpc-batch from PyPI). Everything after it goes to
# hpc-batch-install (see its --help). The venv is $HPC_BATCH_PREFIX, else the
# one an earlier install recorded, else /opt/hpc-batch.
#
# This script only gets a venv with the package in it; hpc-batch-install,
# from that package, does the rest, so both ways to install do the same.
set -eu

# ROOT_ONLY_PY FLAG VALUE [NOTE]: exit 1, saying why, if pip (for --spec)
# or the daemon (for --prefix) would run as root what someone else can
# change. The rule of find_unsafe() in hpc_batch/install/safety.py, which checks
# again (the bin dir too) but only after this script has run pip: the path
# and every directory above it owned by root and not group- or
# world-writable, root-owned symlinks followed, a sticky directory (/tmp)
# allowed above a root-owned entry only. A missing prefix is fine, as the
# venv is created as root, unless it would go straight into a sticky one.
# A checkout is checked as a directory, not file by file: pip builds it as
# root, so whoever can write the directory can run code as root.
# shellcheck disable=SC2016  # Python source: its $ and quotes are not the shell's
ROOT_ONLY_PY='
import os, pwd, re, stat, sys, urllib.parse

flag, value = sys.argv[1], sys.argv[2]
note = sys.argv[3] if len(sys.argv) > 3 else ""
OTHERS = stat.S_IWGRP | stat.S_IWOTH
ARCHIVES = (".whl", ".zip", ".tar.gz", ".tgz", ".tar.bz2", ".tbz", ".tar.xz",
            ".txz", ".tar.lz", ".tlz", ".tar.lzma", ".tar")


def refuse(problem, fix):
    sys.exit("install.sh: refusing %s %s: %s, and root would run code from it; %s%s"
             % (flag, value, problem, fix, note))


def who(uid):
    try:
        return "%s (uid %d)" % (pwd.getpwuid(uid).pw_name, uid)
    except KeyError:
        return "uid %d" % uid


def steps(path):
    names = [n for n in path.split("/") if n and n != "."]
    return ["/"] + names if path.startswith("/") else names


def shared(st):
    return (stat.S_ISDIR(st.st_mode) and bool(st.st_mode & stat.S_ISVTX)
            and bool(st.st_mode & OTHERS))


def unsafe(path, missing_ok):
    """(component, problem) for the first part of path others can change."""
    todo, cur, open_dir, links = steps(path)[::-1], "", False, 0
    while todo:
        name = todo.pop()
        if name == "..":
            cur = os.path.dirname(cur)
            open_dir = shared(os.lstat(cur))
            continue
        child = os.path.join(cur, name)
        try:
            st = os.lstat(child)
        except FileNotFoundError:
            if open_dir:
                return child, "it does not exist and anyone can create it first in " + cur
            return None if missing_ok else (child, "it does not exist")
        except OSError as exc:
            return child, "it cannot be checked (%s)" % exc.strerror
        if st.st_uid != 0:
            return child, "it is owned by %s, not root" % who(st.st_uid)
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > 40:
                return child, "too many levels of symlinks"
            target = os.readlink(child)
            cur = "" if target.startswith("/") else cur
            todo.extend(steps(target)[::-1])
            continue
        if st.st_mode & OTHERS and not shared(st):
            return child, "it is writable by others (mode %04o)" % stat.S_IMODE(st.st_mode)
        cur, open_dir = child, shared(st)
    return (cur, "it is writable by others (sticky)") if open_dir else None


path = value
if flag == "--spec":
    if value.startswith("-"):
        refuse("a spec must not start with -", "give a path, version or requirement")
    url = re.search(r"(?:^|(?<=[\s@+]))file:[^\s;]+", value)
    if url:
        path = urllib.parse.unquote(urllib.parse.urlsplit(url.group()).path)
        if url.start() and value[url.start() - 1] == "+" and "@" in path:
            path = path.rsplit("@", 1)[0]
    elif ("://" in value or value.startswith("git+")
          or not ("/" in value or value in (".", "..") or value.endswith(ARCHIVES))):
        sys.exit(0)
path = os.path.normpath(os.path.join(os.getcwd(), path))
found = unsafe(path, missing_ok=flag != "--spec")
if found:
    where, problem = found
    elsewhere = ("choose a --prefix whose every directory only root can write to"
                 if flag == "--prefix" else
                 "use a copy in a directory only root can write to (e.g. under /root)")
    if "create it first" in problem:
        fix = "create it as root first (mkdir -m 755 %s), or %s" % (where, elsewhere)
    elif where == path and "owned by" in problem:
        fix = "run `chown -R root: %s && chmod -R go-w %s`, or %s" % (path, path, elsewhere)
    elif "writable" in problem and "sticky" not in problem:
        fix = "run `chmod go-w %s`, or %s" % (where, elsewhere)
    else:
        fix = elsewhere
    refuse("%s: %s" % (where, problem), fix)
'

# Everything else is in one function called on the last line, so that
# `curl | sh` runs nothing until the whole script has arrived, and no
# command can read the rest of the script from standard input.
main() {
    prog=install.sh
    record=/etc/hpc-batch/install.json

    die() {
        printf '%s: %s\n' "$prog" "$*" >&2
        exit 1
    }

    [ "$(id -u)" -eq 0 ] || die "must be run as root (try: curl -fsSL ... | sudo sh, or sudo sh install.sh)"
    # A hardened root umask would leave the venv unreadable to the users of dispatch.
    umask 022

    # The Debian package's wheels (WHEELHOUSE in hpc_batch/install/debian.py, with this message):
    # dpkg manages hpc-batch here, and pip must not touch the venv it made.
    [ ! -d /usr/share/hpc-batch/wheels ] || die "the Debian package hpc-batch manages hpc-batch on this machine; upgrade it with a newer package (sudo apt install ./hpc-batch_<version>_all.deb), or remove it first (sudo apt remove hpc-batch keeps queued jobs and history)"

    python=${HPC_BATCH_PYTHON:-python3}
    command -v "$python" >/dev/null 2>&1 || die "needs $python (Python >= 3.10)"
    # -I everywhere: root must not import the working directory's modules.
    "$python" -I -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
        || die "needs Python >= 3.10; $python is $("$python" -V 2>&1)"

    recorded() {  # recorded KEY: a choice of the last install, or nothing
        [ -f "$record" ] || return 0
        "$python" -I -c 'import json, sys; print(json.load(open(sys.argv[1])).get(sys.argv[2]) or "")' \
            "$record" "$1" 2>/dev/null || true
    }

    spec=
    case ${1-} in
        "" | -*) ;;
        *) spec=$1; shift ;;
    esac

    # A --prefix meant for hpc-batch-install decides where the venv goes too.
    prefix_arg='' force='' prev=''
    for arg in "$@"; do
        case $prev in --prefix) prefix_arg=$arg ;; esac
        case $arg in
            --prefix=*) prefix_arg=${arg#--prefix=} ;;
            --force) force=1 ;;
        esac
        prev=$arg
    done

    old_prefix=$(recorded prefix)
    prefix=${prefix_arg:-${HPC_BATCH_PREFIX:-${old_prefix:-/opt/hpc-batch}}}
    case $prefix in
        /*) ;;
        *) prefix=$(pwd)/$prefix ;;
    esac
    if [ -n "$old_prefix" ] && [ "$old_prefix" != "$prefix" ] && [ -z "$force" ]; then
        die "hpc-batch is installed in $old_prefix (recorded in $record), not $prefix; uninstall it first (sudo $old_prefix/bin/hpc-batch-install --uninstall keeps jobs) or pass --force"
    fi

    # What pip gets: a bare version is pinned, anything else goes as it is.
    pip_spec=${spec:-$(recorded spec)}
    pip_spec=${pip_spec:-hpc-batch}
    case $pip_spec in
        */* | *.whl | *.tar.gz | *.zip | . | ..) ;;
        [0-9]* | v[0-9]*) pip_spec=hpc-batch==${pip_spec#v} ;;
    esac

    # Before pip and the venv's python run as root, whoever installs.
    note=
    if [ -z "$spec" ]; then
        note=" [the spec comes from $record, recorded by an earlier install;"
        note="$note name another to change it, e.g. hpc-batch for PyPI]"
    fi
    "$python" -I -c "$ROOT_ONLY_PY" --prefix "$prefix" || exit 1
    "$python" -I -c "$ROOT_ONLY_PY" --spec "$pip_spec" "$note" || exit 1

    if [ ! -x "$prefix/bin/python" ]; then
        [ ! -e "$prefix" ] || [ -z "$(ls -A "$prefix")" ] \
            || die "$prefix exists and is not a venv; set HPC_BATCH_PREFIX to another directory"
        echo "$prog: creating a venv at $prefix"
        if ! "$python" -I -m venv "$prefix"; then
            rm -rf "$prefix"
            die "could not create a venv (on Debian/Ubuntu: apt-get install python3-venv)"
        fi
    fi

    echo "$prog: pip install --upgrade $pip_spec into $prefix"
    "$prefix/bin/python" -I -m pip install --disable-pip-version-check --upgrade "$pip_spec" \
        || die "pip could not install $pip_spec"

    installer=$prefix/bin/hpc-batch-install
    [ -x "$installer" ] || die "$installer is missing after pip install; is $pip_spec hpc-batch?"
    if [ -n "$spec" ]; then
        set -- --spec "$spec" "$@"
    fi
    exec "$installer" --no-pip --prefix "$prefix" "$@"
}

main "$@" </dev/null
