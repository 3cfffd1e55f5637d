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

# Everything is in one function called on the last line, so that `curl | sh`
# runs nothing until the whole script has arrived, and no command can read
# the rest of the script from standard input.
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

    python=${HPC_BATCH_PYTHON:-python3}
    command -v "$python" >/dev/null 2>&1 || die "needs $python (Python >= 3.10)"
    "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
        || die "needs Python >= 3.10; $python is $("$python" -V 2>&1)"

    recorded() {  # recorded KEY: a choice of the last install, or nothing
        [ -f "$record" ] || return 0
        "$python" -c 'import json, sys; print(json.load(open(sys.argv[1])).get(sys.argv[2]) or "")' \
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

    if [ ! -x "$prefix/bin/python" ]; then
        [ ! -e "$prefix" ] || [ -z "$(ls -A "$prefix")" ] \
            || die "$prefix exists and is not a venv; set HPC_BATCH_PREFIX to another directory"
        echo "$prog: creating a venv at $prefix"
        if ! "$python" -m venv "$prefix"; then
            rm -rf "$prefix"
            die "could not create a venv (on Debian/Ubuntu: apt-get install python3-venv)"
        fi
    fi

    echo "$prog: pip install --upgrade $pip_spec into $prefix"
    "$prefix/bin/python" -m pip install --disable-pip-version-check --upgrade "$pip_spec" \
        || die "pip could not install $pip_spec"

    installer=$prefix/bin/hpc-batch-install
    [ -x "$installer" ] || die "$installer is missing after pip install; is $pip_spec hpc-batch?"
    if [ -n "$spec" ]; then
        set -- --spec "$spec" "$@"
    fi
    exec "$installer" --no-pip --prefix "$prefix" "$@"
}

main "$@" </dev/null
