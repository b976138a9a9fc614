"""Pipeline schedules as data: tick tables over the ``stage`` mesh axis, their checks, costs and pictures.

    s = schedules.one_f_one_b(4, 8)               # or gpipe, interleaved(4, 8, 2), zero_bubble(4, 8)
    schedules.validate(s)                         # raises ScheduleError naming the action and tick
    print(schedules.render_text(s))               # d0: F0 F1 F2 F3 .  .  .  B0 F4 B1 ...
    schedules.bubble_fraction(s), schedules.peak_in_flight(s)

A ``Schedule`` is a table: one row per tick, one entry per device, each an ``Action``
(forward ``F``, backward ``B``, weight-gradient backward ``W``) or ``None`` (idle).
With ``V`` virtual stages per device, device ``d`` holds stages ``d, d + S, d + 2S, ...``.

Unit assumption: every action takes one tick, and an action's output (to the next
stage, or to its own B / W) can be used from the next tick on, whether or not that
stage sits on another device. Ticks are lockstep (an executor runs one ``lax.scan``
step per tick), so a valid table cannot deadlock: every dependency ran at an earlier
tick. A tick of an interleaved schedule is one chunk (1/V of a device's layers), so
compare schedules by bubble fraction, not by makespan.

Every generator is one list scheduler (``_execute``) fed different programs: each device
has its F / B actions in a fixed order (as Megatron and torch.distributed.pipelining
order them), runs the next one as soon as its inputs are there and idles otherwise;
zero-bubble also slots its W actions into the idle ticks.
"""
from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence

KINDS = ("F", "B", "W")
COLORS = {"F": (76, 132, 200), "B": (230, 140, 60), "W": (90, 170, 100)}  # RGB per kind in render_png


class ScheduleError(ValueError):
    """A table that breaks a pipeline rule; the message names the action and tick."""


@dataclasses.dataclass(frozen=True, order=True)
class Action:
    """One unit of work: ``kind`` F / B / W of ``microbatch`` (0..M-1) on virtual ``stage`` (0..S*V-1)."""

    kind: str
    microbatch: int
    stage: int

    def __str__(self) -> str:
        return f"{self.kind}(microbatch={self.microbatch}, stage={self.stage})"

    def label(self, num_devices: int, virtual: int = 1) -> str:
        """Short text: ``F3``, or ``F3.1`` (microbatch 3, virtual chunk 1) when ``virtual > 1``."""
        if virtual == 1:
            return f"{self.kind}{self.microbatch}"
        return f"{self.kind}{self.microbatch}.{self.stage // num_devices}"


