import pytest
import torch
from torch import nn

import cadence
from cadence.core.scope import current_scope


def test_seed_000_submodule_example():
    a, b, c = cadence.Module(), cadence.Module(), cadence.Module()
    a.b = b
    b.c = c
    assert list(a.submodules) == [b, c]
    assert list(b.submodules) == [c]
    assert list(c.submodules) == []


def test_name_defaults_to_the_class_name_in_snake_case():
    class MyHTTPTrainer(cadence.Module):
        pass

    assert MyHTTPTrainer().name == "my_http_trainer"
    assert cadence.Module(name="custom").name == "custom"
    with pytest.raises(ValueError, match="valid module name"):
        cadence.Module(name="1 bad name")


def test_submodules_are_found_in_containers_depth_first_each_once():
    root = cadence.Module(name="root")
    shared = nn.Linear(2, 2)
    child = cadence.Module(name="child")
    child.layer = shared
    root.children_list = [child, shared]
    root.by_name = {"again": child, "torch": nn.Sequential(nn.Linear(2, 3), nn.ReLU())}
    found = root.submodules
    # sorted attribute names: by_name (again -> child, child.layer; torch -> Sequential ...),
    # then children_list (all seen already)
    sequential = root.by_name["torch"]
    assert found == (child, shared, sequential, sequential[0], sequential[1])


def test_cycles_do_not_recurse_forever():
    a, b = cadence.Module(), cadence.Module()
    a.b, b.a = b, a
    assert a.submodules == (b,)


def test_variables_cover_parameters_buffers_tensor_attributes_and_optimizer_state():
    holder = cadence.Module()
    holder.net = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    holder.scale = torch.ones(1)
    holder.optimizer = torch.optim.SGD(holder.net.parameters(), lr=0.1, momentum=0.9)
    holder.net(torch.randn(4, 3)).sum().backward()
    holder.optimizer.step()
    variables = holder.variables
    assert len({id(v) for v in variables}) == len(variables)
    params = list(holder.net.parameters())
    assert [id(v) for v in holder.trainable_variables] == [id(p) for p in params]
    momentum = [holder.optimizer.state[p]["momentum_buffer"] for p in params]
    non_trainable = {id(v) for v in holder.non_trainable_variables}
    assert {id(m) for m in momentum} <= non_trainable
    assert id(holder.scale) in non_trainable
    assert id(holder.net[1].running_mean) in non_trainable
    assert holder.variables == variables  # stable order


def test_name_scope_nests_and_labels_profiler_ranges():
    class Encoder(cadence.Module):
        @cadence.Module.with_name_scope
        def __call__(self):
            return current_scope()

    outer = cadence.Module(name="model")
    outer.encoder = Encoder()
    with outer.name_scope:
        assert outer.encoder() == "model/encoder"
    assert current_scope() == ""
    # the ranges are host-side events: profile the CPU (the default adds CUDA where it is
    # visible, also in a process that never started it)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        outer.encoder()
    assert "encoder" in {event.name for event in profiler.events()}


def test_state_dict_gathers_stateful_objects_and_checks_shapes_on_load():
    holder = cadence.Module()
    holder.net = nn.Linear(3, 2)
    holder.optimizer = torch.optim.SGD(holder.net.parameters(), lr=0.1)
    state = holder.state_dict()
    assert set(state) == {"net", "optimizer"}
    other = cadence.Module()
    other.net = nn.Linear(4, 2)
    other.optimizer = torch.optim.SGD(other.net.parameters(), lr=0.1)
    other.extra = nn.Linear(1, 1)
    with pytest.raises(cadence.CheckpointMismatchError) as raised:
        other.load_state_dict(state)
    message = str(raised.value)
    assert "missing from the checkpoint: 'extra'" in message
    assert "'weight' has shape (2, 3) in the checkpoint, (2, 4) in the model" in message


def test_a_checkpoint_holds_the_declared_parts_not_whatever_an_attribute_walk_finds():
    class Runner(cadence.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(2, 2)
            self.optimizers = [torch.optim.SGD(self.net.parameters(), lr=0.1)]
            self.inner = cadence.Module()
            self.inner.head = nn.Linear(2, 1)
            self._per_loop = {"scale": cadence.Mean()}  # private: transient, never saved

    assert sorted(Runner().checkpoint_items()) == ["inner.head", "net", "optimizers.0"]

    class Declares(Runner):
        def checkpoint_items(self):
            return {**super().checkpoint_items(), "per_loop": self._per_loop["scale"]}

    assert "per_loop" in Declares().state_dict()


def test_a_runner_attribute_named_like_its_own_parts_is_refused():
    class Clash(cadence.StandardTrainer):
        def train_step(self, iterator):
            pass

    runner = Clash([1])
    runner.train_data = nn.Linear(1, 1)
    with pytest.raises(ValueError, match=r"\[.train_data.\] of Clash collide"):
        runner.checkpoint_items()
