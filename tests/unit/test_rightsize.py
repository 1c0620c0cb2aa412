"""The right-size hint: a smaller profile named only on the user's own evidence, never a guess."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from spawner.core.model import Profile
from spawner.core.rightsize import SessionUse, percentile, right_size_hint

MIB_PER_GPU = 81920  # 80 GiB
FULL = Profile(slug="h100", display_name="1 × H100", gpu_milli=1000, gpu_model="H100-80GB")
HALF = Profile(slug="h100-half", display_name="0.5 × H100", gpu_milli=500, gpu_model="H100-80GB")
QUARTER = Profile(slug="h100-quarter", display_name="0.25 × H100", gpu_milli=250, gpu_model="H100-80GB")
T4 = Profile(slug="t4", display_name="1 × T4", gpu_milli=250, gpu_model="T4")
CANDIDATES = [FULL, HALF, QUARTER, T4]


def memory(profile: Profile, milli: int) -> int:
    return MIB_PER_GPU * milli // 1000


def sessions(n: int, peak: float | None, util: float, profile: str = "h100") -> list[SessionUse]:
    return [SessionUse(profile, 1000, float(i), peak, (util, util / 2)) for i in range(n)]


def test_ten_small_sessions_name_the_smallest_profile_that_would_have_done():
    hint = right_size_hint(FULL, CANDIDATES, sessions(12, 11 * 1024, 18), memory)
    assert hint is not None and hint.smaller is QUARTER and hint.sessions == 10
    assert hint.line == (
        "Last 10 sessions of 1 × H100: peak 11 GiB of 80 GiB GPU memory, utilisation p95 18 %: "
        "0.25 × H100 would have done"
    )


def test_memory_or_utilisation_too_high_for_a_quarter_names_the_half():
    hint = right_size_hint(FULL, CANDIDATES, sessions(5, 25 * 1024, 18), memory)
    assert hint is not None and hint.smaller is HALF
    hint = right_size_hint(FULL, CANDIDATES, sessions(5, 5 * 1024, 35), memory)
    assert hint is not None and hint.smaller is HALF


def test_no_hint_without_evidence():
    # too few sessions, no memory reported, no utilisation samples, peaks near the whole GPU
    assert right_size_hint(FULL, CANDIDATES, sessions(2, 1024, 5), memory) is None
    assert right_size_hint(FULL, CANDIDATES, sessions(10, None, 5), memory) is None
    no_util = [SessionUse("h100", 1000, float(i), 1024.0, ()) for i in range(5)]
    assert right_size_hint(FULL, CANDIDATES, no_util, memory) is None
    assert right_size_hint(FULL, CANDIDATES, sessions(10, 70 * 1024, 5), memory) is None
    # other profiles' sessions are not evidence for this one; the smallest has nothing smaller
    assert right_size_hint(FULL, CANDIDATES, sessions(10, 1024, 5, profile="h100-half"), memory) is None
    assert right_size_hint(QUARTER, CANDIDATES, sessions(10, 1024, 5, profile="h100-quarter"), memory) is None


def test_percentile_nearest_rank():
    assert percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 95) == 10
    assert percentile(list(range(1, 101)), 95) == 95
    assert percentile([7], 95) == 7


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.builds(
            SessionUse,
            st.just("h100"),
            st.just(1000),
            st.floats(0, 1e6),
            st.one_of(st.none(), st.floats(0, 81920)),
            st.lists(st.floats(0, 100), max_size=20).map(tuple),
        ),
        max_size=15,
    )
)
def test_a_hint_always_fits_the_evidence_it_names(history):
    hint = right_size_hint(FULL, CANDIDATES, history, memory)
    if hint is None:
        return
    smaller_memory = memory(hint.smaller, hint.smaller.gpu_milli)
    assert hint.smaller.gpu_milli < FULL.gpu_milli and hint.smaller.gpu_model == FULL.gpu_model
    assert smaller_memory >= hint.peak_memory_mib * 1.2
    assert hint.smaller.gpu_milli >= hint.util_p95 * 10 * 1.2
    assert 3 <= hint.sessions <= 10
