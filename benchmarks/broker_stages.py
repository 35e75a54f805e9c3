"""Where a broker's CPU goes, stage by stage, in ns of CPU time per token: ours vs Atropos 0.4.0.

Each stage of the ingest path (one group, ``POST /scored_data``) and of the hand-out path (one
batch, ``GET /batch``) is timed in-process with ``time.process_time``, so the figures hold on a
busy host where wall-clock rates do not. HTTP handling (uvicorn, starlette, fastapi; the same
stack for both) is not included: ``broker_throughput.py`` measures the whole.

    python benchmarks/broker_stages.py                 # both shapes of broker_throughput.py
    python benchmarks/broker_stages.py --ours-src ../broker

Atropos's stages run in its own venv (created by ``broker_throughput.py``): FastAPI's
``json.loads`` and ``ScoredData`` validation per group; ``jsonable_encoder``, ``json.dumps`` and
starlette's gzip (level 9) per batch. Ours: ``codec.decode``, ``validation.check_group``, the
store's blob encoding and a segment-log append per group; the batch record and payload
read, blob decoding, response encoding and igzip (JSON only, at our ``gzip_level``) per batch.

Batches are built from distinct random groups (ids below 50,000, masks -100 on the first
quarter), so gzip sees realistic, poorly compressible token streams.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHAPES = ((8, 512, 64), (16, 4096, 256))
Stage = tuple[str, str, float]  # (path, stage, ns per token)


def _time(fn: Callable[[], Any], tokens: int, budget_s: float = 0.4) -> float:
    fn()
    runs, start = 0, time.process_time()
    while time.process_time() - start < budget_s or runs < 2:
        fn()
        runs += 1
    return (time.process_time() - start) / runs / tokens * 1e9


def _groups(g: int, length: int, count: int) -> list[dict[str, Any]]:
    rng = random.Random(0)
    out = []
    for k in range(count):
        tokens = [[rng.randrange(50_000) for _ in range(length)] for _ in range(g)]
        prompt = length // 4
        masks = [[-100] * prompt + row[prompt:] for row in tokens]
        scores = [rng.uniform(-1, 1) for _ in range(g)]
        out.append(
            {"tokens": tokens, "masks": masks, "scores": scores, "env_id": 0, "group_id": f"g{k}"}
        )
    return out


def atropos_stages(g: int, length: int, b: int) -> list[Stage]:
    """Run inside the Atropos venv."""
    from atroposlib.api.server import ScoredData, _scored_data_to_dict
    from fastapi.encoders import jsonable_encoder

    groups = _groups(g, length, b // g)
    body = json.dumps(groups[0]).encode()
    gt, bt = g * length, b * length
    stages = [
        ("POST", "json.loads (FastAPI body)", _time(lambda: json.loads(body), gt)),
        (
            "POST",
            "ScoredData validation",
            _time(lambda: ScoredData.model_validate(json.loads(body)), gt)
            - _time(lambda: json.loads(body), gt),
        ),
    ]
    queued = [_scored_data_to_dict(ScoredData.model_validate(x)) for x in groups]
    encoded = jsonable_encoder({"batch": queued})
    out = json.dumps(encoded, separators=(",", ":")).encode()
    stages += [
        ("GET", "jsonable_encoder", _time(lambda: jsonable_encoder({"batch": queued}), bt)),
        ("GET", "json.dumps", _time(lambda: json.dumps(encoded, separators=(",", ":")), bt)),
        ("GET", "gzip level 9 (starlette default)", _time(lambda: gzip.compress(out, 9), bt)),
    ]
    return stages


def our_stages(g: int, length: int, b: int) -> list[Stage]:
    import msgpack
    import orjson

    from atroposlib import codec
    from atroposlib.api.compression import Gzipper
    from atroposlib.api.settings import BrokerSettings
    from atroposlib.api.store.base import BatchRecord, GroupMeta, NewGroup
    from atroposlib.api.store.blob import decode_group, encode_group
    from atroposlib.api.store.sqlite import SqliteStore
    from atroposlib.api.validation import check_group
    from atroposlib.wire.common import MSGPACK_CONTENT_TYPE

    level = BrokerSettings().gzip_level
    gzipper = Gzipper(gzip_level=level)
    groups = _groups(g, length, b // g)
    jbody = orjson.dumps(groups[0])
    mbody = msgpack.packb(codec.pack_group(groups[0]), use_bin_type=True)
    gt, bt = g * length, b * length
    raw_json = codec.decode(jbody, "application/json")
    raw_msgpack = codec.decode(mbody, MSGPACK_CONTENT_TYPE)
    checked = check_group(raw_json)
    blob = encode_group(checked.group)
    stages = [
        ("POST", "json: codec.decode", _time(lambda: codec.decode(jbody, "application/json"), gt)),
        ("POST", "json: check_group", _time(lambda: check_group(dict(raw_json)), gt)),
        (
            "POST",
            "msgpack: codec.decode",
            _time(lambda: codec.decode(mbody, MSGPACK_CONTENT_TYPE), gt),
        ),
        ("POST", "msgpack: check_group", _time(lambda: check_group(dict(raw_msgpack)), gt)),
        ("POST", "blob.encode_group", _time(lambda: encode_group(checked.group), gt)),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "s.sqlite3")
        key = iter(range(1, 10**9))

        def add() -> None:
            k = next(key)
            meta = GroupMeta(k, 0, g, gt, length, len(blob), None)
            store.add_groups([NewGroup(meta, blob, f"id{k}")], {"next_key": k})

        stages.append(("POST", "SqliteStore.add_groups (segment log)", _time(add, gt)))
        keys = tuple(range(1, b // g + 1))
        step = iter(range(1, 10**9))

        def hand_out() -> None:
            store.save_batch(BatchRecord(next(step), keys, True), {"next_key": 0})
            store.payloads(keys)

        stages.append(("GET", "SqliteStore.save_batch + payloads", _time(hand_out, bt)))
        store.close()
    blobs = [encode_group(check_group(x).group) for x in groups]
    batch = [decode_group(x) for x in blobs]
    jout = codec.encode({"batch": batch, "step": 1}, None)[0]
    stages += [
        ("GET", "blob.decode_group", _time(lambda: [decode_group(x) for x in blobs], bt)),
        ("GET", "json: codec.encode", _time(lambda: codec.encode({"batch": batch}, None), bt)),
        (
            "GET",
            "msgpack: pack_group + codec.encode",
            _time(
                lambda: codec.encode(
                    {"batch": [codec.pack_group(x) for x in batch]}, MSGPACK_CONTENT_TYPE
                ),
                bt,
            ),
        ),
        ("GET", f"json: igzip (gzip_level {level})", _time(lambda: gzipper.compress_now(jout), bt)),
    ]  # msgpack answers are not compressed (GzipAnswers skips application/msgpack)
    return stages


def _print(title: str, stages: list[Stage]) -> None:
    print(title)
    for path, stage, ns in stages:
        print(f"  {path:<5} {stage:<40} {ns:8.1f} ns/token")


def _total(stages: list[Stage], skip: str | None = None) -> float:
    return sum(ns for _, stage, ns in stages if skip is None or not stage.startswith(skip))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ours-src", type=Path, default=ROOT, help="source tree of our broker")
    parser.add_argument("--atropos-side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.atropos_side:
        print(json.dumps({f"{g},{n},{b}": atropos_stages(g, n, b) for g, n, b in SHAPES}))
        return 0
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from broker_throughput import ensure_atropos_venv  # puts ROOT on sys.path

    sys.path.insert(0, str(args.ours_src.resolve()))  # so that --ours-src comes first

    python = ensure_atropos_venv()
    answer = subprocess.run(
        [str(python), str(Path(__file__).resolve()), "--atropos-side"],
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        check=True,
    )
    theirs = json.loads(answer.stdout)
    for g, n, b in SHAPES:
        print(f"\n=== G={g} L={n} B={b} (CPU ns per token; POST per group, GET per batch)")
        atropos = [tuple(x) for x in theirs[f"{g},{n},{b}"]]
        ours = our_stages(g, n, b)
        _print("Atropos 0.4.0", atropos)  # type: ignore[arg-type]
        _print("ours", ours)
        base = _total(atropos)  # type: ignore[arg-type]
        json_total = _total(ours, "msgpack")
        msgpack_total = _total(ours, "json")
        print(
            f"  totals (HTTP handling excluded): Atropos {base:.0f}; ours JSON {json_total:.0f} "
            f"(Atropos/ours {base / json_total:.1f}), ours msgpack {msgpack_total:.0f} "
            f"(Atropos/ours {base / msgpack_total:.1f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
