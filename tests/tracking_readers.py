"""Reading back what the MLflow and W&B writers wrote, with each library's own means: MLflow's
client for its store, wandb's protobuf records for an offline run's ``.wandb`` file (wandb ships
no Python reader of it)."""

import json
import struct
from pathlib import Path


def mlflow_run(run_dir):
    """The MLflow client and run that ``<run_dir>/mlflow_run.json`` names."""
    from mlflow.tracking import MlflowClient

    record = json.loads((Path(run_dir) / "mlflow_run.json").read_text())
    client = MlflowClient(tracking_uri=record["tracking_uri"])
    return client, client.get_run(record["run_id"])


def metric_history(client, run, key):
    """``[(step, value), ...]`` of one metric, in the order logged."""
    return [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]


def _wandb_records(path):
    """The records of a ``.wandb`` file: wandb's protobuf ``Record`` messages in the LevelDB
    log format wandb writes (32 KiB blocks; each chunk has a 7-byte header: checksum, length,
    type -- 1 whole, 2 first, 3 middle, 4 last), after a 7-byte ``:W&B`` file header."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    block, position, pieces = 32768, 7, b""
    while position + 7 <= len(data):
        left = block - position % block
        if left < 7:  # a block's tail too short for a header is padding
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        if kind == 0:  # zeroed space to the end of the block
            position += left
            continue
        pieces += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            pieces = b""
            yield record


def wandb_runs(wandb_dir):
    """Each offline run under ``<wandb_dir>/wandb``, in the order they started, as ``{"id",
    "project", "name", "config", "history", "exit_code"}``; history rows are dicts of the logged
    values; ``exit_code`` is the one ``finish`` recorded (None for a run not finished)."""
    import wandb

    wandb.teardown()  # waits until wandb's service has written out every run it had
    runs = []
    for path in Path(wandb_dir, "wandb").glob("offline-run-*/run-*.wandb"):
        run = {"config": {}, "history": [], "exit_code": None}
        for record in _wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run.update(id=record.run.run_id, project=record.run.project,
                           name=record.run.display_name,
                           started=record.run.start_time.ToNanoseconds())
                updates = record.run.config.update
            elif kind == "config":
                updates = record.config.update
            elif kind == "exit":
                run["exit_code"] = record.exit.exit_code
                continue
            elif kind == "history":  # less wandb's own _step, _runtime, _timestamp
                row = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                       for item in record.history.item}
                run["history"].append({k: v for k, v in row.items() if not k.startswith("_")})
                continue
            else:
                continue
            run["config"].update({item.key: json.loads(item.value_json) for item in updates
                                  if item.key != "_wandb"})
        runs.append(run)
    return sorted(runs, key=lambda run: run.pop("started"))
