"""The reward package's exceptions: a config that cannot score (:class:`RewardConfigError`, a start-up error with
exit status 2), a value a reward function returned that is no score (:class:`BadRewardValue`, one sample's), and
a batch stopped because its calls fail (:class:`RewardsFailing`)."""

from __future__ import annotations


class RewardConfigError(ValueError):
    """The reward config cannot be used: a custom function that does not load, bad weights, ..."""


class UnknownDataSourceError(RewardConfigError):
    """``auto`` has no scorer for a data_source: a configuration problem, not a sample's."""


class BadRewardValue(ValueError):
    """A reward function returned something that is not a usable score."""


class RewardsFailing(RuntimeError):
    """A batch's reward calls were stopped early: ``errors`` of the calls made so far failed, enough to stop
    the step (the message says why); ``first_error`` is the first one's first line."""

    def __init__(self, message: str, errors: int, first_error: str):
        super().__init__(message)
        self.errors, self.first_error = errors, first_error
