"""User-facing errors: one clear message (what, where, how to fix) and a non-zero exit."""

from __future__ import annotations


class UserError(Exception):
    """An error caused by the input or the command line, printed without a traceback."""

    def __init__(self, message: str, hint: str | None = None, exit_code: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  fix: {self.hint}"

    def __reduce__(self) -> tuple:
        # Exceptions pickle as `cls(*self.args)`, which would drop the hint and exit code: a task's
        # error raised in a worker process (process pool, Ray) must arrive in the parent whole
        return (type(self), (self.message, self.hint, self.exit_code))


class EpisodeError(UserError):
    """One episode that cannot be exported; names the episode and field."""

    def __init__(self, episode_id: str, field: str | None, message: str, hint: str | None = None) -> None:
        where = f"episode {episode_id!r}" + (f", field {field!r}" if field else "")
        super().__init__(f"{where}: {message}", hint=hint)
        self.episode_id = episode_id
        self.field = field
        self.reason = message

    def __reduce__(self) -> tuple:
        # `args` holds the composed message, not the constructor's four arguments
        return (type(self), (self.episode_id, self.field, self.reason, self.hint))