Row = tuple[Action | None, ...]


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A tick table: ``table[tick][device]`` is the ``Action`` that device runs then, or ``None``."""

    name: str
    num_devices: int
    num_microbatches: int
    virtual: int
    split_backward: bool
    table: tuple[Row, ...]

    @property
    def num_stages(self) -> int:
        return self.num_devices * self.virtual

    def kinds(self) -> tuple[str, ...]:
        return KINDS if self.split_backward else KINDS[:2]


# -- dependencies -----------------------------------------------------------------------------


def _deps(a: Action, num_stages: int) -> tuple[Action, ...]:
    """The actions ``a`` needs finished at an earlier tick."""
    m, s = a.microbatch, a.stage
    if a.kind == "F":
        return (Action("F", m, s - 1),) if s > 0 else ()
    if a.kind == "B":
        return (Action("F", m, s),) + ((Action("B", m, s + 1),) if s < num_stages - 1 else ())
    return (Action("B", m, s),)


# -- the list scheduler ---------------------------------------------------------------------------


def _execute(name: str, num_devices: int, num_microbatches: int, virtual: int, programs: Sequence[Sequence[Action]],
             w_cap: int | None = None) -> Schedule:
    """Run each device's program (its F and B actions in order) tick by tick, waiting for dependencies.

    With ``w_cap`` the backward is split: each B leaves a W pending on its device. A pending W
    runs when the program's head is not ready (filling a bubble), or when the head is an F that
    would put more than ``w_cap`` microbatches on the device between their F and their W.
    """
    num_stages = num_devices * virtual
    queues = [list(p) for p in programs]
    pending: list[list[Action]] = [[] for _ in programs]
    held = [0] * num_devices  # forwards whose W has not run (split schedules only)
    done: dict[Action, int] = {}
    table: list[Row] = []
    while any(queues) or any(pending):
        tick = len(table)
        row = tuple(_next(queues[d], pending[d], held[d], w_cap, done, tick, num_stages) for d in range(num_devices))
        if not any(row):
            raise RuntimeError(f"{name}: no device can act at tick {tick}; the programs deadlock")
        for d, a in enumerate(row):
            if a is None:
                continue
            done[a] = tick
            if a.kind == "W":
                pending[d].pop(0)
                held[d] -= 1
                continue
            queues[d].pop(0)
            held[d] += a.kind == "F"
            if w_cap is not None and a.kind == "B":
                pending[d].append(Action("W", a.microbatch, a.stage))
        table.append(row)
    return Schedule(name, num_devices, num_microbatches, virtual, w_cap is not None, tuple(table))


def _next(queue: Sequence[Action], pending: Sequence[Action], held: int, w_cap: int | None,
          done: Mapping[Action, int], tick: int, num_stages: int) -> Action | None:
    def ready(a: Action) -> bool:
        return all(done.get(dep, tick) < tick for dep in _deps(a, num_stages))

    w = pending[0] if pending and ready(pending[0]) else None
    head = queue[0] if queue else None
    if head is not None and head.kind == "F" and w_cap is not None and held >= w_cap:
        return w
    if head is not None and ready(head):
        return head
    return w


def _one_f_one_b_program(forwards: Sequence[Action], backwards: Sequence[Action], warmup: int) -> list[Action]:
    """``warmup`` forwards, then one F / one B until the forwards run out, then the remaining backwards."""
    warmup = min(warmup, len(forwards))
    program = list(forwards[:warmup])
    for i, f in enumerate(forwards[warmup:]):
        program += [f, backwards[i]]
    return program + list(backwards[len(forwards) - warmup:])


def _check_sizes(num_devices: int, num_microbatches: int, virtual: int = 1) -> None:
    if num_devices < 1 or num_microbatches < 1 or virtual < 1:
        raise ValueError(f"need devices, microbatches and virtual stages >= 1, got S={num_devices}, "
                         f"M={num_microbatches}, V={virtual}")


def _in_order(kind: str, num_microbatches: int, stage: int) -> list[Action]:
    return [Action(kind, m, stage) for m in range(num_microbatches)]


# -- generators ----------------------------------------------------------------------------------


def gpipe(num_devices: int, num_microbatches: int) -> Schedule:
    """GPipe: every forward, then every (combined) backward; each device holds all M microbatches' activations.

    Makespan ``2(M + S - 1)`` ticks, bubble fraction ``(S - 1) / (M + S - 1)``.
    """
    _check_sizes(num_devices, num_microbatches)
    m = num_microbatches
    programs = [_in_order("F", m, d) + _in_order("B", m, d) for d in range(num_devices)]
    return _execute("gpipe", num_devices, m, 1, programs)


def one_f_one_b(num_devices: int, num_microbatches: int) -> Schedule:
    """1F1B (PipeDream-flush): S-d-1 warm-up forwards on device d, then one F / one B, then the cool-down Bs.

    GPipe's makespan and bubble, but device d holds at most ``min(S - d, M)`` microbatches' activations.
    """
    _check_sizes(num_devices, num_microbatches)
    m, s = num_microbatches, num_devices
    programs = [_one_f_one_b_program(_in_order("F", m, d), _in_order("B", m, d), s - d - 1) for d in range(s)]
    return _execute("1f1b", s, m, 1, programs)


def interleaved(num_devices: int, num_microbatches: int, virtual: int) -> Schedule:
    """Megatron's interleaved 1F1B: device d holds stages d, d+S, ..., d+(V-1)S.

    Forwards go in groups of S microbatches per chunk (microbatches 0..S-1 through chunk 0,
    the same through chunk 1, ..., then the next S microbatches), backwards likewise from
    the last chunk; device d warms up with ``2(S-d-1) + (V-1)S`` forwards. As in Megatron,
    M must be a multiple of S. Makespan ``2(MV + S - 1)`` ticks of one chunk each, bubble
    fraction ``(S - 1) / (MV + S - 1)``.
    """
    _check_sizes(num_devices, num_microbatches, virtual)
    s, m, v = num_devices, num_microbatches, virtual
    if m % s:
        raise ValueError(f"interleaved needs the number of microbatches ({m}) to be a multiple of the number of "
                         f"devices ({s}), as Megatron's interleaved schedule does")

    def order(kind: str, d: int) -> list[Action]:
        out = []
        for k in range(m * v):
            chunk = (k % (s * v)) // s
            chunk = v - 1 - chunk if kind == "B" else chunk
            out.append(Action(kind, (k // (s * v)) * s + k % s, chunk * s + d))
        return out

    programs = [_one_f_one_b_program(order("F", d), order("B", d), 2 * (s - d - 1) + (v - 1) * s) for d in range(s)]
    return _execute(f"interleaved(V={v})", s, m, v, programs)


def zero_bubble(num_devices: int, num_microbatches: int) -> Schedule:
    """ZB-H1: 1F1B with the backward split into B (input gradient) and W (weight gradient).

    Each device runs 1F1B's F / B program; its Ws wait and fill the bubbles, but no device holds
    more than S microbatches between F and W (1F1B's peak, on device 0). For M >= S the makespan
    is ``3M + S - 1`` ticks: S - 1 idle ticks per device where 1F1B with B and W back to back has 3(S - 1).
    """
    _check_sizes(num_devices, num_microbatches)
    m, s = num_microbatches, num_devices
    programs = [_one_f_one_b_program(_in_order("F", m, d), _in_order("B", m, d), s - d - 1) for d in range(s)]
    return _execute("zb-h1", s, m, 1, programs, w_cap=s)


GENERATORS = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved": interleaved, "zb-h1": zero_bubble}


# -- validation ----------------------------------------------------------------------------------


def validate(schedule: Schedule) -> None:
    """Raise ``ScheduleError`` unless every action runs exactly once, on its device, after its dependencies.

    Checks, in order: each row has one entry per device; each action's kind, microbatch and
    stage are in range (W only when ``split_backward``) and its stage lives on that device
    (``stage % S == device``); no action runs twice; every dependency (F of the previous stage,
    B of the next stage, the F before a B, the B before a W) ran at an earlier tick; nothing is
    missing. Passing implies deadlock freedom: ticks are lockstep and all inputs come from the past.
    """
    s = schedule
    ticks: dict[Action, int] = {}
    for tick, row in enumerate(s.table):
        if len(row) != s.num_devices:
            raise ScheduleError(f"tick {tick} has {len(row)} entries for {s.num_devices} devices")
        for device, a in enumerate(row):
            if a is None:
                continue
            _check_action(s, a, tick, device)
            if a in ticks:
                raise ScheduleError(f"{a} runs twice: at ticks {ticks[a]} and {tick}")
            ticks[a] = tick
    for a, tick in ticks.items():
        for dep in _deps(a, s.num_stages):
            if dep not in ticks:
                raise ScheduleError(f"{a} at tick {tick} needs {dep}, which never runs")
            if ticks[dep] >= tick:
                raise ScheduleError(f"{a} at tick {tick} needs {dep} at an earlier tick, but it runs at tick "
                                    f"{ticks[dep]}")
    for kind in s.kinds():
        for m in range(s.num_microbatches):
            for stage in range(s.num_stages):
                if Action(kind, m, stage) not in ticks:
                    raise ScheduleError(f"{Action(kind, m, stage)} is missing")


def _check_action(s: Schedule, a: Action, tick: int, device: int) -> None:
    if a.kind not in s.kinds():
        why = "" if a.kind != "W" else " (W needs split_backward=True)"
        raise ScheduleError(f"{a} at tick {tick}: kind {a.kind!r} is not one of {s.kinds()}{why}")
    if not (0 <= a.microbatch < s.num_microbatches and 0 <= a.stage < s.num_stages):
        raise ScheduleError(f"{a} at tick {tick} is out of range: {s.num_microbatches} microbatches, "
                            f"{s.num_stages} stages")
    if a.stage % s.num_devices != device:
        raise ScheduleError(f"{a} at tick {tick} runs on device {device}, but stage {a.stage} lives on device "
                            f"{a.stage % s.num_devices}")


# -- analysis ------------------------------------------------------------------------------------


def makespan(schedule: Schedule) -> int:
    """Length of the schedule in ticks."""
    return len(schedule.table)


def idle_ticks(schedule: Schedule) -> tuple[int, ...]:
    """Idle ticks per device."""
    return tuple(sum(row[d] is None for row in schedule.table) for d in range(schedule.num_devices))


def bubble_fraction(schedule: Schedule, costs: Mapping[str, float] | None = None) -> float:
    """Idle device-time / total device-time.

    Without ``costs`` every tick is one unit, so this is idle device-ticks / (S * makespan).
    With ``costs`` (time per kind, e.g. ``{"F": 1, "B": 2}``, or ``{"F": 1, "B": 1, "W": 1}``
    when split), ticks stay lockstep: a tick lasts as long as its costliest action (an
    all-idle tick one unit), and a device is idle for the rest of it.
    """
    if costs is None:
        return sum(idle_ticks(schedule)) / (schedule.num_devices * makespan(schedule))
    total = idle = 0.0
    for row in schedule.table:
        spent = [costs[a.kind] if a is not None else 0.0 for a in row]
        length = max(spent) if any(a is not None for a in row) else 1.0
        total += length * len(row)
        idle += sum(length - c for c in spent)
    return idle / total


def peak_in_flight(schedule: Schedule, release: str = "B") -> tuple[int, ...]:
    """Per device, the most (microbatch, stage) pairs whose F has run and whose ``release`` has not.

    Counted at the end of each tick; each pair is one stage's activations for one microbatch
    (one microbatch's when V = 1), so this is the activation-memory measure. ``release="W"``
    (split schedules) counts until the weight gradient, which also reads the activations.
    """
    if release not in ("B", "W") or (release == "W" and not schedule.split_backward):
        raise ValueError(f"release must be 'B' (or 'W' for a split-backward schedule), got {release!r}")
    peaks = []
    for d in range(schedule.num_devices):
        held = peak = 0
        for row in schedule.table:
            a = row[d]
            if a is not None:
                held += (a.kind == "F") - (a.kind == release)
            peak = max(peak, held)
        peaks.append(peak)
    return tuple(peaks)


# -- rendering -----------------------------------------------------------------------------------


def render_text(schedule: Schedule) -> str:
    """One row per device (``d0: F0 F1 . B0 ...``), one column per tick; ``.`` is idle."""
    s = schedule
    cells = [[a.label(s.num_devices, s.virtual) if a is not None else "." for a in row] for row in s.table]
    width = max((len(c) for row in cells for c in row), default=1)
    label = len(f"d{s.num_devices - 1}")
    lines = []
    for d in range(s.num_devices):
        row = " ".join(cells[t][d].ljust(width) for t in range(len(cells)))
        lines.append(f"{f'd{d}'.ljust(label)}: {row}".rstrip())
    return "\n".join(lines)


CELL_W, CELL_H, MARGIN = 30, 22, 40  # render_png's pixels: per tick, per device, for the device labels


def render_png(schedule: Schedule, path: str) -> tuple[int, int]:
    """Draw the timeline (F blue, B orange, W green, microbatch in each box) to ``path``; returns (width, height).

    The image is ``MARGIN + CELL_W * makespan`` by ``CELL_H * S`` pixels.
    """
    from PIL import Image, ImageDraw  # noqa: PLC0415 - only drawing needs Pillow

    s = schedule
    size = (MARGIN + CELL_W * makespan(s), CELL_H * s.num_devices)
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    for d in range(s.num_devices):
        y = d * CELL_H
        draw.text((4, y + 5), f"d{d}", fill="black")
        for t, row in enumerate(s.table):
            x = MARGIN + t * CELL_W
            a = row[d]
            if a is None:
                draw.rectangle((x, y, x + CELL_W - 1, y + CELL_H - 1), outline=(220, 220, 220))
                continue
            draw.rectangle((x, y, x + CELL_W - 1, y + CELL_H - 1), fill=COLORS[a.kind], outline="black")
            text = a.label(s.num_devices, s.virtual)[1:]
            draw.text((x + 3, y + 5), text, fill="black")
    img.save(path, format="PNG")
    return size


# -- command line --------------------------------------------------------------------------------


def _build(name: str, devices: int, microbatches: int, virtual: int) -> Schedule:
    if name == "interleaved":
        return interleaved(devices, microbatches, virtual)
    if virtual != 1:
        raise ValueError(f"--virtual applies to the interleaved schedule only, not {name!r}")
    return GENERATORS[name](devices, microbatches)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m snnjax.parallel.schedules --schedule 1f1b --devices 4 --microbatches 8 [--png out.png]``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedule", choices=sorted(GENERATORS), default="1f1b")
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--virtual", type=int, default=1)
    ap.add_argument("--png", default=None)
    args = ap.parse_args(argv)
    s = _build(args.schedule, args.devices, args.microbatches, args.virtual)
    validate(s)
    print(render_text(s))
    print(f"makespan {makespan(s)} ticks, bubble fraction {bubble_fraction(s):.3f}, "
          f"peak in flight per device {list(peak_in_flight(s))}")
    if args.png:
        render_png(s, args.png)
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
