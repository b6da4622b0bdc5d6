"""The Controller variant plus 50 callbacks that hook loops and epochs but not steps."""

DESCRIPTION = "cadence_controller + 50 callbacks that do not hook steps (they must cost nothing)"


def build(x, y, workdir):
    import importlib.util
    from pathlib import Path

    import cadence

    spec = importlib.util.spec_from_file_location(
        "cadence_controller_base", Path(__file__).with_name("cadence_controller.py"))
    base = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(base)

    class Bookkeeping(cadence.Callback):
        def on_loop_end(self, state, logs):
            self.last = state.global_step

        def on_epoch_end(self, state):
            self.epochs = state.epoch

    return base.build(x, y, workdir, extra_callbacks=[Bookkeeping() for _ in range(50)])
