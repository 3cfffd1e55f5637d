# shellcheck shell=bash
# Sourced by scripts/test and scripts/try (and asked by bench/run): make the project's venv.
#
# Jobs and dispatch run as real unprivileged users in the tests, so the venv's
# interpreter and packages must be readable by them: it lives outside the
# checkout (which may sit under /root), is built from the system python3 when
# there is one (pyenv interpreters often live under /root too), and gets a
# regular (non-editable) install of this checkout. Sets $venv and $py.

# Where the venv of the checkout in $PWD lives (also how bench/run finds it).
venv_path() {
    local key
    key=$(printf '%s' "$PWD" | sha256sum | cut -c1-12)
    printf '%s\n' "${HPC_BATCH_TEST_VENV:-/var/tmp/hpc-batch-test-$key/venv}"
}

ensure_venv() {
    local extra=${1:-}
    venv=$(venv_path)
    py=$venv/bin/python
    local base_python=python3
    [[ -x /usr/bin/python3 ]] && base_python=/usr/bin/python3
    if ! "$py" -c 'import sys' >/dev/null 2>&1; then
        echo "creating $venv"
        rm -rf "$venv"
        mkdir -p "$(dirname "$venv")" && chmod 755 "$(dirname "$venv")"
        "$base_python" -m venv "$venv" || { echo "$base_python -m venv failed" >&2; return 1; }
    fi
    if ! "$py" -m pip install --disable-pip-version-check -q --force-reinstall --no-deps . ||
        ! "$py" -m pip install --disable-pip-version-check -q ".$extra"; then
        echo "pip install of this checkout failed" >&2
        return 1
    fi
    # dispatch without the site import, as hpc-batch-install leaves it (says why if it cannot).
    "$py" -I -m hpc_batch.install.clientscript "$venv/bin/dispatch" || return 1
    chmod -R a+rX "$venv"
}
