"""Ray for ``flyreg tune --ray``: a local instance or a cluster, one actor per device, jobs streamed to them.

Ray imports only here, inside the functions. Ray places the actors (``num_gpus=1`` each for GPUs)
and restarts one that dies, up to :data:`RETRIES` times. The job that was running on it goes to
another actor of the same device model (the same one when it is the model's only actor), up to
:data:`RETRIES` more times; a restarted actor takes jobs again once it answers and still reports
the same device.
"""

from __future__ import annotations

import collections
import importlib.util
import logging
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from flyreg._core.keys import DeviceIdentity
from flyreg._core.text import one_line
from flyreg._tuning.plan import Job

#: How often Ray restarts a dead actor, and how often a job whose actor died runs again.
RETRIES = 2
#: How long the actors may take to start and report their device (seconds).
START_TIMEOUT_S = 300.0
#: How long the actors may take to end after the last job (seconds).
CLOSE_TIMEOUT_S = 10.0
INSTALL = "pip install 'flyreg[ray]'"


def ray_missing() -> str | None:
    """The one line to print when Ray is not installed, else None."""
    if importlib.util.find_spec("ray") is None:
        return f"--ray needs Ray, which is not installed here: {INSTALL}"
    return None


@attrs.define(eq=False)
class Worker:
    """One actor, the device model it reported, and how often it died."""

    handle: Any
    ident: DeviceIdentity
    deaths: int = 0


@attrs.define(eq=False)
class Ticket:
    """A job on its way to an actor of ``ident``: the spec to tune, whether to go on when ``specialize()``
    changes it, and why each actor that ran it died."""

    job: Job
    ident: DeviceIdentity
    spec: dict[str, Any]
    go_on: bool = False
    deaths: list[str] = attrs.field(factory=list)
    died_on: set[int] = attrs.field(factory=set)


def connect(address: str, device: str | None, workers: int | None) -> str:
    """Start a local Ray instance (``address`` ``"local"``) or join the cluster at ``address``; returns the
    device type the actors tune on (``device``, else ``"cuda"`` where there are GPUs, else ``"cpu"``)."""
    import ray

    quiet = {"logging_level": logging.WARNING, "log_to_driver": True}
    if address == "local":
        if device is None:
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cpu":
            ray.init("local", num_cpus=workers or None, num_gpus=0, include_dashboard=False, **quiet)
        else:
            ray.init("local", include_dashboard=False, **quiet)
    else:
        try:
            ray.init(address=address, **quiet)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise ConnectionError(f"could not join the Ray cluster at {address!r}: {one_line(e, typed=False)} (one "
                                  f"with token authentication needs RAY_AUTH_MODE=token and its token)") from None
    gpus = int(ray.cluster_resources().get("GPU", 0))
    device = device or ("cuda" if gpus else "cpu")
    if device == "cuda" and not gpus:
        raise LookupError("the Ray cluster has no GPU; tune on its CPUs with --device cpu")
    return device


