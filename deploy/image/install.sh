#!/bin/sh
# The container image's install steps, in one place: deploy/Dockerfile runs them, and
# tests/packaging/test_wheel.py runs the very same in a clean virtualenv (CI has no
# container daemon), then starts every binary of the result.
#
#   install.sh wheel SOURCE DIST   builds the awp wheel from the source tree SOURCE into
#                                  DIST, with the build backend pinned in build.lock
#   install.sh runtime VENV DIST   makes the virtualenv VENV: exactly the versions of
#                                  requirements.lock, then the wheel from DIST, without
#                                  resolving anything; `pip check` proves them complete
#   install.sh lock                rewrites requirements.lock: the newest versions
#                                  pyproject.toml allows for awp[all] (every extra),
#                                  resolved in a scratch venv
#
# PYTHON (default python3) makes the virtualenvs: the lock holds for its version (the
# image's, Python 3.11).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1
build_dir=
lock_dir=
trap 'rm -rf "$build_dir" "$lock_dir"' EXIT

build_wheel() {
    source=$1
    dist=$2
    build_dir=$(mktemp -d)
    "$python" -m venv "$build_dir/venv"
    "$build_dir/venv/bin/pip" install --quiet --no-deps -r "$here/build.lock"
    # No build isolation: the backend is the pinned one above, not whatever is newest.
    "$build_dir/venv/bin/pip" wheel --quiet --no-deps --no-build-isolation -w "$dist" "$source"
}

make_runtime() {
    venv=$1
    dist=$2
    "$python" -m venv "$venv"
    "$venv/bin/pip" install --quiet --no-deps -r "$here/requirements.lock"
    wheel=$(ls "$dist"/awp-*.whl)
    "$venv/bin/pip" install --quiet --no-deps "$wheel"
    "$venv/bin/pip" check
    # pip check sees the base requirements only; offline, awp[all] resolves only if the
    # lock holds every extra's too.
    "$venv/bin/pip" install --quiet --no-index "$wheel[all]"
}

write_lock() {
    repository=$(cd "$here/../.." && pwd)
    lock_dir=$(mktemp -d)
    build_wheel "$repository" "$lock_dir/dist"
    "$python" -m venv "$lock_dir/venv"
    # Every extra: the image runs every binary and command (pyproject.toml's awp[all]).
    wheel=$(ls "$lock_dir/dist"/awp-*.whl)
    "$lock_dir/venv/bin/pip" install --quiet "$wheel[all]"
    {
        echo "# The exact versions the image installs (--no-deps), for Python 3.11."
        echo "# Written by 'deploy/image/install.sh lock' from pyproject.toml; do not edit."
        "$lock_dir/venv/bin/pip" freeze --exclude awp
    } >"$here/requirements.lock"
}

case "${1:-}" in
wheel) build_wheel "$2" "$3" ;;
runtime) make_runtime "$2" "$3" ;;
lock) write_lock ;;
*)
    echo "usage: install.sh wheel SOURCE DIST | runtime VENV DIST | lock" >&2
    exit 2
    ;;
esac
