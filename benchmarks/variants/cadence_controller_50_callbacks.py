"""The Controller variant plus 50 callbacks that hook loops and epochs but not steps."""

DESCRIPTION = "cadence_controller + 50 callbacks that do not hook steps (they must cost nothing)"


def build(x, y, workdir):
    from workload import load_variant

    import cadence

    base = load_variant("cadence_controller")

    class Bookkeeping(cadence.Callback):
        def on_loop_end(self, state, logs):
            self.last = state.global_step

        def on_epoch_end(self, state):
            self.epochs = state.epoch

    return base.build(x, y, workdir, extra_callbacks=[Bookkeeping() for _ in range(50)])
