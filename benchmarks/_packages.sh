# Sourced by benchmarks/gpu_check.sh and benchmarks/gpu_rl.sh (needs $PY and $ROOT): the packages a check imports,
# installed where missing. NEED lists "import_name:pip_name" pairs. A missing one is installed, in this order of
# preference: from wheels in ./.whl (carried to an offline machine, BUILD.md "GPU check") with pip install
# --no-index --no-deps --target into a scratch site directory ($GPU_CHECK_SITE, default /tmp/gpu_check_site, added to
# PYTHONPATH); else from the package index (pip install --user). Still missing after that: exit status 2.

missing() {
    "$PY" - "$@" <<'PYEOF'
import importlib.util, sys
for pair in sys.argv[1:]:
    mod, pip_name = pair.split(":")
    try:
        found = importlib.util.find_spec(mod) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        print(pip_name)
PYEOF
}

# ensure_packages NAME "NEED": NAME prefixes the error message
ensure_packages() {
    local name="$1" need="$2" miss still
    # shellcheck disable=SC2086
    miss="$(missing $need)"
    [ -z "$miss" ] && return 0
    echo "== installing: $miss"
    if [ -d "$ROOT/.whl" ]; then
        local site="${GPU_CHECK_SITE:-/tmp/gpu_check_site}"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
            "$ROOT"/.whl/*.whl
        export PYTHONPATH="$PYTHONPATH:$site"
    else
        # shellcheck disable=SC2086
        "$PY" -m pip install -q --user $miss
    fi
    # shellcheck disable=SC2086
    still="$(missing $need)"
    if [ -n "$still" ]; then
        echo "$name: still missing after install: $still" >&2
        exit 2
    fi
}