def nodes() -> list[str]:
    """The addresses of the cluster's live nodes."""
    import ray

    return sorted({n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")})


def start_workers(device: str, count: int | None) -> list[Worker]:
    """``count`` actors (at most, and by default, one per GPU, or one per CPU for ``"cpu"``), each with its
    device model; an actor that does not start within :data:`START_TIMEOUT_S` is given up."""
    import ray

    from flyreg._ray.actor import TuneActor

    resource = "GPU" if device == "cuda" else "CPU"
    total = int(ray.cluster_resources().get(resource, 0))
    count = min(count, total) if count else total
    if count < 1:
        raise LookupError(f"the Ray cluster has no {resource} for an actor")
    needs = {"num_gpus": 1} if device == "cuda" else {"num_cpus": 1}
    actor = ray.remote(TuneActor).options(max_restarts=RETRIES, max_task_retries=0, **needs)  # type: ignore[attr-defined]
    handles = [actor.remote(device) for _ in range(count)]
    asked = {h.identity.remote(): h for h in handles}
    ready, late = ray.wait(list(asked), num_returns=len(asked), timeout=START_TIMEOUT_S)
    out = []
    for ref in ready:
        try:
            out.append(Worker(asked[ref], ray.get(ref)))
        except ray.exceptions.RayError:
            ray.kill(asked[ref])
    for ref in late:
        ray.kill(asked[ref])
    if not out:
        raise LookupError(f"no Ray actor started within {START_TIMEOUT_S:.0f} s")
    return out


class Stream:
    """Tickets queued per device model, each run by an idle actor of its model; :meth:`results` yields each
    one's outcome as it comes back (``ray.wait``)."""

    def __init__(self, workers: list[Worker], call: Callable[[Worker, Ticket], Any]) -> None:
        self.call = call
        self.live = list(workers)
        self.idle = list(workers)
        self.queue: collections.deque[Ticket] = collections.deque()
        self.flight: dict[Any, tuple[Worker, Ticket | None]] = {}  # a ticket None: the actor is asked its device

    def put(self, ticket: Ticket, first: bool = False) -> None:
        if first:
            self.queue.appendleft(ticket)
        else:
            self.queue.append(ticket)

    def results(self) -> Iterator[tuple[Ticket, Any, str | None]]:
        """``(ticket, result, None)`` per job done, or ``(ticket, None, why)`` for a job that could not run."""
        import ray

        while self.queue or self.flight:
            self._start()
            if not self.flight:  # queued tickets whose model has no actor left
                ticket = self.queue.popleft()
                yield ticket, None, f"no {ticket.ident.name} actor is left to run it"
                continue
            running = any(t is not None for _, t in self.flight.values())
            ready, _ = ray.wait(list(self.flight), num_returns=1, timeout=None if running else START_TIMEOUT_S)
            if not ready:  # restarted actors that never came back
                for worker, _ in self.flight.values():
                    self._drop(worker)
                self.flight.clear()
                continue
            worker, ticket = self.flight.pop(ready[0])
            try:
                result = ray.get(ready[0])
            except ray.exceptions.RayActorError as e:
                why = self._died(worker, e)
                if ticket is None:
                    continue
                ticket.deaths.append(why)
                ticket.died_on.add(id(worker))
                if len(ticket.deaths) > RETRIES:
                    yield ticket, None, f"its actor died {len(ticket.deaths)} times; last: {why}"
                else:
                    self.put(ticket, first=True)
                continue
            except ray.exceptions.RayError as e:  # flyreg's own code failed around the job
                self.idle.append(worker)
                if ticket is not None:
                    yield ticket, None, one_line(getattr(e, "cause", None) or e)
                continue
            if ticket is None:  # a restarted actor answered: it takes jobs again if its device is the same
                if result == worker.ident:
                    self.idle.append(worker)
                else:
                    self._drop(worker)
                continue
            self.idle.append(worker)
            yield ticket, result, None

    def stop(self) -> None:
        """Cancel every job in flight and end the actors at once (Ctrl-C)."""
        import ray

        for ref in self.flight:
            ray.cancel(ref)
        for worker in self.live:
            ray.kill(worker.handle)
        self.flight.clear()
        self.queue.clear()

    def close(self) -> None:
        """End the actors once they are idle, waiting a little for their exit handlers (which remove their
        private dirs)."""
        import ray

        ended = [worker.handle.__ray_terminate__.remote() for worker in self.live]
        ray.wait(ended, num_returns=len(ended), timeout=CLOSE_TIMEOUT_S)

    def _start(self) -> None:
        """Hand each queued ticket an idle actor of its model, preferring one it did not die on."""
        for ticket in list(self.queue):
            mine = [w for w in self.idle if w.ident == ticket.ident]
            fresh = [w for w in mine if id(w) not in ticket.died_on]
            others_left = any(w.ident == ticket.ident and id(w) not in ticket.died_on for w in self.live)
            pick = fresh[0] if fresh else (mine[0] if mine and not others_left else None)
            if pick is None:
                continue
            self.queue.remove(ticket)
            self.idle.remove(pick)
            self.flight[self.call(pick, ticket)] = (pick, ticket)

    def _died(self, worker: Worker, error: Exception) -> str:
        """Count a death; Ray restarts the actor unless it has died too often. Returns why it died."""
        worker.deaths += 1
        if worker.deaths > RETRIES:
            self._drop(worker)
        else:
            self.flight[worker.handle.identity.remote()] = (worker, None)
        return one_line(error)

    def _drop(self, worker: Worker) -> None:
        import ray

        if worker in self.live:
            self.live.remove(worker)
        if worker in self.idle:
            self.idle.remove(worker)
        ray.kill(worker.handle)
