#!/bin/sh
# Remove hpc-batch completely, jobs and state included:
#
#   sudo sh uninstall.sh
#
# The same as `hpc-batch-install --purge` (extra arguments go to it). When
# the venv is gone or its installer cannot start, the same steps are done
# here in shell, with the locations the last install recorded, else the
# defaults. To keep queued jobs and history, use
# `hpc-batch-install --uninstall` instead.
set -u

# Functions only, main called on the last line: nothing runs before the
# whole script has been read, even when it is piped into sh.

# is_shepherd DIR: whether the process of DIR (/proc/PID) is a shepherd, as
# is_shepherd() in hpc_batch/install/purge.py decides. Any user picks their own
# argv, so its words are never split or globbed here: root expanding a word
# like '*' would see the names in its working directory as that argv.
is_shepherd() {
    [ "$(cat "$1/comm" 2>/dev/null)" = hpc-batch-sheph ] && return 0
    # One word a line: a NUL ends each word, a newline in one becomes a
    # space (no name or option tested below holds either, so the answer
    # stays Python's).
    tr '\n\0' ' \n' 2>/dev/null <"$1/cmdline" | shepherd_argv
}

# shepherd_argv: read argv one word a line; succeed if it is a shepherd's.
shepherd_argv() {
    argv_state=program argv_seen=0
    while IFS= read -r argv_word || [ -n "$argv_word" ]; do
        [ -n "$argv_word" ] || continue  # Python's reader drops empty words too
        argv_seen=$((argv_seen + 1))
        [ "$argv_seen" -le 8 ] || return 1  # SHEPHERD_ARGV_WORDS in install/purge.py
        case $argv_state in
            program)
                case ${argv_word##*/} in
                    hpc-batch-shepherd | hpc-batch-shepherd.py) return 0 ;;
                    python*) argv_state=option ;;
                    *) return 1 ;;
                esac ;;
            value) argv_state=option ;;  # what -X or -W takes
            module) [ "$argv_word" = shepherd ] || [ "$argv_word" = shepherd.main ]; return ;;
            option)
                case $argv_word in
                    -m) argv_state=module ;;
                    -X | -W) argv_state=value ;;
                    -c) return 1 ;;
                    -*) ;;
                    *)  # the first operand: the script python runs
                        case ${argv_word##*/} in
                            hpc-batch-shepherd | hpc-batch-shepherd.py) return 0 ;;
                            *) return 1 ;;
                        esac ;;
                esac ;;
        esac
    done
    return 1
}

