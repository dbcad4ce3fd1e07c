"""Step boundaries from the global optimizer step hooks.

Step k runs from the end of optimizer step k-1 (or the first recorded event) to
the end of optimizer step k. With several optimizers, the first one ever
stepped defines the step; every optimizer's step is an "optimizer" span.
"""

from collectors import nvtx_ranges
from collectors.clock import now_ns
from collectors.core_wait import queued_ns, queued_since
from collectors.instrument import InjectedFailure, injected_failure

RECENT_STEPS = 64  # per-step history kept in progress.json for live metrics


def install(rec):
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    st = rec.state
    primary = []  # id of the optimizer that defines the step
    started: dict = {}  # id(optimizer) -> (start_ns, queued_ns) of its running step()
    fail = injected_failure("steps")

    def pre(optimizer, args, kwargs):
        try:
            if fail:
                raise InjectedFailure("steps")
            q = queued_ns()
            t = now_ns()
            started[id(optimizer)] = (t, q)
            if not primary:
                primary.append(id(optimizer))
            if st.step_start_ns is None:
                st.step_start_ns = t
            if nvtx_ranges.MIRRORING:
                nvtx_ranges.push("optimizer", "optimizer")
        except Exception as exc:
            rec.record_error("steps", exc)

    def post(optimizer, args, kwargs):
        try:
            t = now_ns()
            began = started.pop(id(optimizer), None)
            if began is None:
                return
            t0, q0 = began
            if nvtx_ranges.MIRRORING:
                nvtx_ranges.pop()
            rec.add(
                ("optimizer", "optimizer", t0, t, st.step, -1, -1, "", "", -1, -1, 0, False, "", "", queued_since(q0))
            )
            if id(optimizer) == primary[0]:
                rec.add(("step", "step", st.step_start_ns, t, st.step, -1, -1, "", "", -1, -1, 0, False, "", "", -1))
                prog = rec.progress
                step_ms = (t - st.step_start_ns) / 1e6
                prog["last_step_ms"] = step_ms
                prog["steps_done"] = st.step + 1
                recent = prog["recent_steps"]
                recent.append([st.step, step_ms, st.data_wait_ns / 1e6])
                if len(recent) > RECENT_STEPS:
                    del recent[0]
                st.data_wait_ns = 0
                rec.step_done()
                st.step += 1
                prog["step"] = st.step
                st.step_start_ns = t
        except Exception as exc:
            rec.record_error("steps", exc)

    register_optimizer_step_pre_hook(pre)
    register_optimizer_step_post_hook(post)
