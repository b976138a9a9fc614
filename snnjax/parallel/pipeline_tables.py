"""A schedule as the arrays the pipeline executor reads each tick: which branch, which microbatch, which buffer slots.

The executor (``snnjax.parallel.pipeline``) runs one ``lax.scan`` step per tick of a
``snnjax.parallel.schedules.Schedule``. Every device reads row ``tick`` of each table at
column ``axis_index("stage")``:

* ``branch``: 0 idle; ``1 + g`` F of virtual stage ``g``; ``1 + G + g`` its B; ``1 + 2G + g`` its W
  (``G = S * V`` virtual stages);
* ``microbatch``: the action's microbatch (0 when idle);
* ``act_read``: the slot of the activation buffer holding the action's stage input (F and B of stages
  after the first; the stage input is kept from its arrival until its B, which recomputes the forward);
* ``act_write``: the slot where the activation that arrives at the end of the tick (from the previous
  device's F) is stored;
* ``cot_read`` / ``cot_write``: the same for output cotangents (B of stages before the last; they arrive
  from the next device's B);
* ``w_read`` / ``w_write``: the slot of the weight-gradient buffer (split backward only): B writes what
  its W needs, W reads it.

Each buffer has ``slots + 1`` rows: the last one is a trash row that every "nothing to store" writes to,
so the executor never branches on whether to write. Slots are assigned per device by interval
colouring, so a buffer's size is the schedule's peak number of items held at once (1F1B: at most S
stage inputs per device; GPipe: M).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from snnjax.parallel.schedules import Action, Schedule


@dataclasses.dataclass(frozen=True)
class Tables:
    """Per-tick, per-device integer tables ``[ticks, S]`` and the buffer sizes (slots, without the trash row)."""

    branch: np.ndarray
    microbatch: np.ndarray
    act_read: np.ndarray
    act_write: np.ndarray
    cot_read: np.ndarray
    cot_write: np.ndarray
    w_read: np.ndarray
    w_write: np.ndarray
    act_slots: int
    cot_slots: int
    w_slots: int

    @property
    def ticks(self) -> int:
        return self.branch.shape[0]

    def arrays(self) -> dict[str, np.ndarray]:
        """The tables as a dict (the scan's ``xs``)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if isinstance(getattr(self, f.name),
                                                                                              np.ndarray)}


def _assign(intervals: dict[tuple, tuple[int, int]]) -> tuple[dict[tuple, int], int]:
    """Slots for items held over ticks ``(start, end]`` (stored at the end of ``start``, last read at ``end``)."""
    slots: dict[tuple, int] = {}
    free_at: list[int] = []  # per slot: the tick after which it is free
    for item, (start, end) in sorted(intervals.items(), key=lambda kv: (kv[1][0], kv[0])):
        for k, free in enumerate(free_at):
            if free <= start:
                slots[item], free_at[k] = k, end
                break
        else:
            slots[item] = len(free_at)
            free_at.append(end)
    return slots, len(free_at)


def build(schedule: Schedule) -> Tables:
    """The executor's tables for ``schedule`` (which must be valid: ``schedules.validate``)."""
    s, g_count = schedule.num_devices, schedule.num_stages
    ticks = len(schedule.table)
    when: dict[Action, int] = {a: t for t, row in enumerate(schedule.table) for a in row if a is not None}
    device = {g: g % s for g in range(g_count)}

    def b_tick(m, g):
        return when[Action("B", m, g)]

    acts, cots, ws = [{} for _ in range(s)], [{} for _ in range(s)], [{} for _ in range(s)]
    for a, t in when.items():
        m, g = a.microbatch, a.stage
        if a.kind == "F" and g + 1 < g_count:  # arrives on the next stage's device, held until its B
            acts[device[g + 1]][(m, g + 1)] = (t, b_tick(m, g + 1))
        if a.kind == "B" and g > 0:  # the input cotangent of stage g is stage g-1's output cotangent
            cots[device[g - 1]][(m, g - 1)] = (t, b_tick(m, g - 1))
        if a.kind == "W":
            ws[device[g]][(m, g)] = (b_tick(m, g), t)
    assigned = [[_assign(per_device[d]) for d in range(s)] for per_device in (acts, cots, ws)]
    sizes = [max([n for _, n in per] + [0]) for per in assigned]
    act_slot, cot_slot, w_slot = [[slots for slots, _ in per] for per in assigned]

    tab = {k: np.zeros((ticks, s), np.int32) for k in ("branch", "microbatch")}
    trash = {"act": sizes[0], "cot": sizes[1], "w": sizes[2]}
    for k, n in (("act", trash["act"]), ("cot", trash["cot"]), ("w", trash["w"])):
        tab[f"{k}_read"] = np.full((ticks, s), n, np.int32)
        tab[f"{k}_write"] = np.full((ticks, s), n, np.int32)
    for t, row in enumerate(schedule.table):
        for d, a in enumerate(row):
            if a is None:
                continue
            m, g = a.microbatch, a.stage
            tab["branch"][t, d] = 1 + g + g_count * "FBW".index(a.kind)
            tab["microbatch"][t, d] = m
            if a.kind in "FB" and g > 0:
                tab["act_read"][t, d] = act_slot[d][(m, g)]
            if a.kind == "B" and g + 1 < g_count:
                tab["cot_read"][t, d] = cot_slot[d][(m, g)]
            if a.kind == "B" and schedule.split_backward:
                tab["w_write"][t, d] = w_slot[d][(m, g)]
            if a.kind == "W":
                tab["w_read"][t, d] = w_slot[d][(m, g)]
            if a.kind == "F" and g + 1 < g_count:
                nd = device[g + 1]
                tab["act_write"][t, nd] = act_slot[nd][(m, g + 1)]
            if a.kind == "B" and g > 0:
                pd = device[g - 1]
                tab["cot_write"][t, pd] = cot_slot[pd][(m, g - 1)]
    return Tables(**tab, act_slots=sizes[0], cot_slots=sizes[1], w_slots=sizes[2])
