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


def config_error(key: str, value: object, expected: str, example: str, origin: str = "",
                 note: str = "") -> UserError:
    """The one shape of a bad export-config value, so no check of the config can leave out its fix.

    The error line names the dotted `key`, the bad `value` and where it was set (`origin`: `--set
    fps=-10`, or the config file's path; empty for a value the caller built); the fix line says what
    the key takes (`expected`, which completes "must be ...", and an optional `note` on what the value
    means) and how to write a valid `example` value where the bad one came from: a `--set` item, or
    the YAML line for the config file.
    """
    source = f" (from {origin})" if origin else ""
    meaning = f" ({note})" if note else ""
    return UserError(f"config {key} must be {expected}, got {value!r}{source}",
                     hint=f"give {key} {expected}{meaning}, e.g. {config_example(key, example, origin)}")


def config_example(key: str, example: str, origin: str = "") -> str:
    """`example` as the user would write it for `key`: `--set KEY=VALUE` (shell-quoted when the value
    has spaces or brackets), or `a: {b: VALUE}` in the config file when that is where the value was."""
    if origin and not origin.startswith("--"):  # a config file (else a --set item or a flag)
        parts = key.split(".")
        nested = example
        for part in reversed(parts[1:]):
            nested = f"{{{part}: {nested}}}"
        return f"`{parts[0]}: {nested}` in {origin}"
    item = f"{key}={example}"
    return f"--set {item}" if all(c.isalnum() or c in "._=-+" for c in item) else f"--set '{item}'"
