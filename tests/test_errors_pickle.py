"""User errors cross process boundaries whole: a map task's error raised in a pool worker (or a Ray
task) is pickled to the parent, which prints its message and hint and exits with its code."""

from __future__ import annotations

import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest

from robowds.export.core.plausible import DiskSpaceError
from robowds.export.errors import EpisodeError, UserError


def _raise(error: Exception) -> None:
    raise error


ERRORS = [
    UserError("store 's' has no tables", hint="run robowds validate", exit_code=3),
    UserError("plain message"),
    EpisodeError("ep_7", "joints", "time runs backwards at row 12", hint="repair or drop the episode"),
    EpisodeError("ep_8", None, "no streams"),
    DiskSpaceError("out of space: 3 GB needed", hint="free space", exit_code=4),
]


def _same(a: UserError, b: UserError) -> None:
    assert type(a) is type(b)
    assert (str(a), a.message, a.hint, a.exit_code) == (str(b), b.message, b.hint, b.exit_code)
    if isinstance(a, EpisodeError):
        assert (a.episode_id, a.field, a.reason) == (b.episode_id, b.field, b.reason)


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_pickle_round_trip_keeps_every_attribute(error: UserError) -> None:
    _same(pickle.loads(pickle.dumps(error)), error)


def test_episode_error_raised_in_a_worker_process_arrives_whole() -> None:
    error = ERRORS[2]
    with ProcessPoolExecutor(1) as pool:
        with pytest.raises(EpisodeError) as caught:
            pool.submit(_raise, error).result()
    _same(caught.value, error)
    assert str(caught.value) == ("episode 'ep_7', field 'joints': time runs backwards at row 12\n"
                                 "  fix: repair or drop the episode")
