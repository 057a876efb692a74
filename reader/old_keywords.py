"""Keywords a constructor no longer takes, refused with their new form.

Python's own "unexpected keyword argument" says what is wrong but not what to write instead; a
training script written for an earlier robowds should learn the new spelling from the error. The
check wraps `__init__` (`functools.wraps`), so `inspect.signature` and editors still show only the
parameters the constructor takes: no `**kwargs` catch-all in the public signature.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, TypeVar

Init = TypeVar("Init", bound=Callable[..., None])

BATCHING = ("pass {name} to ShardLoader(dataset, {name}=...), which sets it; with a plain DataLoader or "
            "StatefulDataLoader call dataset.set_batching({name}=...)")
REMOTE = "pass remote=Remote({name}=...)"


def refuse_old_keywords(owner: str, new_forms: Mapping[str, str]) -> Callable[[Init], Init]:
    """Decorate `owner.__init__`: a keyword in `new_forms` (old name -> how to write it now, with
    `{name}` for the keyword) raises one TypeError naming each old keyword given and its new form."""

    def decorate(init: Init) -> Init:
        @functools.wraps(init)
        def checked(self: Any, *args: Any, **kwargs: Any) -> None:
            old = [k for k in new_forms if k in kwargs]
            if old:
                raise TypeError("; ".join(f"{owner}() got the old keyword {k!r}: {new_forms[k].format(name=k)}"
                                          for k in old))
            init(self, *args, **kwargs)

        return checked  # type: ignore[return-value]

    return decorate
