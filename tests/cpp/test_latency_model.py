"""LatencyModel: the measured table, followed between its points, never a global functional form."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cpp_samples import BENT, CPU_LIKE, NPU_LIKE, TRUE, Quadratic, measured_model, model_of, start_up_samples, timed
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm_ascend.core.cpp_latency_model import FitError, LatencyModel, monotone_grid
from vllm_ascend.core.cpp_samples import Point

PROPERTIES = settings(max_examples=40, deadline=None)


def grid_model(truth, chunks=(1, 32, 64, 128, 256, 512, 1024, 2048), histories=(0, 8192, 32768)):
    return LatencyModel.from_points([Point(c, h, truth.time_ms(c, h), 1) for h in histories for c in chunks])


@pytest.mark.parametrize("truth", [TRUE, NPU_LIKE, CPU_LIKE, BENT])
def test_the_model_is_exact_at_every_measured_point(truth):
    model = grid_model(truth)
    for history in model.history_tokens:
        for chunk in model.chunk_tokens:
            assert model.time_ms(chunk, history) == pytest.approx(truth.time_ms(chunk, history), rel=1e-12)


def test_past_a_step_a_chunk_costs_the_upper_size_in_the_scalar_and_the_vectorised_questions():
    plain = grid_model(TRUE)
    model = LatencyModel.from_dict({**plain.to_dict(), "steps": [3]})  # 128 -> 256 tokens
    assert model.steps == (3,) and LatencyModel.from_dict(model.to_dict()) == model
    chunks = np.array([1.0, 100.0, 128.0, 129.0, 200.0, 256.0, 300.0, 4096.0])
    for history in (0, 5000, 40_000, 70_000):
        scalar = [model.time_ms(c, history) for c in chunks]
        np.testing.assert_allclose(model.time_ms_many(chunks, history), scalar, rtol=1e-12)
        times = np.array(scalar + [t * 0.999 for t in scalar])
        np.testing.assert_allclose(
            model.chunk_for_time_many(np.full(times.shape, float(history)), times),
            [model.chunk_for_time(history, t) for t in times],
            rtol=1e-12,
        )
        assert model.time_ms(129, history) == model.time_ms(256, history) > plain.time_ms(129, history)
        assert model.chunk_for_time(history, model.time_ms(256, history) * 0.999) == 128
        assert model.time_ms(100, history) == plain.time_ms(100, history)  # other segments as before
    with pytest.raises(FitError, match="steps must be"):
        LatencyModel.from_dict({**plain.to_dict(), "steps": [len(plain.chunk_tokens) - 1]})


@pytest.mark.parametrize("truth", [TRUE, NPU_LIKE, CPU_LIKE])
def test_between_profiled_points_a_smooth_surface_is_followed_within_one_and_a_half_percent(truth):
    model = measured_model(truth, noise=0.0)
    chunks = np.geomspace(32, 8192, 300)
    for history in (0, 5000, 30_000, 65_536):
        relative = model.time_ms_many(chunks, history) / truth.time_ms(chunks, history) - 1.0
        assert np.max(np.abs(relative)) < 0.015


@pytest.mark.parametrize("exponent", [0.0, 0.5, 1.0, 2.0, 2.7])
def test_a_power_law_between_nodes_is_exact_whatever_its_exponent(exponent):
    """Log-log interpolation assumes no exponent: fixed cost, linear work, attention alike."""

    class Power:
        def time_ms(self, c, h):
            return 3.0 * c**exponent + 1.0 + 0 * h

    model = grid_model(Power(), chunks=(1, 32, 96, 512, 4096))
    chunks = np.geomspace(33, 4000, 50)
    assert model.time_ms_many(chunks, 0) == pytest.approx(
        3.0 * chunks**exponent + 1.0, rel=0.02 if exponent == 0 else 0.06
    )


def test_a_bend_is_kept_where_it_was_measured():
    """Flat, then climbing time per token: the cheapest size per token is the bend's, as measured."""
    model = measured_model(BENT, noise=0.0, base_chunk_tokens=4096, max_history_tokens=0)
    chunks = np.arange(64, 4097, 16, dtype=np.float64)
    true_best = chunks[np.argmin(BENT.time_ms(chunks, 0) / chunks)]
    model_best = chunks[np.argmin(model.time_ms_many(chunks, 0) / chunks)]
    assert abs(model_best - true_best) <= 0.25 * true_best
    assert model.time_ms(4096, 0) / 4096 > 2.0 * model.time_ms(1024, 0) / 1024  # the climb is in the model


