"""vLLM's V1 scheduler, told which requests may run (`SchedulerConfig.scheduler_cls`, a documented
setting; we subclass, nothing is patched).

The core decides each cycle which slots step: a slot whose text ran dry is parked, one whose listener
stops reading is paused, and both must sit out with their KV intact, then resume without padding or a
second prefill. vLLM schedules every running request it can; so for one `schedule()` the requests the
talker did not allow this step leave the running list and come back after it, in their place in the
queue. Preemption (recompute) would replay a request's outputs as a token span our hooks cannot
rebuild, so the talker sizes the KV cache so that it cannot happen, and this fails loudly if it does.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler

from engine.vllm_talker import side as side_state
from engine.vllm_talker.side import expect


class VoxgateScheduler(Scheduler):
    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        side = side_state.current()
        if side is None or not side.stepping:
            return super().schedule(*args, **kwargs)
        expect(all(r.request_id in side.allowed for r in self.waiting),
               "a request the talker did not start this step waits in vLLM's queue")
        held = [r for r in self.running if r.request_id not in side.allowed]
        if held:
            self.running = [r for r in self.running if r.request_id in side.allowed]
        try:
            out = super().schedule(*args, **kwargs)
        finally:
            if held:
                self.running = self.running + held
        if out.preempted_req_ids:
            side.preemptions += len(out.preempted_req_ids)
        expect(not out.preempted_req_ids,
               f"vLLM preempted {sorted(out.preempted_req_ids)}: the talker's KV budget is too small "
               "(recompute would replay outputs our per-step hooks cannot rebuild)")
        scheduled = set(out.num_scheduled_tokens)
        expect(scheduled <= side.allowed, f"vLLM scheduled {sorted(scheduled - side.allowed)}, not allowed")
        # After schedule() a request's computed tokens include this step's: a prompt that is still
        # short of its end is a partial prefill chunk, whose sampled token vLLM throws away.
        side.sampling = {rid for rid in scheduled if not self.requests[rid].is_prefill_chunk}
        return out
