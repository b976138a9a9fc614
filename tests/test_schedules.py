"""Pipeline schedules as tick tables: generators, validation, bubble / memory numbers, rendering."""
from __future__ import annotations

import pytest
from PIL import Image

from snnjax.parallel import schedules as sc
from snnjax.parallel.schedules import Action, Schedule, ScheduleError


def _grid():
    for s in range(1, 6):
        for m in range(1, 10):
            yield s, m


# -- generators ----------------------------------------------------------------------------------


@pytest.mark.parametrize("gen", [sc.gpipe, sc.one_f_one_b, sc.zero_bubble])
def test_generators_validate_on_a_grid(gen):
    for s, m in _grid():
        schedule = gen(s, m)
        sc.validate(schedule)
        assert (schedule.num_devices, schedule.num_microbatches, schedule.virtual) == (s, m, 1)


def test_interleaved_validates_on_a_grid():
    for s in range(1, 5):
        for m in range(s, 3 * s + 1, s):
            for v in range(1, 4):
                sched = sc.interleaved(s, m, v)
                sc.validate(sched)
                assert sched.num_stages == s * v


def test_interleaved_needs_microbatches_a_multiple_of_devices():
    with pytest.raises(ValueError, match=r"microbatches \(6\) to be a multiple of the number of devices \(4\)"):
        sc.interleaved(4, 6, 2)


def test_makespans_match_the_textbook_formulas():
    for s, m in _grid():
        assert sc.makespan(sc.gpipe(s, m)) == 2 * (m + s - 1)
        assert sc.makespan(sc.one_f_one_b(s, m)) == 2 * (m + s - 1)
        if m >= s:
            assert sc.makespan(sc.zero_bubble(s, m)) == 3 * m + s - 1
    for s, m, v in [(4, 4, 2), (4, 8, 2), (4, 8, 3), (2, 6, 2), (3, 9, 4)]:
        assert sc.makespan(sc.interleaved(s, m, v)) == 2 * (m * v + s - 1)


def test_pinned_bubble_fractions():
    # Unit ticks: GPipe / 1F1B run 2M busy ticks per device in 2(M+S-1): bubble (S-1)/(M+S-1).
    assert sc.bubble_fraction(sc.gpipe(4, 4)) == pytest.approx(3 / 7)
    assert sc.bubble_fraction(sc.gpipe(4, 8)) == pytest.approx(3 / 11)
    assert sc.bubble_fraction(sc.one_f_one_b(4, 8)) == pytest.approx(3 / 11)
    # Interleaved: 2MV busy chunk-ticks in 2(MV+S-1): (S-1)/(MV+S-1).
    assert sc.bubble_fraction(sc.interleaved(4, 8, 2)) == pytest.approx(3 / 19)
    assert sc.bubble_fraction(sc.interleaved(4, 4, 2)) == pytest.approx(3 / 11)
    # ZB-H1: 3M busy ticks in 3M+S-1: (S-1)/(3M+S-1).
    assert sc.bubble_fraction(sc.zero_bubble(4, 8)) == pytest.approx(3 / 27)


def test_interleaved_has_a_smaller_bubble_than_1f1b():
    for s, m in [(2, 4), (4, 4), (4, 8), (3, 6)]:
        assert sc.bubble_fraction(sc.interleaved(s, m, 2)) < sc.bubble_fraction(sc.one_f_one_b(s, m))


def test_peak_in_flight_1f1b_gpipe_interleaved():
    assert sc.peak_in_flight(sc.one_f_one_b(4, 8)) == (4, 3, 2, 1)
    assert sc.peak_in_flight(sc.gpipe(4, 8)) == (8, 8, 8, 8)
    for s, m in _grid():
        assert sc.peak_in_flight(sc.one_f_one_b(s, m)) == tuple(min(s - d, m) for d in range(s))
        assert sc.peak_in_flight(sc.gpipe(s, m)) == (m,) * s
    # Megatron's warm-up 2(S-d-1) + (V-1)S forwards plus one, in chunks, capped at MV.
    assert sc.peak_in_flight(sc.interleaved(4, 8, 2)) == (11, 9, 7, 5)
    assert sc.peak_in_flight(sc.interleaved(4, 4, 2)) == (8, 8, 7, 5)