@PROPERTIES
@given(st.data())
def test_scalar_and_vectorised_answers_are_the_same_numbers(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
    chunks = sorted({1, *rng.integers(2, 20_000, size=data.draw(st.integers(2, 12))).tolist()})
    histories = sorted({0, *rng.integers(1, 200_000, size=data.draw(st.integers(0, 5))).tolist()})
    grid = np.cumsum(np.cumsum(rng.uniform(0.0, 5.0, (len(histories), len(chunks))), axis=1), axis=0) + 0.5
    model = LatencyModel(tuple(chunks), tuple(histories), tuple(map(tuple, grid.tolist())), float(grid[0, 0]) / 2)
    for _ in range(20):
        chunk = float(rng.uniform(0.0, 30_000))
        history = float(rng.uniform(0.0, 300_000))
        time_ms = float(rng.uniform(0.0, 2.0 * grid.max()))
        assert model.time_ms(chunk, history) == pytest.approx(float(model.time_ms_many(chunk, history)), rel=1e-12)
        assert model.chunk_for_time(history, time_ms) == pytest.approx(
            float(model.chunk_for_time_many(history, time_ms)), rel=1e-9, abs=1e-9
        )


def test_vectorised_answers_broadcast_as_the_planner_calls_them():
    # The planner passes histories of shape (1, prefills, nodes) with chunks or times of shape
    # (targets, 1, 1) or (targets, prefills, nodes): each element must be the scalar answer.
    model = measured_model(CPU_LIKE, noise=0.1, seed=5)
    rng = np.random.default_rng(11)
    histories = rng.uniform(0.0, 150_000.0, (1, 3, 5))
    times = rng.uniform(0.0, 3.0 * model.time_ms(8192, 0), (4, 1, 1))
    chunks = rng.uniform(0.0, 12_000.0, (4, 3, 5))
    found = model.chunk_for_time_many(histories, times)
    timed = model.time_ms_many(chunks, histories)
    assert found.shape == timed.shape == (4, 3, 5)
    for t, p, n in np.ndindex(4, 3, 5):
        history = float(histories[0, p, n])
        assert found[t, p, n] == pytest.approx(model.chunk_for_time(history, float(times[t, 0, 0])), rel=1e-9, abs=1e-9)
        assert timed[t, p, n] == pytest.approx(model.time_ms(float(chunks[t, p, n]), history), rel=1e-12)


@PROPERTIES
@given(st.floats(1.0, 8192.0), st.floats(0.0, 100_000.0))
def test_the_chunk_for_a_time_inverts_the_time_of_a_chunk(chunk, history):
    model = measured_model(TRUE, noise=0.0)
    assert model.chunk_for_time(history, model.time_ms(chunk, history)) == pytest.approx(chunk, rel=1e-6)


def test_the_chunk_for_a_time_is_zero_when_not_even_one_token_fits():
    model = measured_model(TRUE, noise=0.0)
    assert model.chunk_for_time(60_000, 0.5 * model.time_ms(1, 60_000)) < 1.0


def test_times_never_fall_with_chunk_or_history_even_from_noisy_medians():
    model = measured_model(CPU_LIKE, noise=0.2, seed=3)
    grid = np.array(model.step_ms)
    assert np.all(np.diff(grid, axis=1) >= 0) and np.all(np.diff(grid, axis=0) >= 0)
    chunks = np.geomspace(1, 8192, 200)
    for history in (0, 7_000, 40_000, 200_000):
        assert np.all(np.diff(model.time_ms_many(chunks, history)) >= -1e-9)


def test_one_wild_point_moves_the_model_only_near_it():
    samples = start_up_samples(TRUE, noise=0.0)
    wild = [(c, h, t * (5.0 if (c, h) == (512, 0) else 1.0)) for c, h, t in samples]
    clean, spoiled = model_of(samples), model_of(wild)
    assert spoiled.time_ms(512, 0) > 1.5 * clean.time_ms(512, 0)
    for chunk, history in [(64, 0), (4096, 0), (512, 32_768), (2048, 65_536)]:
        assert spoiled.time_ms(chunk, history) == pytest.approx(clean.time_ms(chunk, history), rel=0.02)


def test_isotonic_pooling_averages_a_fall_and_keeps_order():
    rows = monotone_grid([[1.0, 3.0, 2.0, 4.0], [2.0, 2.5, 5.0, 6.0]], [[1.0] * 4, [1.0] * 4])
    assert rows[0] == [1.0, 2.5, 2.5, 4.0]
    assert all(b >= a for row in rows for a, b in zip(row, row[1:], strict=False)) and all(
        b >= a for a, b in zip(rows[0], rows[1], strict=True)
    )


def test_beyond_the_deepest_history_the_last_slope_continues_and_never_falls():
    model = grid_model(TRUE)
    for chunk in (1, 256, 2048):
        step = model.time_ms(chunk, 32_768) - model.time_ms(chunk, 8192)
        assert model.time_ms(chunk, 57_344) == pytest.approx(model.time_ms(chunk, 32_768) + step, rel=1e-9)


def test_a_batch_pays_the_fixed_cost_once():
    model = measured_model(TRUE, noise=0.0)
    one = model.time_ms(1024, 8192)
    assert model.batch_time_ms([(1024, 8192)]) == pytest.approx(one)
    assert model.batch_time_ms([(1024, 8192), (1, 30_000)]) == pytest.approx(one + model.request_ms(1, 30_000))
    assert model.batch_time_ms([]) == model.fixed_ms
    assert model.fixed_ms == pytest.approx(TRUE.time_ms(0, 0), rel=0.01)  # the profile measures C = 1
    assert model.decode_ms(30_000) == pytest.approx(TRUE.time_ms(1, 30_000) - TRUE.time_ms(1, 0), rel=0.02)


@pytest.mark.parametrize(
    "points, message",
    [
        ([Point(c, h, 1.0 + c + h, 1) for c in (1, 64, 512) for h in (0, 4096) if (c, h) != (64, 4096)], "not a grid"),
        ([Point(c, 0, 1.0 + c, 1) for c in (1, 64)], "chunk sizes profiled"),
        ([Point(c, 4096, 1.0 + c, 1) for c in (1, 64, 512)], "without history"),
    ],
)
def test_what_cannot_make_a_model_is_a_fit_error_naming_why(points, message):
    with pytest.raises(FitError, match=message):
        LatencyModel.from_points(points)


def deepest_grid(time_ms):
    """A profile whose deepest level lies past the base chunk's deepest history: 1536 and 2048 do not fit."""
    chunks, histories = (1, 64, 256, 512, 1024, 1536, 2048), (0, 8192, 16384, 28672)
    return [Point(c, h, time_ms(c, h), 1) for h in histories for c in chunks if not (h == 28672 and c > 1024)]


@pytest.mark.parametrize("bend", [0.0, 1.0, 3.0])
def test_the_sizes_too_large_for_the_deepest_level_take_what_it_adds_to_the_sizes_measured_there(bend):
    """History adds a cost per step (the cache read) and one per token of the chunk (attention to it), so
    what the deepest interval adds is a line in the chunk size, fitted to the sizes measured there. (Each
    size's own line continued would miss how time bends deep down: 27% low at 2048 tokens at ``bend`` 3.)"""

    def truth(c, h):
        return 2.0 + 0.3 * h / 8192 + c * (1.0 + h / 8192 + bend * (h / 8192) ** 2) / 100 + (c / 1000) ** 2

    model = LatencyModel.from_points(deepest_grid(truth))
    for chunk in (1536, 2048):
        assert model.time_ms(chunk, 28672) == pytest.approx(truth(chunk, 28672), rel=1e-9)
        assert model.time_ms(chunk, 20480) == pytest.approx(
            (truth(chunk, 16384) * 8192 + truth(chunk, 28672) * 4096) / 12288, rel=1e-9
        )


def test_a_filled_size_carries_the_noise_of_a_few_measured_points_not_a_quotient_of_it():
    """3% noise a run, two runs a point, a 128k context: the base chunk at its deepest history (read from the
    filled level) is as close to the truth as noise allows on a surface whose time hardly grows with history
    (a ratio of two growths within the noise was off by 20% and more) and on one where it grows."""
    flat, steep = Quadratic(30.0, 0.01, 1e-5, 5e-7, 5e-9), TRUE
    for truth in (flat, steep):
        for seed in range(20):
            model = measured_model(truth, noise=0.03, seed=seed, max_history_tokens=122_880)
            assert model.history_tokens[-1] == 122_880 + 4096
            assert model.time_ms(8192, 122_880) == pytest.approx(truth.time_ms(8192, 122_880), rel=0.1), seed


@pytest.mark.parametrize(
    "skip",
    [lambda c, h: h == 28672 and c == 512, lambda c, h: h == 16384 and c == 2048],
    ids=["a size up to half the largest at the deepest level", "a large size at a shallower level"],
)
def test_any_other_hole_in_the_grid_is_still_no_grid(skip):
    points = [p for p in deepest_grid(TRUE.time_ms) if not skip(p.chunk_tokens, p.history_tokens)]
    with pytest.raises(FitError, match="not a grid"):
        LatencyModel.from_points(points)


def test_the_model_is_a_value_that_round_trips_through_a_dict():
    model = measured_model(TRUE)
    assert LatencyModel.from_dict(model.to_dict()) == model
    with pytest.raises(FitError):
        LatencyModel.from_dict({"chunk_tokens": [1, 2], "history_tokens": [0], "step_ms": [[2.0, 1.0]], "fixed_ms": 1})


def test_model_acceptance_and_planner_run_without_vllm_torch_or_torch_npu():
    """The twin simulator and the bench load the CPP maths alone: numpy only."""
    from vllm_ascend.core import cpp_latency_model

    package = str(Path(cpp_latency_model.__file__).resolve().parents[1])  # the assembled tree's, or the overlay
    script = (
        "import sys\n"
        "for name in ('vllm', 'torch', 'torch_npu'):\n"
        "    sys.modules[name] = None  # any import of them fails\n"
        "import types\n"
        f"package = types.ModuleType('vllm_ascend'); package.__path__ = [{package!r}]\n"
        "sys.modules['vllm_ascend'] = package\n"
        "from vllm_ascend.core.cpp_acceptance import judge\n"
        "from vllm_ascend.core.cpp_chunk_rule import ChunkLimits\n"
        "from vllm_ascend.core.cpp_profiling import profile_plan\n"
        "plan = profile_plan(base_chunk_tokens=4096, points=24, repeats=2, history_points=4,\n"
        "                    max_history_tokens=32768)\n"
        "samples = [(c, h, 1 + 0.01 * c + 1e-4 * h + 1e-5 * c * c + 1e-7 * c * h) for c, h in plan]\n"
        "verdict = judge(samples, ChunkLimits(4096, 40000), 4, max_history_tokens=32768, last_round=True)\n"
        "print(round(verdict.model.time_ms(4096, 0), 3))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert float(result.stdout) == pytest.approx(1 + 0.01 * 4096 + 1e-5 * 4096**2, rel=1e-6)


def test_timed_profiles_carry_the_noise_asked_for():
    samples = timed(TRUE, [(1024, 0)] * 400, noise=0.1, seed=2)
    ratios = np.array([t for *_, t in samples]) / TRUE.time_ms(1024, 0)
    assert np.std(np.log(ratios)) == pytest.approx(0.1, rel=0.15)


def test_the_decodes_fast_path_is_the_same_numbers_as_the_general_one():
    model = measured_model(TRUE, noise=0.02)
    histories = np.concatenate([np.linspace(0, 200_000, 400), [0.0, 65_536.0, 1e6]])
    assert model.decode_ms_many(histories) == pytest.approx([model.decode_ms(h) for h in histories], rel=1e-12)


# ---------------------------------------------------------------- odd points: a fall that repeated is kept
ODD_GRID = (1, 32, 64, 128, 256, 512, 768, 1024, 2048), (0, 8192, 16384)


def odd_model(factor=0.6, chunk=768, history=8192):
    """TRUE measured on a grid, with one point ``factor`` of the truth there, kept as an odd point."""
    chunks, histories = ODD_GRID
    points = [
        Point(c, h, TRUE.time_ms(c, h) * (factor if (c, h) == (chunk, history) else 1.0), 2)
        for h in histories
        for c in chunks
    ]
    return LatencyModel.from_points(points, odd=[(chunk, history)])


def test_an_odd_point_keeps_its_measured_time_and_the_rest_stay_as_measured():
    model = odd_model()
    assert model.odd_points == ((768, 8192),)
    assert model.time_ms(768, 8192) == pytest.approx(0.6 * TRUE.time_ms(768, 8192), rel=1e-9)
    assert model.time_ms(768, 8192) < model.time_ms(512, 8192)  # the fall stands
    for c in (512, 1024):  # its neighbours are not pooled with it
        assert model.time_ms(c, 8192) == pytest.approx(TRUE.time_ms(c, 8192), rel=1e-6)
    # Without the odd point the same medians are averaged as noise: monotone, and the fall gone.
    chunks, histories = ODD_GRID
    points = [Point(c, h, model.step_ms[histories.index(h)][chunks.index(c)], 2) for h in histories for c in chunks]
    plain = LatencyModel.from_points(points)
    assert plain.odd_points == () and plain.time_ms(768, 8192) >= plain.time_ms(512, 8192)


def test_a_size_beside_an_odd_point_costs_the_dearer_end():
    """Nothing measured says a fast size's speed reaches past it: 600 or 900 tokens cost what 512 or 1024
    cost, not a share of 768's dip."""
    model = odd_model()
    assert model.time_ms(600, 8192) == pytest.approx(model.time_ms(512, 8192), rel=1e-12)
    assert model.time_ms(900, 8192) == pytest.approx(model.time_ms(1024, 8192), rel=1e-12)
    assert float(model.time_ms_many(np.array([600.0, 768.0, 900.0]), 8192.0)[1]) == model.time_ms(768, 8192)


def test_the_chunk_for_a_time_takes_the_faster_larger_size():
    """A 768-token chunk that takes less than a 512-token one dominates every size up to it: with a time
    768 fits and 512 does not, the chunk is 768, not some size below 512."""
    model = odd_model()
    fast, slow = model.time_ms(768, 8192), model.time_ms(512, 8192)
    time_ms = (fast + slow) / 2
    assert model.chunk_for_time(8192, time_ms) == 768
    assert float(model.chunk_for_time_many(np.array(8192.0), np.array(time_ms))) == 768
    # At most 700 tokens: the largest size up to it that fits, never 700 itself, which costs 512's time.
    below = model.chunk_for_time(8192, time_ms, up_to=700)
    assert below < 512 and model.time_ms(below, 8192) == pytest.approx(time_ms, rel=1e-9)
    assert float(model.chunk_for_time_many(np.array(8192.0), np.array(time_ms), np.array(700.0))) == pytest.approx(
        below
    )
    assert model.chunk_for_time(8192, 2 * slow, up_to=700) == 700


def test_an_odd_point_at_the_deepest_history_fades_beyond_it():
    """Past the deepest level measured, a fast point is not continued: the size returns to the trend."""
    model = odd_model(chunk=768, history=16384)
    beyond = model.time_ms(768, 24576)
    assert beyond >= model.time_ms(512, 24576) * (1 - 1e-6) and beyond >= model.time_ms(768, 16384)


@PROPERTIES
@given(st.data())
def test_scalar_and_vectorised_answers_are_the_same_numbers_with_odd_points(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
    chunks, histories = ODD_GRID
    odd = sorted(
        {(int(rng.choice(chunks[1:])), int(rng.choice(histories))) for _ in range(data.draw(st.integers(1, 3)))}
    )
    points = [
        Point(c, h, TRUE.time_ms(c, h) * (float(rng.uniform(0.3, 1.8)) if (c, h) in odd else 1.0), 2)
        for h in histories
        for c in chunks
    ]
    model = LatencyModel.from_points(points, odd=odd)
    for _ in range(20):
        chunk, history = float(rng.uniform(0.0, 3000)), float(rng.uniform(0.0, 30_000))
        time_ms, up_to = float(rng.uniform(0.0, 60.0)), float(rng.uniform(1.0, 3000))
        assert model.time_ms(chunk, history) == pytest.approx(float(model.time_ms_many(chunk, history)), rel=1e-12)
        assert model.chunk_for_time(history, time_ms, up_to) == pytest.approx(
            float(model.chunk_for_time_many(history, time_ms, up_to)), rel=1e-9, abs=1e-9
        )
        found = model.chunk_for_time(history, time_ms, up_to)
        assert found <= up_to and (found == 0 or model.time_ms(found, history) <= time_ms * (1 + 1e-9))


def test_odd_points_round_trip_and_a_fall_elsewhere_is_still_refused():
    model = odd_model()
    assert LatencyModel.from_dict(model.to_dict()) == model
    rows = [list(row) for row in model.step_ms]
    rows[0][2], rows[0][3] = rows[0][3], rows[0][2]  # a fall between two points neither of which is odd
    with pytest.raises(FitError, match="must not fall"):
        LatencyModel(model.chunk_tokens, model.history_tokens, tuple(map(tuple, rows)), model.fixed_ms,
                     odd_points=model.odd_points)  # fmt: skip
