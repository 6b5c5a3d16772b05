"""Module 03: measuring wall-clock time honestly. Provided.

GPU and MPS work is queued: a clock read right after a call measures the queueing, not the
work, so ``time_call`` synchronises the device before every clock read. The first calls
pay one-off costs (allocations, kernel selection), so it warms up first. Timings jitter,
so it reports the median of several repeats. And a CPU run's speed depends on how many
threads torch uses: on a shared 2-core machine, 2 threads against another busy job can be
20x slower than 1 thread (oversubscription), so the thread count is part of every result.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .device import synchronize
from .module import check_int

__all__ = ["TimingResult", "time_call"]


@dataclass(frozen=True)
class TimingResult:
    """What ``time_call`` measured.

    Attributes:
        median_s: median wall-clock seconds of one call, over ``repeats``.
        times_s: every measured call's seconds (warm-up calls excluded), in order.
        warmup: warm-up calls made before measuring.
        num_threads: ``torch.get_num_threads()`` during the measurement (CPU intra-op threads).
        device: the device that was synchronised.
        result: the value the last call returned.
        cpu_times_s: this process's CPU seconds (``time.process_time``) of every measured call.
            On a CPU device with one thread this counts the work done and not the time spent
            waiting for a core, so it is the robust number when other jobs share the machine.
    """

    median_s: float
    times_s: tuple[float, ...]
    warmup: int
    num_threads: int
    device: str
    result: Any = None
    cpu_times_s: tuple[float, ...] = ()

    @property
    def median_cpu_s(self) -> float:
        """Median CPU seconds of one call (0.0 when not measured)."""
        return statistics.median(self.cpu_times_s) if self.cpu_times_s else 0.0

    @property
    def repeats(self) -> int:
        """Number of measured calls."""
        return len(self.times_s)

    def describe(self) -> str:
        """One line: median, repeats, device and threads, e.g. for a benchmark header."""
        return (f"median {self.median_s:.4f} s of {self.repeats} (after {self.warmup} warm-up), "
                f"device {self.device}, {self.num_threads} threads")


def time_call(fn: Callable[[], Any], *, device: str | torch.device = "cpu", warmup: int = 1,
              repeats: int = 3) -> TimingResult:
    """Time ``fn()``: warm up, then the median of ``repeats`` synchronised runs.

    Args:
        fn: a callable with no arguments (wrap yours in a ``lambda``).
        device: where ``fn`` queues work; it is synchronised (``g2c.nn.synchronize``) before
            and after every measured call.
        warmup: calls before measuring, >= 0.
        repeats: measured calls, >= 1.

    Returns:
        ``TimingResult`` with the median seconds, every measured wall and CPU time, the
        thread count and the last call's return value.

    Raises:
        TypeError: ``fn`` is not callable; ``warmup`` or ``repeats`` is not an int (a bool, a float,
            a string: "time_call: warmup must be an int, got float 2.5").
        ValueError: warmup < 0 or repeats < 1.

    To pin the thread count, call ``torch.set_num_threads(n)`` first (the benchmarks take
    ``--threads N``); the result records whatever was in force.
    """
    if not callable(fn):
        raise TypeError(f"time_call: fn must be a callable with no arguments (e.g. a lambda), got "
                        f"{type(fn).__name__} {fn!r:.60}")
    warmup = check_int(warmup, "warmup", minimum=None, where="time_call")      # the type here, the range below
    repeats = check_int(repeats, "repeats", minimum=None, where="time_call")
    if warmup < 0:
        raise ValueError(f"time_call: warmup must be an int >= 0, got {warmup!r}")
    if repeats < 1:
        raise ValueError(f"time_call: repeats must be an int >= 1, got {repeats!r}")
    result = None
    for _ in range(warmup):
        result = fn()
    synchronize(device)
    times, cpu_times = [], []
    for _ in range(repeats):
        synchronize(device)
        t0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
    return TimingResult(median_s=statistics.median(times), times_s=tuple(times), warmup=warmup,
                        num_threads=torch.get_num_threads(), device=str(torch.device(device)), result=result,
                        cpu_times_s=tuple(cpu_times))