def test_zero_bubble_halves_1f1b_idle_ticks_at_the_same_peak_memory():
    for s, m in _grid():
        zb, ofob = sc.zero_bubble(s, m), sc.one_f_one_b(s, m)
        assert sc.peak_in_flight(zb) == sc.peak_in_flight(ofob)
        assert max(sc.peak_in_flight(zb, release="W")) == max(sc.peak_in_flight(ofob)) == min(s, m)
        if m >= s:
            assert sc.idle_ticks(zb) == (s - 1,) * s
            assert sc.idle_ticks(ofob) == (2 * (s - 1),) * s
        assert sum(sc.idle_ticks(zb)) <= sum(sc.idle_ticks(ofob))  # equal when M = 1: nothing to fill


def test_bubble_fraction_with_costs_is_lockstep():
    # 1F1B(4, 8) with B costing 2: ticks 0..3 hold only Fs (1 each), ticks 4..21 each hold a B (2 each):
    # 40 time units x 4 devices = 160, busy 4 x (8 + 2 x 8) = 96, idle 64.
    assert sc.bubble_fraction(sc.one_f_one_b(4, 8), {"F": 1, "B": 2}) == pytest.approx(64 / 160)
    zb = sc.zero_bubble(4, 8)
    assert sc.bubble_fraction(zb, {"F": 1, "B": 1, "W": 1}) == pytest.approx(sc.bubble_fraction(zb))


def test_a_deadlocking_program_is_reported():
    with pytest.raises(RuntimeError, match="no device can act at tick 0"):
        sc._execute("bad", 1, 1, 1, [[Action("B", 0, 0), Action("F", 0, 0)]])


# -- validate ------------------------------------------------------------------------------------


def _sched(rows, devices=1, microbatches=1, virtual=1, split=False):
    return Schedule("hand", devices, microbatches, virtual, split, tuple(tuple(r) for r in rows))


F00, B00, W00 = Action("F", 0, 0), Action("B", 0, 0), Action("W", 0, 0)
F01, B01 = Action("F", 0, 1), Action("B", 0, 1)


def test_validate_accepts_a_hand_written_table():
    sc.validate(_sched([[F00, None], [None, F01], [None, B01], [B00, None]], devices=2))
    sc.validate(_sched([[F00], [B00], [W00]], split=True))


@pytest.mark.parametrize(("rows", "kw", "message"), [
    ([[B00], [F00]], {}, r"B\(microbatch=0, stage=0\) at tick 0 needs F\(microbatch=0, stage=0\) at an earlier "
                         r"tick, but it runs at tick 1"),
    ([[F00]], {}, r"B\(microbatch=0, stage=0\) is missing"),
    ([[F00], [F00], [B00]], {}, r"F\(microbatch=0, stage=0\) runs twice: at ticks 0 and 1"),
    ([[None, F00], [None, B00]], {"devices": 2},
     r"F\(microbatch=0, stage=0\) at tick 0 runs on device 1, but stage 0 lives on device 0"),
    ([[F00, F01], [None, B01], [B00, None]], {"devices": 2},
     r"F\(microbatch=0, stage=1\) at tick 0 needs F\(microbatch=0, stage=0\) at an earlier tick, but it runs at "
     r"tick 0"),
    ([[F00, None], [None, F01], [B00, B01]], {"devices": 2},
     r"B\(microbatch=0, stage=0\) at tick 2 needs B\(microbatch=0, stage=1\) at an earlier tick"),
    ([[F00], [W00], [B00]], {"split": True}, r"W\(microbatch=0, stage=0\) at tick 1 needs B\(microbatch=0, "
                                             r"stage=0\) at an earlier tick"),
    ([[F00], [B00], [W00]], {}, r"W\(microbatch=0, stage=0\) at tick 2: kind 'W'.*split_backward"),
    ([[F00], [B00]], {"split": True}, r"W\(microbatch=0, stage=0\) is missing"),
    ([[Action("F", 1, 0)], [F00], [B00]], {}, r"F\(microbatch=1, stage=0\) at tick 0 is out of range"),
    ([[F00, None], [B00]], {}, r"tick 0 has 2 entries for 1 devices"),
])
def test_validate_rejects_broken_tables(rows, kw, message):
    with pytest.raises(ScheduleError, match=message):
        sc.validate(_sched(rows, **kw))


