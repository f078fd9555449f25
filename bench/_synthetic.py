"""Synthetic twice logs of any size, cloned from one real run, for the report benchmarks.

One real eval of the refund task (stub/noisy under ``lost_reply``, so metrics vary from trial to
trial) is written once with ``per_log`` samples through inspect's own ``write_eval_log``. Every
synthetic log is a byte-level copy of that template ``.eval`` (a zip of JSON entries) with the
header patched to another cell (model, prompt, fault, protection; fresh eval, run and task
ids) and every sample given a fresh uuid, in its body and in the summaries. Writing 100k
samples through ``write_eval_log`` takes minutes (~2 ms a sample); copying takes seconds.

The logs are cached under the work directory, keyed by inspect's version and the sizes.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import shutil
import zipfile
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import shortuuid
from inspect_ai import eval
from inspect_ai.log import read_eval_log, write_eval_log
from inspect_ai.model import get_model
from twice.evals.run import eval_options
from twice.mocks import FAULTS, STUB_MODELS
from twice.tasks import PROTECTIONS, builtin_prompts, refund

# Python < 3.14: zipfile_zstd (an inspect dependency there) teaches zipfile the zstd entries
# inspect writes; Python 3.14 reads and writes them itself.
with contextlib.suppress(ImportError):
    import zipfile_zstd  # noqa: F401

_ZSTD: int = zipfile.ZIP_ZSTANDARD  # type: ignore[attr-defined]


def _cells() -> list[dict[str, str]]:
    """Distinct (model, prompt, fault, protection) combinations, in a fixed order."""
    return [
        {"model": f"stub/{m}", "prompt": p, "fault": f, "protection": pr}
        for m, p, f, pr in itertools.product(STUB_MODELS, builtin_prompts(), FAULTS, PROTECTIONS)
    ]


def template(work: Path, per_log: int) -> Path:
    """A real twice log with ``per_log`` trials (written once, then reused)."""
    path = work / f"template-{version('inspect_ai')}-{per_log}.eval"
    if path.exists():
        return path
    work.mkdir(parents=True, exist_ok=True)
    scratch = work / "template-run"
    log = eval(
        refund(fault="lost_reply"),
        model=get_model("stub/noisy"),
        log_dir=str(scratch),
        display="none",
        **eval_options("none"),
    )[0]
    if log.status != "success":
        raise RuntimeError(f"template eval ended {log.status}: {log.error}")
    log = read_eval_log(log.location)
    real = log.samples or []
    samples = [
        real[k % len(real)].model_copy(
            update={"epoch": k // len(real) + 1, "uuid": shortuuid.uuid()}
        )
        for k in range(per_log)
    ]
    log = log.model_copy(update={"samples": samples})
    if log.results is not None:
        log.results.total_samples = log.results.completed_samples = per_log
    log.eval.config.epochs = -(-per_log // len(real))
    tmp = path.with_name("partial-" + path.name)
    write_eval_log(log, str(tmp))
    tmp.replace(path)
    shutil.rmtree(scratch, ignore_errors=True)
    return path


def _patch_eval(spec: dict[str, Any], cell: dict[str, str]) -> None:
    spec["eval_id"] = shortuuid.uuid()
    spec["run_id"] = shortuuid.uuid()
    spec["task_id"] = shortuuid.uuid()
    spec["model"] = cell["model"]
    spec["task_args"] = {k: cell[k] for k in ("fault", "protection", "prompt")}
    meta = spec.setdefault("metadata", {}).setdefault("twice", {})
    meta.update({k: cell[k] for k in ("fault", "protection", "prompt")})


def synthetic_logs(work: Path, trials: int, per_log: int) -> Path:
    """A directory of ``trials / per_log`` synthetic logs of ``per_log`` trials each."""
    if trials % per_log:
        raise ValueError(f"trials ({trials}) must be a multiple of per_log ({per_log})")
    out = work / f"synthetic-{version('inspect_ai')}-{trials}-{per_log}"
    done = out / ".complete"
    if done.exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    tpl = template(work, per_log)
    with zipfile.ZipFile(tpl) as z:
        entries = [(info.filename, z.read(info.filename)) for info in z.infolist()]
    # Each sample entry's uuid, read once: every copy replaces it with a fresh one.
    owner = {
        name: json.loads(data)["uuid"] for name, data in entries if name.startswith("samples/")
    }
    cells = _cells()
    with _single_threaded_zstd():
        _write_copies(out, entries, owner, trials // per_log, cells)
    done.touch()
    return out


@contextlib.contextmanager
def _single_threaded_zstd() -> Iterator[None]:
    """Compress entries on this thread: inspect's zstd writer starts 12 worker threads per
    zip entry, which makes copying small entries ten times slower (bench-only setting)."""
    from inspect_ai._util import zipfile as inspect_zipfile

    threads = getattr(inspect_zipfile, "_ZSTD_THREADS", None)
    if threads is None:
        yield
        return
    inspect_zipfile._ZSTD_THREADS = 0
    try:
        yield
    finally:
        inspect_zipfile._ZSTD_THREADS = threads


def _write_copies(
    out: Path,
    entries: list[tuple[str, bytes]],
    owner: dict[str, str],
    logs: int,
    cells: list[dict[str, str]],
) -> None:
    uuids = list(owner.values())
    for n in range(logs):
        cell = cells[n % len(cells)]
        fresh = {u: f"{u[:14]}{n:08d}" for u in uuids}
        eval_patch: dict[str, Any] = {}
        with zipfile.ZipFile(out / f"synthetic-{n:05d}.eval", "w", compression=_ZSTD) as z:
            for name, data in entries:
                if name == "header.json" or name == "_journal/start.json":
                    doc = json.loads(data)
                    if not eval_patch:
                        _patch_eval(doc["eval"], cell)
                        eval_patch = doc["eval"]
                    else:
                        doc["eval"] = eval_patch
                    data = json.dumps(doc).encode()
                elif name == "summaries.json" or name.startswith("_journal/summaries/"):
                    summaries = json.loads(data)
                    for s in summaries:
                        s["uuid"] = fresh.get(s.get("uuid"), s.get("uuid"))
                    data = json.dumps(summaries).encode()
                elif name in owner:
                    old = owner[name]
                    data = data.replace(old.encode(), fresh[old].encode())
                z.writestr(name, data)
