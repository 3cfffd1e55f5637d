# hpc-batch: shell completion for dispatch, installed by hpc-batch-install
# bash completion for dispatch: its verbs, each verb's options, and job ids
# and names. hpc-batch-install writes this file and --uninstall removes it;
# local edits are lost on the next upgrade.
#
# Job ids and names are the caller's queued, waiting and running jobs, from
# `dispatch list --json`, given at most 2 seconds; a daemon that is down or
# busy gives no candidates and prints nothing. Written for bash 4.0 and
# later, safe under `set -u`; uses bash-completion's _command_offset for the
# command after `new [options] --` when it is loaded.

# Add each of "$@" that starts with $cur to COMPREPLY, $pre before it.
# cur and pre are _dispatch's locals (bash scopes locals dynamically).
_dispatch_add() {
    local word
    for word in "$@"; do
        if [[ $word == "$cur"* ]]; then
            COMPREPLY+=("$pre$word")
        fi
    done
    return 0
}

# Set opts to the options of verb $1, as hpc_batch/client/cli_usage.py lists them;
# set valued to those of them that take a value.
_dispatch_verb_options() {
    valued=""
    case $1 in
        new)
            opts="--cpu --gpu-cores --gpu-link --max-mem --max-time --exclusive --numa-local"
            opts+=" --numa-local-mem --numa-local-gpu --benchmark --whole-l3 --aslr --thp --record --record-env"
            opts+=" --notify --notify-command"
            opts+=" --env --output --no-output --name --after --after-ok --array --commands --wait --parsable --json -h --help"
            valued=" --cpu --gpu-cores --gpu-link --max-mem --max-time --output --name --after --after-ok"
            valued+=" --array --commands --benchmark --aslr --thp --record --notify --notify-command "
            ;;
        list)
            opts="--all --finished --json -o --format --no-header -h --help"
            valued=" -o --format "
            ;;
        history)
            opts="--name --array --state --verdict --since --until --setup --limit --user --all --json -h --help"
            valued=" --name --array --state --verdict --since --until --setup --limit --user "
            ;;
        report)
            opts="--name --array --setup --since --until --metric --plot --no-plot --limit --user --json -h --help"
            valued=" --name --array --setup --since --until --metric --plot --limit --user "
            ;;
        show) opts="--json --record -h --help" ;;
        wait | record) opts="--json -h --help" ;;
        status)
            opts="--json --map --watch --interval -h --help"
            valued=" --interval "
            ;;
        log) opts="-f --follow -h --help" ;;
        attach | kill | job) opts="-h --help" ;;
        *) opts="" ;;
    esac
    return 0
}

# Add the verb's options not already on the line (words 2 to cword-1).
_dispatch_add_options() {
    local opts valued word i
    _dispatch_verb_options "$verb"
    for word in $opts; do
        for ((i = 2; i < cword; i++)); do
            if [[ ${COMP_WORDS[i]-} == "$word" ]]; then
                continue 2
            fi
        done
        _dispatch_add "$word"
    done
    return 0
}

# Print the ids and names of the caller's jobs, one a line; on any failure
# (no daemon, no python3, a timeout) print nothing, on stderr neither.
_dispatch_job_words() {
    local exe=dispatch
    if [[ ${COMP_WORDS[0]-} == */* && -x ${COMP_WORDS[0]} ]]; then
        exe=${COMP_WORDS[0]}
    fi
    if ! command -v "$exe" >/dev/null 2>&1 || ! command -v python3 >/dev/null 2>&1; then
        return 0
    fi
    local -a run=("$exe" list --json)
    if command -v timeout >/dev/null 2>&1; then
        run=(timeout 2 "${run[@]}")
    fi
    # -I -S: no module from the working directory, no site packages (faster).
    "${run[@]}" </dev/null 2>/dev/null | python3 -I -S -c '
import json, re, sys
try:
    jobs = list(json.load(sys.stdin).get("jobs") or [])
except Exception:
    jobs = []
plain = re.compile(r"[A-Za-z0-9._-]+\Z")
for job in jobs:
    for key in ("id", "name"):
        value = job.get(key) if isinstance(job, dict) else None
        if value is not None and plain.match(str(value)):
            print(value)
' 2>/dev/null
    return 0
}

# Add the jobs that match $cur. With $1 "list", $cur is a comma-separated
# list (--after 3,pre): complete its last item and skip the ones given.
_dispatch_add_jobs() {
    local given="" word i
    if [[ ${1-} == list && $cur == *,* ]]; then
        given=,${cur%,*},
        pre+=${cur%,*},
        cur=${cur##*,}
    fi
    for ((i = 2; i < cword; i++)); do
        given+=,${COMP_WORDS[i]-},
    done
    while IFS= read -r word; do
        if [[ $given != *",$word,"* ]]; then
            _dispatch_add "$word"
        fi
    done < <(_dispatch_job_words)
    return 0
}

# Complete the command line of `dispatch new` whose command word is at index $1.
_dispatch_command_at() {
    local start=$1
    if declare -F _comp_command_offset >/dev/null 2>&1; then
        _comp_command_offset "$start"
    elif declare -F _command_offset >/dev/null 2>&1; then
        _command_offset "$start"
    elif ((cword == start)) && [[ $cur != */* ]]; then
        mapfile -t COMPREPLY < <(compgen -c -- "$cur")
    else
        # The command's own arguments, or a path: readline's file names.
        compopt -o default 2>/dev/null
        COMPREPLY=()
    fi
    return 0
}