def test_validate_rejects_every_single_deletion():
    schedule = sc.zero_bubble(3, 3)
    for t, row in enumerate(schedule.table):
        for d, a in enumerate(row):
            if a is not None:
                broken = list(schedule.table)
                broken[t] = row[:d] + (None,) + row[d + 1:]
                with pytest.raises(ScheduleError, match=str(a).replace("(", r"\(").replace(")", r"\)")):
                    sc.validate(_sched(broken, devices=3, microbatches=3, split=True))


def test_peak_in_flight_release_w_needs_a_split_schedule():
    with pytest.raises(ValueError, match="split-backward"):
        sc.peak_in_flight(sc.one_f_one_b(2, 2), release="W")


# -- rendering -----------------------------------------------------------------------------------


def test_render_text_1f1b():
    assert sc.render_text(sc.one_f_one_b(2, 3)) == (
        "d0: F0 F1 .  B0 F2 B1 .  B2\n"
        "d1: .  F0 B0 F1 B1 F2 B2 .")


def test_render_text_gpipe_and_zero_bubble():
    assert sc.render_text(sc.gpipe(2, 3)) == (
        "d0: F0 F1 F2 .  .  B0 B1 B2\n"
        "d1: .  F0 F1 F2 B0 B1 B2 .")
    assert sc.render_text(sc.zero_bubble(2, 3)) == (
        "d0: F0 F1 .  B0 W0 F2 B1 W1 B2 W2\n"
        "d1: .  F0 B0 F1 B1 W0 F2 B2 W1 W2")


def test_render_text_interleaved_shows_the_chunk():
    assert sc.render_text(sc.interleaved(2, 2, 2)) == (
        "d0: F0.0 F1.0 F0.1 F1.1 .    B0.1 .    B1.1 B0.0 B1.0\n"
        "d1: .    F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 B0.0 B1.0 .")


def test_render_png(tmp_path):
    schedule = sc.zero_bubble(2, 3)
    path = tmp_path / "zb.png"
    size = sc.render_png(schedule, str(path))
    assert size == (sc.MARGIN + sc.CELL_W * 10, sc.CELL_H * 2)
    with Image.open(path) as img:
        assert img.format == "PNG" and img.size == size
        img = img.convert("RGB")

        def corner(tick, device):  # a pixel inside the cell, away from its text
            return img.getpixel((sc.MARGIN + tick * sc.CELL_W + sc.CELL_W - 4, device * sc.CELL_H + sc.CELL_H - 4))

        assert corner(0, 0) == sc.COLORS["F"]
        assert corner(3, 0) == sc.COLORS["B"]
        assert corner(4, 0) == sc.COLORS["W"]
        assert corner(2, 0) == (255, 255, 255)  # idle


def test_cli(capsys, tmp_path):
    sc.main(["--schedule", "1f1b", "--devices", "2", "--microbatches", "3", "--png", str(tmp_path / "s.png")])
    out = capsys.readouterr().out
    assert out.startswith("d0: F0 F1 .  B0 F2 B1 .  B2\n")
    assert "makespan 8 ticks, bubble fraction 0.250, peak in flight per device [2, 1]" in out
    assert (tmp_path / "s.png").exists()
    with pytest.raises(ValueError, match="--virtual applies to the interleaved schedule only"):
        sc.main(["--schedule", "gpipe", "--virtual", "2"])
