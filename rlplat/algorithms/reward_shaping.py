"""Reward shaping that depends only on the response, not on its correctness."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OverlongShaping:
    """DAPO soft overlong punishment (2503.14476, eq. 13), added to the score.

    For a response of L tokens, L_max = ``max_response_length``, L_c = ``buffer_length``:
    0 if L <= L_max − L_c; (L_max − L_c − L) / L_c · ``penalty_factor`` if L_max − L_c < L <= L_max;
    −``penalty_factor`` if L > L_max. The paper's penalty is −1 at L_max; ``penalty_factor`` scales it, as
    verl's DAPO recipe does. Config: ``algorithm.overlong_buffer.{enable,length,penalty_factor}`` with
    L_max = ``data.max_response_length``.
    """

    max_response_length: int
    buffer_length: int
    penalty_factor: float = 1.0

    def __post_init__(self):
        if not 0 < self.buffer_length <= self.max_response_length:
            raise ValueError(
                f"overlong buffer_length (algorithm.overlong_buffer.length) must be in (0, max_response_length="
                f"{self.max_response_length}], got {self.buffer_length}"
            )
        if self.penalty_factor < 0:
            raise ValueError(f"overlong penalty_factor (algorithm.overlong_buffer.penalty_factor) must be >= 0, "
                             f"got {self.penalty_factor}")

    def __call__(self, length: int) -> float:
        start = self.max_response_length - self.buffer_length
        if length <= start:
            return 0.0
        if length <= self.max_response_length:
            return (start - length) / self.buffer_length * self.penalty_factor
        return -self.penalty_factor