# dispatch new [options] [--] <command>...
_dispatch_new() {
    local opts valued word i=2 start=0
    _dispatch_verb_options new
    # Where the command begins: after "--", or at the first word that is
    # neither an option nor an option's value. bash splits --opt=value into
    # three words (= is in COMP_WORDBREAKS), or keeps it as one if not.
    while ((i < cword)); do
        word=${COMP_WORDS[i]-}
        if [[ $word == -- ]]; then
            start=$((i + 1))
            break
        elif [[ $word == -* ]]; then
            if [[ $word != *=* && $valued == *" $word "* ]]; then
                if [[ ${COMP_WORDS[i + 1]-} == "=" ]]; then
                    i=$((i + 1))
                fi
                i=$((i + 1))
            fi
        elif [[ $word != "=" ]]; then
            start=$i
            break
        fi
        i=$((i + 1))
    done
    if ((start > 0 && cword >= start)); then
        _dispatch_command_at "$start"
        return 0
    fi
    if ((i > cword)) || [[ -n $pre ]]; then
        # The word under the cursor is the value of the option before it
        # (or, as --opt=value in one word, its own).
        case $prev in
            --gpu-link) _dispatch_add NV NV2 NV4 NV6 NV8 NV12 NV18 PIX PXB PHB NODE SYS ;;
            --after | --after-ok) _dispatch_add_jobs list ;;
            --notify) _dispatch_add tty cmd tty,cmd ;;
            --output | --commands)
                compopt -o filenames 2>/dev/null
                while IFS= read -r word; do
                    COMPREPLY+=("$pre$word")
                done < <(compgen -f -- "$cur")
                ;;
        esac
        return 0
    fi
    if [[ -z $cur || $cur == -* ]]; then
        _dispatch_add_options
        _dispatch_add --
    else
        _dispatch_command_at "$cword"
    fi
    return 0
}

# history and report: a flag's value (--state and --verdict from their words,
# --plot a file), else their options, else job ids.
_dispatch_history() {
    local opts valued
    _dispatch_verb_options "$verb"
    if [[ $valued == *" $prev "* ]]; then
        case $prev in
            --state) _dispatch_add exited signalled killed timeout oom error cancelled dependency-failed lost failed ;;
            --verdict) _dispatch_add clean noisy unknown none ;;
            --plot) mapfile -t -O "${#COMPREPLY[@]}" COMPREPLY < <(compgen -f -- "$cur") ;;
        esac
        return 0
    fi
    if [[ $cur == -* || -z $cur ]]; then
        _dispatch_add_options
    fi
    return 0
}

_dispatch() {
    local IFS=$' \t\n'
    local cword=${COMP_CWORD-0}
    local cur=${COMP_WORDS[cword]-} prev="" pre="" verb=${COMP_WORDS[1]-}
    local word n=0 i
    COMPREPLY=()
    if ((cword > 0)); then
        prev=${COMP_WORDS[cword - 1]-}
    fi
    if [[ $cur == "=" && $prev == -* ]]; then
        # --opt=<TAB>: readline completes what follows the "=".
        cur=""
    elif [[ $prev == "=" ]] && ((cword > 1)); then
        prev=${COMP_WORDS[cword - 2]-}
    elif [[ $cur == --*=* ]]; then
        # --opt=value as one word (= taken out of COMP_WORDBREAKS).
        prev=${cur%%=*}
        pre=$prev=
        cur=${cur#*=}
    fi

    if ((cword <= 1)); then
        if [[ $cur == -* ]]; then
            _dispatch_add -h --help --version
        else
            _dispatch_add new list attach log kill wait show record status history report job
        fi
        return 0
    fi
    if [[ $verb == new ]]; then
        _dispatch_new
        return 0
    fi
    if [[ $verb == history || $verb == report ]]; then
        _dispatch_history
        return 0
    fi
    if [[ $cur == -* ]]; then
        _dispatch_add_options
        return 0
    fi
    # How many positional words (not options) come before the cursor.
    for ((i = 2; i < cword; i++)); do
        word=${COMP_WORDS[i]-}
        if [[ $word != -* ]]; then
            n=$((n + 1))
        fi
    done
    case $verb in
        list | status)
            # Nothing to offer for a value (status --interval SECONDS).
            local opts valued
            _dispatch_verb_options "$verb"
            if [[ $prev == -o || $prev == --format ]]; then
                # list's column names, each after the commas already typed.
                local head=${cur%"${cur##*,}"}
                for word in user id array name command start uptime max-time mem exclusive cpus gpus cpu peak \
                    verdict state exit note; do
                    if [[ $head$word == "$cur"* ]]; then
                        COMPREPLY+=("$pre$head$word")
                    fi
                done
            elif [[ $valued != *" $prev "* ]]; then
                _dispatch_add_options
            fi
            ;;
        attach | kill | log)
            if ((n == 0)); then
                _dispatch_add_jobs
            fi
            ;;
        show)
            if ((n == 0)); then
                _dispatch_add_jobs
            elif [[ -z $cur ]]; then
                _dispatch_add_options
            fi
            ;;
        wait) _dispatch_add_jobs ;;
        record)
            # dispatch record diff <a> <b>: job ids or names, or record files
            if ((n == 0)); then
                _dispatch_add diff
            elif ((n <= 2)); then
                _dispatch_add_jobs
                mapfile -t -O "${#COMPREPLY[@]}" COMPREPLY < <(compgen -f -- "$cur")
            fi
            ;;
        job)
            # dispatch job <job> max-time (get | set <duration> | add <duration>)
            case $n in
                0) _dispatch_add_jobs ;;
                1) _dispatch_add max-time ;;
                2)
                    if [[ ${COMP_WORDS[cword - 1]-} == max-time ]]; then
                        _dispatch_add get set add
                    fi
                    ;;
            esac
            ;;
    esac
    return 0
}

complete -F _dispatch dispatch