main() {
    prog=uninstall.sh
    record=/etc/hpc-batch/install.json
    unit=/etc/systemd/system/hpc-batch.service
    dropins=/etc/systemd/system/hpc-batch.service.d
    cgroup=/sys/fs/cgroup/hpc-batch

    if [ "$(id -u)" -ne 0 ]; then
        echo "$prog: must be run as root (try: sudo sh uninstall.sh)" >&2
        exit 1
    fi

    recorded() {  # recorded KEY: a choice of the last install, or nothing
        [ -f "$record" ] || return 0
        if command -v python3 >/dev/null 2>&1; then
            # -I: not the modules of root's working directory (a json.py there).
            python3 -I -c 'import json, sys; print(json.load(open(sys.argv[1])).get(sys.argv[2]) or "")' \
                "$record" "$1" 2>/dev/null
        else  # install.json is written one key a line
            sed -n "s/^ *\"$1\": \"\\(.*\\)\",\\{0,1\\}\$/\\1/p" "$record"
        fi
    }

    prefix=${HPC_BATCH_PREFIX:-$(recorded prefix)}
    prefix=${prefix:-/opt/hpc-batch}
    bin_dir=$(recorded bin_dir)
    bin_dir=${bin_dir:-/opt/bin}

    installer=$prefix/bin/hpc-batch-install
    if [ -x "$installer" ] && "$installer" --version >/dev/null 2>&1; then
        exec "$installer" --purge --prefix "$prefix" --bin-dir "$bin_dir" "$@"
    fi
    echo "$prog: $installer is missing or cannot start; removing by hand"

    say() { echo "$prog: $*"; }

    safe_rm() {  # rm -rf, but never a top-level system directory
        case $1 in
            "" | / | /bin | /boot | /dev | /etc | /home | /lib | /lib64 | /opt | /proc | /root \
            | /run | /sbin | /srv | /sys | /tmp | /usr | /var | /var/lib | /var/run | /var/tmp \
            | /usr/local | /usr/bin | /usr/local/bin) say "not removing '$1'"; return ;;
            /*) ;;
            *) say "not removing relative path '$1'"; return ;;
        esac
        if [ -e "$1" ] || [ -L "$1" ]; then
            rm -rf "$1" && say "removed $1"
        fi
    }

    # Directories the daemon was told to use, from the unit's last ExecStart=.
    state_dir=/var/lib/hpc-batch dev_dir=/dev/hpc-batch socket=/run/hpc-batch/hpc-batch.sock
    exec_start=$(cat "$unit" "$dropins"/*.conf 2>/dev/null | sed -n 's/^ExecStart=//p' | tail -n 1)
    prev=
    # Split on blanks, as systemd does, but glob nothing (set -f): a word
    # in the unit must not become names of files in root's directory.
    set -f
    for word in $exec_start; do
        case $prev in
            --state-dir) state_dir=$word ;;
            --dev-dir) dev_dir=$word ;;
            --socket) socket=$word ;;
        esac
        case $word in
            --state-dir=*) state_dir=${word#*=} ;;
            --dev-dir=*) dev_dir=${word#*=} ;;
            --socket=*) socket=${word#*=} ;;
        esac
        prev=$word
    done
    set +f

    booted=
    [ -d /run/systemd/system ] && booted=1
    if [ -n "$booted" ] && [ -e "$unit" ]; then
        # Stops the daemon only (KillMode=process); its jobs are killed below.
        systemctl disable --now hpc-batch || true
    fi

    # Shepherds (and, without cgroups, their jobs): every process below one.
    roots=''
    for dir in /proc/[0-9]*; do
        pid=${dir#/proc/}
        if [ "$pid" != "$$" ] && is_shepherd "$dir"; then
            roots="$roots $pid"
        fi
    done
    if [ -n "$roots" ]; then
        # "pid ppid" for every process; cat goes on past ones that exit.
        victims=$(cat /proc/[0-9]*/status 2>/dev/null \
            | awk '/^Pid:/ { pid = $2 } /^PPid:/ { print pid, $2 }' \
            | awk -v roots="$roots" -v self="$$" '
            BEGIN { n = split(roots, r, " "); for (i = 1; i <= n; i++) keep[r[i]] = 1 }
            { parent[$1] = $2 }
            END {
                # Spare this script and its callers (a purge run from a job).
                for (a = self; a in parent && a != 1; a = parent[a]) spare[a] = 1
                do {
                    grew = 0
                    for (p in parent)
                        if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; grew = 1 }
                } while (grew)
                for (p in keep) if (!(p in spare) && p != 1) printf "%s ", p
            }')
        # Stop all first so none reacts to another's death, then kill.
        # shellcheck disable=SC2086  # a list of pids
        kill -STOP $victims 2>/dev/null
        # shellcheck disable=SC2086
        kill -KILL $victims 2>/dev/null
        # shellcheck disable=SC2086
        say "killed shepherds and their jobs:" $victims
    fi

    if [ -d "$cgroup" ]; then
        if [ -e "$cgroup/cgroup.kill" ]; then
            echo 1 >"$cgroup/cgroup.kill"
        else
            # shellcheck disable=SC2038  # find prints pids (file contents), not names
            find "$cgroup" -name cgroup.procs -exec cat {} + | xargs -r kill -KILL 2>/dev/null
        fi
        tries=0
        while grep -q 'populated 1' "$cgroup/cgroup.events" 2>/dev/null && [ $tries -lt 100 ]; do
            sleep 0.1
            tries=$((tries + 1))
        done
        find "$cgroup" -depth -type d -exec rmdir {} \; 2>/dev/null
        if [ -d "$cgroup" ]; then say "could not remove $cgroup"; else say "removed $cgroup"; fi
    fi

    for dir in "$state_dir" /var/lib/hpc-batch "$dev_dir" /dev/hpc-batch /run/hpc-batch "$dropins"; do
        safe_rm "$dir"
    done
    case ${socket%/*} in
        */hpc-batch) safe_rm "${socket%/*}" ;;
        *) rm -f "$socket" ;;
    esac

    # Shell completion, only where the file is ours (it carries the installer's marker).
    for file in /usr/share/bash-completion/completions/dispatch /usr/share/zsh/vendor-completions/_dispatch; do
        if [ -f "$file" ] && [ ! -L "$file" ] && head -n 3 "$file" | grep -q 'installed by hpc-batch-install'; then
            rm -f "$file" && say "removed $file"
        fi
    done
    # Manual pages, the same way (the marker is their first line).
    for file in /usr/local/share/man/man1/dispatch.1 /usr/local/share/man/man8/hpc-batchd.8 \
        /usr/local/share/man/man8/hpc-batch-install.8 /usr/local/share/man/man8/hpc-batch-shepherd.8; do
        if [ -f "$file" ] && [ ! -L "$file" ] && head -n 1 "$file" | grep -q 'installed by hpc-batch-install'; then
            rm -f "$file" && say "removed $file"
        fi
    done
    for file in "$unit" /etc/profile.d/hpc-batch.sh "$record"; do
        if [ -e "$file" ]; then rm -f "$file" && say "removed $file"; fi
    done
    rmdir /etc/hpc-batch 2>/dev/null
    if [ -n "$booted" ]; then
        systemctl daemon-reload
        systemctl reset-failed hpc-batch 2>/dev/null
    fi

    for name in dispatch hpc-batchd hpc-batch-install hpc-batch-shepherd; do
        link=$bin_dir/$name
        [ -L "$link" ] || continue
        case $(readlink "$link") in
            "$prefix"/bin/*) rm -f "$link" && say "removed $link" ;;
        esac
    done
    case $bin_dir in
        /opt/*) rmdir "$bin_dir" 2>/dev/null ;;
    esac

    if [ -f "$prefix/pyvenv.cfg" ]; then
        safe_rm "$prefix"
    elif [ -e "$prefix" ]; then
        say "left $prefix alone: it is not a venv"
    fi
    # hpc-batch-install's venvs, one per version; the prefix was the link to one of them.
    if [ -d "$prefix.versions" ] && [ ! -L "$prefix.versions" ]; then
        safe_rm "$prefix.versions"
    fi
    say "done"
    exit 0
}

main "$@" </dev/null
