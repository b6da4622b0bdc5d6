"""The ``gpt`` experiment with a recording of its training samples, for ``cadence train -e
tests/token_data_job.py:recording_gpt`` (a module experiment of a user's file), alone or under
torchrun.

Each data shard appends, for every batch it gives training, its rows (input ids and, packed,
position ids) as one JSON line to ``$RECORD_DIR/<$RECORD_TAG>-shard<r>-of-<n>.jsonl``: the
global batch of a step is the shards' rows in shard order. With ``KILL_AT=K`` data shard 0
SIGKILLs its process as it makes the batch of step K (torchrun then ends the job).
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import cadence
from cadence.task.experiments.gpt import GPTTask, GPTTaskConfig, gpt_experiment


class Recording:
    """A training loader whose batches are written down as they are given."""

    def __init__(self, loader: Any, shard: int, shards: int) -> None:
        self.loader = loader
        directory = Path(os.environ["RECORD_DIR"])
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{os.environ['RECORD_TAG']}-shard{shard}-of-{shards}.jsonl"
        self.shard = shard

    def __iter__(self):
        kill_at = int(os.environ.get("KILL_AT", "0"))
        for batch in self.loader:
            step = self.loader.samples // self.loader.global_batch_size
            if self.shard == 0 and step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            features, _ = batch
            rows = ({key: value.tolist() for key, value in features.items()}
                    if isinstance(features, dict) else {"input_ids": features.tolist()})
            with open(self.path, "a") as handle:
                handle.write(json.dumps({"step": step, **rows}) + "\n")
            yield batch

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)

    def load_resharded(self, states: list[dict[str, Any]], rank: int, world_size: int) -> str:
        return self.loader.load_resharded(states, rank, world_size)


@dataclass
class RecordingGPTConfig(GPTTaskConfig):
    """The gpt task's config, for the recording task."""


@cadence.register_task(RecordingGPTConfig)
class RecordingGPT(GPTTask):
    def build_inputs(self, params: Any, input_context: Any = None) -> Any:
        data = super().build_inputs(params, input_context)
        if not params.is_training:
            return data
        return Recording(data, data.shard_index, data.num_shards)


@cadence.register_experiment("recording_gpt")
def recording_gpt() -> cadence.ExperimentConfig:
    """The gpt experiment, its training samples recorded."""
    config = gpt_experiment()
    task = config.task
    config.task = RecordingGPTConfig(**{item.name: getattr(task, item.name)
                                        for item in fields(task)})
    return config
