"""CUDA graph capture of one bucket's launch list on the backend's own stream, and the
timing of instantiated graphs (the persistent-vs-per-op choice at compile time)."""

from __future__ import annotations

import gc
import time


def capture(drv, torch, stream, tstream, steps: list) -> tuple:
    """Run the steps once (compiles every kernel; the call's inputs are already on the
    device), then capture them into a graph: (CUgraph, CUgraphExec, number of nodes)."""
    with torch.cuda.stream(tstream):
        for s in steps:  # compile + run once outside the capture
            s()
    drv.check(drv.cu.cuStreamSynchronize(stream))
    # no garbage collection inside the capture: a collected torch CUDAGraph (of anyone's)
    # calls into CUDA and invalidates the capture (seen on the H200)
    gc.collect()
    gc_was = gc.isenabled()
    gc.disable()
    drv.begin_capture(stream)
    try:
        with torch.cuda.stream(tstream):
            for s in steps:
                s()
    finally:
        graph, gexec, nodes = drv.end_capture(stream)
        if gc_was:
            gc.enable()
    return (graph, gexec, nodes)


def destroy(drv, g) -> None:
    graph, gexec, _ = g
    drv.cu.cuGraphExecDestroy(gexec)
    drv.cu.cuGraphDestroy(graph)


def time_graph(drv, stream, gexec, n: int = 20) -> float:
    """µs per launch of an instantiated graph, n back-to-back launches (device-bound)."""
    cuda, chk = drv.cu, drv.check
    chk(cuda.cuGraphLaunch(gexec, stream))
    chk(cuda.cuStreamSynchronize(stream))
    t0 = time.perf_counter()
    for _ in range(n):
        chk(cuda.cuGraphLaunch(gexec, stream))
    chk(cuda.cuStreamSynchronize(stream))
    return (time.perf_counter() - t0) / n * 1e6


def pick_faster(drv, stream, built: dict, rounds: int = 3) -> tuple[object, dict]:
    """built {key: graph}: time each `rounds` times (alternating), destroy all but the
    fastest; (its key, {key: best µs})."""
    times = {m: [] for m in built}
    for _ in range(rounds):
        for m, g in built.items():
            times[m].append(time_graph(drv, stream, g[1]))
    us = {m: min(t) for m, t in times.items()}
    keep = min(us, key=us.get)
    for m, g in built.items():
        if m != keep:
            destroy(drv, g)
    return keep, us
