"""The task adapter a request chooses (jina-embeddings-v3's LoRA, zoi.adapters): OpenAI / TEI
`task`, Cohere `input_type`; carried per sequence through the batcher into the engine call.

A request's token id arrays are tagged with its task id (`TaskSeq`: the ids, plus `.task`), so
the batcher, its fair slicing, replicas and the retry-alone rule carry them unchanged; the
runner (zoi.serve.service) packs a batch's sequences and passes their ids as the engine's
per-sequence `tasks`: one engine call holds sequences of several tasks, each computed with its
own adapter (a row does not depend on the batch it rode in)."""

from __future__ import annotations

import numpy as np

from zoi.serve.http import ApiError

# Cohere's input_type -> jina-embeddings-v3's task (used when the model has that adapter)
COHERE_TASKS = {
    "search_query": "retrieval.query",
    "search_document": "retrieval.passage",
    "classification": "classification",
    "clustering": "separation",
}


class TaskSeq(np.ndarray):
    """A sequence's token ids with the task id its request chose (-1: none)."""

    task: int = -1

    def __array_finalize__(self, obj) -> None:
        self.task = getattr(obj, "task", -1)


def tagged(seqs: list[np.ndarray], task: int | None) -> list[np.ndarray]:
    """`seqs` tagged with `task` (None: returned as they are: the base weights)."""
    if task is None:
        return seqs
    out = []
    for s in seqs:
        t = np.asarray(s).view(TaskSeq)
        t.task = int(task)
        out.append(t)
    return out


def batch_tasks(seqs: list[np.ndarray]) -> dict:
    """The engine call's keyword for a batch: {"tasks": int32 [B]} when some sequence has a
    task, else {} (an engine without adapters is called as always)."""
    t = [getattr(s, "task", -1) for s in seqs]
    if all(x < 0 for x in t):
        return {}
    return {"tasks": np.asarray(t, np.int32)}


def model_tasks(svc) -> list[str]:
    return list(getattr(svc.engine.spec, "adapters", ()) or ())


def request_task(svc, name, param: str = "task") -> int | None:
    """The task id of a request's `task` field (absent / null: None, the base weights); a name
    the model has no adapter of is a 400 listing the model's tasks."""
    if name is None:
        return None
    tasks = model_tasks(svc)
    if not isinstance(name, str):
        raise ApiError(
            "validation", f"{param} should be a string (one of the model's tasks)", param
        )
    if not tasks:
        raise ApiError(
            "invalid",
            f"{param} {name!r}: {svc.model_name} has no task adapters; leave {param} out",
            param,
        )
    if name not in tasks:
        raise ApiError(
            "invalid",
            f"{param} {name!r} is not one of {svc.model_name}'s tasks: {', '.join(tasks)}",
            param,
        )
    return tasks.index(name)


def instruction(svc, task: int | None) -> str:
    """The text put before a text of that task (the hub's task_instructions)."""
    if task is None:
        return ""
    meta = getattr(getattr(svc.engine, "model", None), "meta", None) or {}
    return (meta.get("task_instructions") or {}).get(model_tasks(svc)[task], "")


def task_prompted(svc, texts: list[str], task: int | None, prompt_name) -> list[str]:
    """Texts with their prompt: the named prompt when the request names one, else the task's
    instruction (a request with a task), else the model's default prompt."""
    if task is None or prompt_name is not None:
        return svc.prompted(texts, prompt_name)
    ins = instruction(svc, task)
    return [ins + t for t in texts] if ins else texts


def cohere_task(svc, input_type: str) -> int | None:
    """The task a Cohere input_type maps to on a model with that adapter, else None."""
    name = COHERE_TASKS.get(input_type)
    tasks = model_tasks(svc)
    return tasks.index(name) if name in tasks else None
