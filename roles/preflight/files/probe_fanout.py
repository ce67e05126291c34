# ruff: noqa: F821 - a part of the preflight probe: names of the parts composed in front of it (nodeprog.RECIPES)
"""The probe's checks side by side: one in a thread (``in_thread``), or one per item, a few at a
time (``fan_out``). Threads, not a pool: the probe starts in a fraction of the time without one."""

import threading
from collections.abc import Callable, Hashable, Iterable

FAN_OUT = 16  # checks of other nodes (names, rsync) at once
SSH_FAN_OUT = 4  # ssh logins to other nodes at once: with every node of the mesh logging in to a ring of
                 # the others, each sshd sees about this many pending connections per wave


def in_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[[], Any]:
    """Start fn(*args, **kwargs) in a thread; the function returned waits for its value (or raises
    its error)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - raised again where the value is asked for
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def wait() -> Any:
        thread.join()
        if "error" in box:
            raise box["error"]
        return box["value"]

    return wait


def fan_out(fn: Callable[..., Any], items: Iterable[Hashable], *args: Any, limit: int = FAN_OUT,
            **kwargs: Any) -> dict[Any, Callable[[], Any]]:
    """fn(item, *args, **kwargs) for each item, ``limit`` at a time and started in the items'
    order, in threads; item -> the function that waits for its value (or raises its error)."""
    todo = list(dict.fromkeys(items))
    boxes: dict[Any, dict[str, Any]] = {item: {} for item in todo}
    done = {item: threading.Event() for item in todo}
    lock = threading.Lock()
    pending = iter(todo)
    end = object()  # marks the end: it is never an item

    def worker() -> None:
        while True:
            with lock:
                item = next(pending, end)
            if item is end:
                return
            try:
                boxes[item]["value"] = fn(item, *args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - raised again where the value is asked for
                boxes[item]["error"] = exc
            done[item].set()

    for _ in range(min(limit, len(todo))):
        threading.Thread(target=worker, daemon=True).start()

    def waiter(item: Any) -> Callable[[], Any]:
        def wait() -> Any:
            done[item].wait()
            if "error" in boxes[item]:
                raise boxes[item]["error"]
            return boxes[item]["value"]
        return wait

    return {item: waiter(item) for item in todo}
