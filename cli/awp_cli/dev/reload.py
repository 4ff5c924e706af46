"""`awp dev --reload`: watches the Python files of the --module packages and says when
they change, so that the stack restarts its workers on the new code.

Only the top-level package (or module) of each --module is watched, found the way the
workers find it (the working directory first); finding it imports nothing. The watching
is watchfiles' (inotify where there is one), in a daemon thread; bursts of writes (an
editor saving, a `git checkout`) come as one change.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from watchfiles import PythonFilter, watch

from awp_cli.errors import usage


def watched_paths(modules: Sequence[str]) -> list[Path]:
    """The directory of each module's top-level package, or its file when it is one."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    paths: list[Path] = []
    for module in modules:
        top = module.split(".")[0]
        spec = importlib.util.find_spec(top)
        if spec is None:
            raise usage(f"--reload: cannot find module {top!r} (from --module {module})")
        if spec.submodule_search_locations:
            found = [Path(p) for p in spec.submodule_search_locations]
        elif spec.origin:
            found = [Path(spec.origin)]
        else:
            raise usage(f"--reload: module {top!r} has no files to watch")
        paths += [p for p in found if p not in paths]
    return paths


class Reloader:
    """Sets `changed` whenever a watched Python file changes; `say` tells which."""

    def __init__(self, paths: Sequence[Path], say: Callable[[str], None]) -> None:
        self.paths = list(paths)
        self.say = say
        self.changed = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="awp-dev-reload", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _watch(self) -> None:
        for changes in watch(
            *self.paths, watch_filter=PythonFilter(), stop_event=self._stop, yield_on_timeout=False
        ):
            names = sorted({Path(path).name for _, path in changes})
            self.say(f"changed: {', '.join(names)}; restarting the workers")
            self.changed.set()
